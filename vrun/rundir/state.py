"""A run dir read back: what it planned, where it was submitted, and its state.

The state comes from the run's own progress lines (vrun/rundir/records.py); `squeue` adds why a job is pending and
notices a job that left the queue without a word; `sacct` adds what it knows where accounting works. Standard
library only, and one `squeue` call for any number of runs: `python -m vrun runs` stays fast on a large sweep.
"""
from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vrun.rundir import records as rundir
from vrun.rundir.files import RunDirError
from vrun.rundir.record import PlanRecord
from vrun.core import fs

# the order of the phases within one attempt (a submitter and a node may write in either order)
RANK = {"submitted": 0, "requeued": 0, "started": 1, "nodes_joined": 2, "ray_up": 3, "entrypoint_started": 4,
        "exited": 5, "failed": 5, "cancelled": 6}


@dataclass
class Run:
    dir: Path
    plan: PlanRecord
    slurm: Optional[dict]
    events: list
    state: str = "planned"
    phase: str = ""
    attempt: int = 0
    job_id: Optional[str] = None
    job_ids: list = field(default_factory=list)
    hosts: list = field(default_factory=list)
    failure: Optional[dict] = None
    reason: str = ""
    elapsed_s: float = 0.0
    when: float = 0.0
    pid: Optional[int] = None
    host: Optional[str] = None

    @property
    def gpus(self) -> int:
        return self.plan.mesh.world

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.elapsed_s / 3600.0

    @property
    def on_slurm(self) -> bool:
        return self.slurm is not None

    @property
    def active(self) -> bool:
        return self.state in ("pending", "running", "requeued")

    def checkpoint_step(self) -> Optional[int]:
        """The last checkpoint step verl left under <run dir>/checkpoints (trainer.default_local_dir)."""
        d = self.dir / "checkpoints"
        try:
            return int((d / "latest_checkpointed_iteration.txt").read_text().strip())
        except (OSError, ValueError):
            pass
        try:
            steps = [int(p.name.rpartition("_")[2]) for p in d.iterdir() if p.name.startswith("global_step_")]
        except (OSError, ValueError):
            return None
        return max(steps) if steps else None

    def summary(self) -> dict:
        p = self.plan
        return {"run_dir": str(self.dir), "model": p.model.name, "algo": p.algo,
                "gpus": self.gpus, "mode": p.mode, "cluster": p.cluster, "state": self.state,
                "phase": self.phase, "reason": self.reason, "job_id": self.job_id, "job_ids": self.job_ids,
                "attempt": self.attempt, "elapsed_s": round(self.elapsed_s, 1),
                "gpu_hours": round(self.gpu_hours, 3), "checkpoint_step": self.checkpoint_step(),
                "failure": self.failure, "hosts": self.hosts, "when": self.when}


def points(path: str) -> list[Path]:
    """A run dir, or the run dirs of a sweep dir (its points, in order). Bad input raises RunDirError."""
    d = Path(os.path.expanduser(path))  # pathlib's expanduser raises on ~nosuchuser
    if not fs.exists(d):
        raise RunDirError("run", path, "no such directory", "give a run dir or sweep dir the runner wrote "
                          "(python -m vrun runs lists them)")
    if not fs.is_dir(d):
        raise RunDirError("run", path, "not a directory", "give the run dir (the one holding plan.json)")
    if fs.is_file(d / "plan.json"):
        return [d.absolute()]
    found = [p for p in d.iterdir() if fs.is_file(p / "plan.json")]
    if not found:
        raise RunDirError("run", path, "not a run dir (no plan.json) and no run dirs inside",
                          "give a dir the runner wrote (python -m vrun runs lists them)")

    def order(p: Path):
        head = p.name.split("_", 1)[0]
        return (0, int(head), p.name) if head.isdigit() else (1, 0, p.name)

    return [p.absolute() for p in sorted(found, key=order)]


def load(d: Path, indexed_at: Optional[float] = None) -> Run:
    """Read one run dir (files only: no SLURM query). A plan.json of another format raises RunDirError."""
    from vrun.rundir import files

    if not fs.exists(d / "plan.json"):
        raise RunDirError("run", d, "not a run dir (no plan.json)", "give a dir the runner wrote")
    plan = PlanRecord.load(d, written_by=lambda: _manifest_commit(d))
    slurm = files.slurm_job(d)
    run = Run(dir=d, plan=plan, slurm=slurm, events=rundir.events(str(d)))
    derive(run)
    if not run.when:
        run.when = indexed_at or _mtime(d / "plan.json")
    return run


def derive(run: Run) -> None:
    """State, phase, attempt, failure and elapsed time from the progress lines alone."""
    evs = run.events
    if not evs:
        if run.on_slurm:  # submitted before runs recorded their progress
            run.job_id = str(run.slurm.get("job_id"))
            run.job_ids, run.state = [run.job_id], "pending"
        return
    for e in evs:
        j = e.get("job_id")
        if j and str(j) not in run.job_ids:
            run.job_ids.append(str(j))
    run.when = max(e["t"] for e in evs if e["event"] in ("submitted", "started")) if any(
        e["event"] in ("submitted", "started") for e in evs) else 0.0
    # elapsed over every attempt: from its start to its last word (or now while it runs)
    by_attempt: dict = {}
    for e in evs:
        by_attempt.setdefault(int(e.get("attempt") or 0), []).append(e)
    run.attempt = max(by_attempt)
    cur = sorted(by_attempt[run.attempt], key=lambda e: (RANK.get(e["event"], 9), e["t"]))
    run.job_id = next((str(e["job_id"]) for e in reversed(cur) if e.get("job_id")), None) or (
        str(run.slurm["job_id"]) if run.slurm else None)
    state, phase = "pending", "submitted"
    mode = run.plan.mode
    for e in cur:
        ev = e["event"]
        if ev == "requeued":
            state, phase = "requeued", f"requeued (attempt {e.get('attempt')})"
        elif ev == "submitted":
            state, phase = "pending", "submitted"
        elif ev == "started":
            run.hosts = [h for h in (e.get("hosts") or [e.get("host")]) if isinstance(h, str)]
            run.pid, run.host = e.get("pid"), e.get("host")
            state, phase = "running", f"started on {','.join(run.hosts)}"
        elif ev == "nodes_joined":
            state, phase = "running", f"nodes joined {e.get('joined')}/{e.get('of')}"
        elif ev == "ray_up":
            state, phase = "running", f"Ray up ({e.get('nodes')} nodes, {e.get('seconds')} s)"
        elif ev == "entrypoint_started":
            if run.pid is None and e.get("pid"):
                run.pid, run.host = e.get("pid"), e.get("host")
            state, phase = "running", ("training started" if mode == "train" else f"{mode} started")
        elif ev == "exited" and state not in ("failed", "cancelled"):
            if e.get("rc") == 0:
                if e.get("node", 0) == 0:
                    state, phase = "completed", "exited 0"
            else:
                state, phase = "failed", f"exited {e.get('rc')} on {node_name(run, e)}"
                run.failure = {"node": node_name(run, e), "error": f"exit code {e.get('rc')}", "t": e["t"]}
        elif ev == "failed" and state != "cancelled":
            if state != "failed" or (run.failure or {}).get("error", "").startswith("exit code"):
                run.failure = {"node": node_name(run, e), "error": e.get("error"), "t": e["t"]}
            state, phase = "failed", f"failed on {run.failure['node']}: {run.failure['error']}"
        elif ev == "cancelled":
            state, phase = "cancelled", f"cancelled from {e.get('host')}"
    run.state, run.phase = state, phase
    now = time.time()
    total = 0.0
    for a, es in by_attempt.items():
        starts = [e["t"] for e in es if e["event"] == "started"]
        if not starts:
            continue
        ends = [e["t"] for e in es if e["event"] in ("exited", "failed", "cancelled")]
        if ends:
            total += max(ends) - min(starts)
        elif a == run.attempt and state == "running":
            total += now - min(starts)
    run.elapsed_s = max(total, 0.0)


def refresh(runs: list) -> None:
    """Ask SLURM (one squeue for all runs) about runs whose progress says they are still pending or running;
    sacct where squeue no longer knows a job. Local runs: whether their process is still alive."""
    live = [r for r in runs if r.active]
    slurm_runs = [r for r in live if r.on_slurm and r.job_id]
    if slurm_runs:
        queue = squeue()
        gone = []
        for r in slurm_runs:
            q = queue.get(r.job_id) if queue is not None else None
            if queue is None:
                r.reason = "squeue unavailable"
            elif q is None:
                gone.append(r)
            elif q["state"] == "PENDING":
                r.reason = q["reason"] if q["reason"] not in ("None", "(null)") else ""
                if r.state == "running":  # requeued by SLURM before the job could say so
                    r.state, r.phase = "requeued", "requeued"
                else:
                    r.phase = f"pending ({q['reason']})"
            elif r.state == "pending":
                r.state, r.phase = "running", f"starting on {q['nodes']}"
        if gone:
            acct = sacct([r.job_id for r in gone])
            for r in gone:
                a = acct.get(r.job_id)
                if a and a["state"].startswith("COMPLETED"):
                    r.state, r.phase = "completed", "exited 0 (sacct)"
                elif a and a["state"].startswith("CANCELLED"):
                    r.state, r.phase = "cancelled", f"cancelled outside vrun (sacct: {a['state'].lower()})"
                elif a:
                    r.state, r.phase = "failed", f"{a['state'].lower()} (sacct: exit {a['exit']} on {a['nodes']})"
                else:
                    r.state, r.phase = "lost", lost_why(r)
    for r in live:
        if not r.on_slurm and r.pid and r.host == socket.gethostname() and not alive(r.pid):
            r.state, r.phase = "lost", f"process {r.pid} ended without recording an exit"


def lost_why(r: Run) -> str:
    """A job gone from the queue with no recorded end and no accounting: what its log says, or that it wrote none
    (SLURM could not open its output: a path the nodes do not see)."""
    from vrun.rundir.cause import from_files

    out = Path(str((r.slurm or {}).get("stdout") or ""))
    head = f"job {r.job_id} left the queue without recording an exit"
    if r.slurm and r.slurm.get("stdout") and not fs.exists(out) and r.state == "pending":
        return (f"{head} and without writing its log {out}: the nodes likely cannot see {out.parent} (node-local "
                "storage such as /tmp?); put the run dir on storage every node shares")
    cause = from_files([out.with_name(out.name.replace("log.out", "log.err")), out]) if r.slurm else None
    return f"{head}: {cause}" if cause else f"{head} (killed, node lost, or cancelled outside vrun)"


def squeue() -> Optional[dict]:
    """This user's jobs: id → state, reason, nodes. None when squeue cannot be run."""
    try:
        p = subprocess.run(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%T|%r|%N"], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode:
        return None
    out = {}
    for line in p.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            out[parts[0]] = {"state": parts[1], "reason": parts[2], "nodes": parts[3]}
    return out


def sacct(job_ids: list) -> dict:
    """What accounting knows about finished jobs; {} where it does not work (many clusters, the CI harness)."""
    try:
        p = subprocess.run(["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobID,State,ExitCode,NodeList"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if p.returncode:
        return {}
    out = {}
    for line in p.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 4:
            out[parts[0]] = {"state": parts[1], "exit": parts[2], "nodes": parts[3]}
    return out


def describe(run: Run) -> str:
    """The state in a few words: `running: Ray up (2 nodes, 6.3 s)`, `pending (Resources)`."""
    if run.state == "pending":
        from vrun.rundir.cause import pending_words

        return f"pending ({pending_words(run.reason)})" if run.reason else "pending"
    if run.state in ("planned", "completed", "cancelled"):
        return run.state
    if run.phase.startswith(run.state):  # "failed on n1: ...", not "failed: failed on n1: ..."
        return run.phase
    return f"{run.state}: {run.phase}" if run.phase else run.state


def node_name(run: Run, e: dict) -> str:
    n = e.get("node")
    if isinstance(n, int) and n < len(run.hosts):
        return run.hosts[n]
    return e.get("host") or str(n)


def alive(pid: int) -> bool:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return False  # 0, 1 and negative ids are groups or init: never one run's process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mtime(p: Path) -> float:
    return fs.mtime(p) or 0.0


def _manifest_commit(d: Path) -> Optional[str]:
    try:
        return json.loads((d / "manifest.json").read_text()).get("git", {}).get("commit")
    except (OSError, ValueError, AttributeError):
        return None

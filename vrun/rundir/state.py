"""A run dir read back: what it planned, where it was submitted, and its state.

The state comes from the run's own progress lines (vrun/rundir/records.py); `squeue` adds why a job is pending and
notices a job that left the queue without a word; `sacct` adds what it knows where accounting works. Standard
library only, and one `squeue` call for any number of runs: `python -m vrun runs` stays fast on a large sweep.
The typed run is vrun.rundir.run_types (`Run`, `Attempt`, the state words), an attempt seen through SLURM's record
and its log vrun.rundir.slurm_attempt; their names are importable from here.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Optional

from vrun.rundir import records as rundir, slowness
from vrun.rundir.files import RunDirError
from vrun.rundir.record import PlanRecord
from vrun.rundir.run_types import (  # noqa: F401 - the typed run; importable from here
    ACTIVE, RANK, SLURM_ENDS, STATES, Attempt, Run, time_limit_words)
from vrun.rundir.slurm_attempt import (  # noqa: F401 - an attempt seen through SLURM; importable from here
    from_job as _from_job, from_log as _from_log, log_paths, lost_pending, requeue_cause)
from vrun.core import fs
from vrun.core.text import summarised

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
    if plan.cluster == "ray" or fs.exists(d / "ray_job.json"):
        from vrun.rundir import rayrecord

        run.ray, run.ray_problem = rayrecord.load(d)
    derive(run)
    if not run.when:
        run.when = indexed_at or _mtime(d / "plan.json")
    return run


def _attempt_key(e: dict) -> tuple:
    """Which start an event belongs to: (SLURM job id, restart count), or a local launch's attempt number."""
    j = e.get("job_id")
    if j:
        r = e.get("restart")
        return (str(j), r if isinstance(r, int) and not isinstance(r, bool) and r >= 0 else 0)
    return ("", int(e.get("attempt") or 0))


def attempts_of(events: list, slurm: Optional[dict]) -> list:
    """The run's starts in the order they first appear (a run dir of an older vrun: one per job id)."""
    groups: dict = {}
    for e in events:
        groups.setdefault(_attempt_key(e), []).append(e)
    if not groups and slurm:  # submitted before runs recorded their progress
        groups[(str(slurm.get("job_id")), 0)] = []
    out = []
    for n, ((job, restart), evs) in enumerate(groups.items()):
        out.append(Attempt(n=n, job_id=job or _ray_job(evs), restart=restart if job else 0, events=evs))
    return out


def _ray_job(evs: list) -> Optional[str]:
    """A Ray attempt's job id, as its `submitted` line records it (ray_job), when it is one."""
    from vrun.rundir.rayrecord import SUBMISSION

    j = next((e.get("ray_job") for e in evs if e["event"] == "submitted" and e.get("cluster") == "ray"), None)
    return j if isinstance(j, str) and SUBMISSION.fullmatch(j) else None


def _phases(a: Attempt, mode: str, hosts_of) -> None:
    """An attempt's state from its own lines alone."""
    state, phase = "pending", "submitted"
    for e in sorted(a.events, key=lambda e: (RANK.get(e["event"], 9), e["t"])):
        ev = e["event"]
        if ev == "submitted":
            state, phase = "pending", "submitted"
        elif ev == "started":
            a.hosts = [h for h in (e.get("hosts") or [e.get("host")]) if isinstance(h, str)]
            a.pid, a.host = e.get("pid"), e.get("host")
            a.started = e["t"] if a.started is None else a.started
            state, phase = "running", f"started on {summarised(a.hosts, sep=',')}"
        elif ev == "ray_running":  # a Ray job seen running (the dashboard's word, kept: it may stop answering)
            t0 = e.get("started")
            ok = isinstance(t0, (int, float)) and not isinstance(t0, bool) and 0 < t0 < 1e11
            a.started = (t0 if ok else e["t"]) if a.started is None else a.started
            if state == "pending":
                state, phase = "running", "running"
        elif ev == "nodes_joined":
            state, phase = "running", f"nodes joined {e.get('joined')}/{e.get('of')}"
        elif ev == "ray_up":
            state, phase = "running", f"Ray up ({e.get('nodes')} nodes, {e.get('seconds')} s)"
        elif ev == "entrypoint_started":
            if a.pid is None and e.get("pid"):
                a.pid, a.host = e.get("pid"), e.get("host")
            state, phase = "running", ("training started" if mode == "train" else f"{mode} started")
        elif ev == "exited" and state not in ("failed", "cancelled", "timeout"):
            if e.get("rc") == 0:
                if e.get("node", 0) == 0:
                    state, phase = "completed", "exited 0"
            else:
                node = hosts_of(a, e)
                state, phase = "failed", f"exited {e.get('rc')} on {node}"
                a.failure = {"node": node, "error": f"exit code {e.get('rc')}", "t": e["t"]}
        elif ev == "failed" and state not in ("cancelled", "timeout"):
            if state != "failed" or (a.failure or {}).get("error", "").startswith("exit code"):
                a.failure = {"node": hosts_of(a, e), "error": e.get("error"), "t": e["t"]}
            state, phase = "failed", f"failed on {a.failure['node']}: {a.failure['error']}"
        elif ev == "time_limit":
            state, phase = "timeout", time_limit_words(e)
        elif ev == "ray_ended":  # how a Ray job ended, recorded once the cluster said so (it may forget it later)
            s0, s1 = e.get("started"), e.get("ended")
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1e11 for x in (s0, s1)) \
                    and s0 <= s1:
                a.started, a.ended = s0, s1
            if e.get("state") in STATES and e.get("state") not in ACTIVE and state in ACTIVE:
                state, phase = e["state"], str(e.get("phase") or e["state"])[:300]
        elif ev == "cancelled":
            state, phase = "cancelled", "cancelled with python -m vrun cancel"
        elif ev == "stopped":  # restarts without progress (vrun.rundir.no_progress): the run is stopped
            state, phase = "failed", str(e.get("why") or "stopped")[:500]
            a.failure = {"node": hosts_of(a, e), "error": phase, "t": e["t"]}
        if ev in ("exited", "failed", "cancelled", "time_limit", "ray_ended", "stopped"):
            a.ended = max(a.ended or 0.0, e["t"]) if ev != "ray_ended" or a.ended is None else a.ended
    stop = next((e for e in reversed(a.events) if e["event"] == "signalled" and "node" in e), None)
    if stop is not None and state in ("running", "failed"):  # a node SLURM stopped said why, not a failure
        why = str(stop.get("why") or "")
        if why.startswith("a cancellation"):
            state, phase = "cancelled", "cancelled outside vrun (scancel) while running"
            a.failure = None
        elif why.startswith("the time limit"):
            state, phase = "timeout", time_limit_words({"step": stop.get("step")})
            a.failure = None
        a.ended = a.ended or stop["t"]
    act = a.last("stall_action")
    if act is not None and act.get("action") in ("cancelled", "requeued") and state in ("running", "failed",
                                                                                        "cancelled"):
        gone = act.get("exclude") if isinstance(act.get("exclude"), list) else []
        state = "cancelled"
        phase = ("stalled, submitted again" + (f" without {summarised(gone, sep=',')}" if gone else "") if act["action"] ==
                 "requeued" else "stalled, cancelled by the watchdog" +
                 (f": {act['why']}" if isinstance(act.get("why"), str) and act["why"] else "")) + \
            f" ({act.get('summary')})"
        a.failure = None
        a.ended = a.ended or act["t"]
    chk = a.last("node_check")  # vrun.launch.slurm.nodegate: nodes failed their check before Ray started
    if chk is not None and chk.get("action") == "requeued" and state in ("running", "failed", "cancelled"):
        gone = [h for h in chk["exclude"] if isinstance(h, str)] if isinstance(chk.get("exclude"), list) else []
        first = chk["lines"][0] if isinstance(chk.get("lines"), list) and chk["lines"] else "?"
        state, phase, a.failure = "cancelled", f"node check failed, submitted again without " \
            f"{summarised(gone, sep=',')} ({str(first)[:300]})", None
        a.ended = a.ended or chk["t"]
    a.state, a.phase = state, phase
    if state not in ACTIVE:
        a.end = phase


def derive(run: Run) -> None:
    """State, phase, attempts, failure and elapsed time from the progress lines alone (refresh adds SLURM's)."""
    evs = run.events
    run.attempts = attempts_of(evs, run.slurm)
    for e in evs:
        j = e.get("job_id")
        if j and str(j) not in run.job_ids:
            run.job_ids.append(str(j))
    if run.slurm and run.slurm.get("job_id") and str(run.slurm["job_id"]) not in run.job_ids:
        run.job_ids.append(str(run.slurm["job_id"]))
    if not run.attempts:
        return
    starts = [e["t"] for e in evs if e["event"] in ("submitted", "started")]
    run.when = max(starts) if starts else 0.0
    for a in run.attempts:
        _phases(a, run.plan.mode, lambda a, e: node_name(a.hosts, e))
    from vrun.rundir import no_progress  # an attempt that exited 0 after resuming and training nothing failed

    no_progress.settle_zero_steps(run, lambda a: log_paths(run, a.job_id) if run.on_slurm else [run.dir / "job.log"])
    for a, b in zip(run.attempts, run.attempts[1:]):
        if a.job_id and b.job_id == a.job_id and b.restart > a.restart:  # SLURM started the same job again
            _requeued(run, a)
    _settle(run)


def _requeued(run: Run, a: Attempt) -> None:
    """An attempt SLURM (or the job itself) requeued: how it ended is why it was requeued."""
    cause = requeue_cause(run, a) or (a.end if a.state not in ACTIVE else "")
    a.state = "requeued"
    a.phase = a.end = "requeued" + (f" after {cause}" if cause else "")
    a.failure = None
    a.ended = a.ended or a.started


def settle(run: Run) -> None:
    """The run's state is its last attempt's; elapsed time sums every attempt's (after an attempt changed)."""
    _settle(run)


def _settle(run: Run) -> None:
    """The run's state is its last attempt's; elapsed time sums every attempt's."""
    cur = run.attempts[-1]
    run.attempt, run.job_id = cur.n, cur.job_id or (str(run.slurm["job_id"]) if run.slurm else None)
    run.state, run.phase, run.failure, run.hosts = cur.state, cur.phase, cur.failure, cur.hosts
    run.pid, run.host = cur.pid, cur.host
    run.resumed = cur.last("resumed")
    stalled, back = cur.last("stalled"), cur.last("unstalled")
    run.stall = stalled if stalled and (not back or back["t"] < stalled["t"]) else None
    run.slow = slowness.active(cur.events)
    if run.stall and run.state == "running":
        run.phase = str(run.stall.get("summary") or "stalled")
    now = time.time()
    total = 0.0
    for a in run.attempts:
        if a.started is None:
            continue
        if a.ended is not None:
            total += a.ended - a.started
        elif a is cur and a.state == "running":
            total += now - a.started
    run.elapsed_s = max(total, 0.0)


def refresh(runs: list) -> None:
    """SLURM's record of every run's jobs (one squeue for all of them; sacct for those squeue has forgotten and
    whose end the run's lines do not say), then the log of an attempt that ended without a word. Local runs:
    whether their process is still alive."""
    from vrun.rundir import jobs

    slurm_runs = [r for r in runs if r.on_slurm and r.attempts]
    if slurm_runs:
        queue = jobs.squeue()
        if queue is None:
            for r in slurm_runs:
                if r.active:
                    r.reason = "squeue unavailable"
        else:
            unknown = [r.attempts[-1].job_id for r in slurm_runs if r.attempts[-1].job_id not in queue
                       and r.attempts[-1].state in ACTIVE]
            known = {**jobs.sacct([j for j in unknown if j]), **queue} if unknown else queue
            for r in slurm_runs:
                follow(r, known)
    for r in runs:
        if r.active and not r.on_slurm and not r.on_ray and r.pid and r.host == socket.gethostname() and \
                not alive(r.pid):
            r.state, r.phase = "lost", f"process {r.pid} ended without recording an exit"


def not_own(run: Run, job) -> str:
    """Why SLURM's record of a job id this run recorded is not the run's own job ("" when it is): squeue's job name
    against the plan's sbatch job name, its work dir against the dir the `submitted` line of that id ran sbatch in."""
    from vrun.rundir import jobs

    name = (run.plan.slurm.parameters or {}).get("job_name") if run.plan.slurm else None
    work_dir = next((e["work_dir"] for e in reversed(run.events) if e["event"] == "submitted" and
                     str(e.get("job_id")) == job.id and isinstance(e.get("work_dir"), str)), None)
    return jobs.not_this_runs(job, name, work_dir)


def follow(run: Run, known: dict) -> None:
    """Put SLURM's record (known: job id → vrun.rundir.jobs.Job) over what the run's lines say, attempt by attempt:
    a job SLURM started again is a new attempt (the earlier one ended `requeued`), an ended job's state word says how
    it ended (a run's own failure line stays its cause), a job neither knows is read from its log."""
    added = []
    for a in list(run.attempts):
        job = known.get(a.job_id or "")
        last_of_job = a is [x for x in run.attempts if x.job_id == a.job_id][-1]
        if job is None or not last_of_job:
            continue
        if job.restarts > a.restart:  # SLURM (or the job itself) requeued it: a newer start of the same job
            if a.state != "requeued":
                _requeued(run, a)
            nxt = Attempt(n=len(run.attempts) + len(added), job_id=a.job_id, restart=job.restarts, events=[])
            _from_job(nxt, job, run, after=a)
            added.append(nxt)
        else:
            _from_job(a, job, run)
    run.attempts += added
    cur = run.attempts[-1]
    if cur.state in ACTIVE and cur.job_id and cur.job_id not in known and cur.started is not None:
        _from_log(run, cur)
    elif cur.state == "pending" and cur.job_id and cur.job_id not in known and known is not None:
        cur.state = "lost"
        cur.phase = cur.end = lost_pending(run)
    _settle(run)
    if run.state in ("pending", "requeued"):
        job = known.get(cur.job_id or "")
        run.reason = job.reason if job else ""


def describe(run: Run) -> str:
    """The state in a few words: `running: Ray up (2 nodes, 6.3 s)`, `pending (Resources)`, `requeued after node
    failure (…); pending (BeginTime: …)`, `timeout: time limit: step 40 saved`."""
    from vrun.rundir.cause import pending_words

    if run.state == "pending":
        return f"pending ({pending_words(run.reason)})" if run.reason else "pending"
    if run.state in ("planned", "completed"):
        return run.state + (f" (attempt {run.attempt})" if run.attempt and run.state == "completed" else "")
    text = run.phase if run.phase.startswith(run.state) else (f"{run.state}: {run.phase}" if run.phase else run.state)
    if run.state == "requeued" and run.reason:
        text += f" ({pending_words(run.reason)})"
    if run.state == "running" and run.attempt:
        prev = run.attempts[-2] if len(run.attempts) > 1 else None
        text += f" (attempt {run.attempt}" + (f", after {prev.end}" if prev and prev.end else "") + ")"
    return text


def node_name(hosts: list, e: dict) -> str:
    n = e.get("node")
    if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < len(hosts):
        return hosts[n]
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
    from vrun.rundir import files

    git = (files.optional_object(d / "manifest.json") or {}).get("git")
    commit = git.get("commit") if isinstance(git, dict) else None
    return commit if isinstance(commit, str) else None

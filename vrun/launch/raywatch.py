"""A Ray job watched from its own entry (cluster=ray, cluster=kuberay): the watchdog SLURM's node 0 runs
(vrun.launch.watchdog), with the job's own ways to see progress, diagnose a stall and act on it.

Where its records go (`place`, vrun.launch.rayjob_own, with the job's attempt, its submission id and its stdout:
their names importable from here): the run dir when plan.json at the path the plan recorded is this run (the same
run_id: the nodes share its storage, as KubeRay's claim or a standing cluster on shared storage do); else the job's
working dir (Ray's uploaded copy of the run dir), each event then also printed as one `vrun: event {...}` line in
the job's log, which `python -m vrun logs` shows where the plan was made.

Progress: verl's step lines reach the driver's own stdout (verl's TaskRunner is a Ray actor; log_to_driver forwards
its prints), which Ray's job supervisor writes to a file on the head: /proc/<pid>/fd/1 is that regular file and is
tailed. A driver whose stdout is no file (run by hand on a terminal) tees its stdout into a private temp file.

A stall's diagnosis (`Job.collect`): Ray's state API (list_nodes, list_actors, detail=True) gives every
live process of this job with its node and pid; a task of no CPU pinned to each node
(NodeAffinitySchedulingStrategy, soft=False) dumps those processes there (vrun.launch.stacks.dump_node: py-spy,
else the process's own SIGURG hook where it has one) and returns the files, which this driver writes under
stalls/<n>/ through the writer, one `<node>.json`/`.txt` per Ray node (`<host>-<node id[:8]>`: two Ray nodes may
share a host), with ray.json (the nodes and the job's actors). A node that does not answer within DUMP_WAIT_S is one
`<node>.failed` line.

run.on_stall (`Job.act`): cancel records `stall_action` and ends this driver (exit STALLED_EXIT: Ray marks the job
FAILED and stops its actors with it); requeue records `stall_action` requeued, starts `python -m
vrun.launch.raywatch requeue` in its own session (it outlives the job), and ends the driver: that process waits
for the driver to be gone, then runs `python -m vrun resubmit <run dir>` (the job rebuilt from plan.json; verl
resumes from the last whole checkpoint with the same tracker id), recording a failure as `requeue_failed` then
cancelled. A standing cluster or KubeRay cannot leave a node out: the event says so. cluster.max_requeues counts as
on SLURM (watchdog.stalls_in_a_row). KubeRay's pods cannot apply a RayJob, and a run dir the nodes do not reach
cannot be resubmitted from them: requeue acts as cancel there, saying why.

cluster=ray also ends the job at its time limit (cluster.time_min after the entry started: `time_limit`), which
verl's pre-deadline save was given (vrun.launch.deadline.ray_env); KubeRay's operator ends its own at
activeDeadlineSeconds.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from vrun.core import fs, writer
from vrun.launch.rayjob_own import (  # noqa: F401 - the job seen from its driver; importable from here
    SUBMISSION_ID, Place, attempt, keep_log, place, stdout_file, submission_id, tee_stdout)
from vrun.launch.watchdog import Watchdog
from vrun.rundir import records as rundir

STALLED_EXIT = 3            # the driver's exit code when the watchdog ends the job
TIME_LIMIT_EXIT = 4
STATE_TIMEOUT_S = 30        # each request to Ray's state API
REQUEUE_WAIT_S = 300        # how long the requeue waits for the driver, then for Ray to call the job ended
NAME = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
NO_EXCLUDE = {"ray": "a standing Ray cluster cannot leave a node out: submitted again to the same nodes",
              "kuberay": "KubeRay schedules its own pods: no node can be left out"}


# ---------------------------------------------------------------------------------------------- the diagnosis
def label(node: dict) -> str:
    """A Ray node's name in a stall's files and summary: its host and the start of its id."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", str(node.get("name") or node.get("ip") or "node"))[:100]
    return f"{host}-{str(node.get('id'))[:8]}"


def job_processes(job_hex: str, driver: tuple) -> tuple[dict, dict]:
    """({node id: {"name", "ip", "id", "pids"}} for the alive nodes with this job's live processes — its driver and
    its alive actors (verl's task runner and workers), each process's children dumped with it — and Ray's view for
    ray.json). driver: (node id, pid) of this driver."""
    from ray.util.state import list_actors, list_nodes

    kw = dict(detail=True, limit=10000, timeout=STATE_TIMEOUT_S, raise_on_missing_output=False)
    nodes = {n.node_id: {"id": n.node_id, "name": getattr(n, "node_name", None), "ip": n.node_ip, "pids": []}
             for n in list_nodes(**kw) if n.state == "ALIVE"}
    actors = [a for a in list_actors(**kw) if a.job_id == job_hex and a.state == "ALIVE"]
    for node_id, pid in [driver] + [(a.node_id, a.pid) for a in actors]:
        if node_id in nodes and isinstance(pid, int) and pid > 0 and pid not in nodes[node_id]["pids"]:
            nodes[node_id]["pids"].append(pid)
    view = {"nodes": [{k: v for k, v in n.items() if k != "pids"} | {"label": label(n), "processes": len(n["pids"])}
                      for n in nodes.values()],
            "actors": [{"class": a.class_name, "pid": a.pid, "node": a.node_id, "state": a.state} for a in actors]}
    return {k: v for k, v in nodes.items() if v["pids"]}, view


def dump_here(n: int, pids: list, host: str, timeout_s: float) -> dict:
    """On the node a task was pinned to: these processes' stacks (vrun.launch.stacks.dump_node) as {file: text}."""
    import tempfile

    from vrun.launch import stacks

    with tempfile.TemporaryDirectory(prefix="vrun-dump-") as tmp:
        out = Path(tmp) / "stalls" / str(n)
        stacks.dump_node(out, os.getpid(), timeout_s, pids=pids, host=host)
        return {p.name: fs.read_small(p, 256 << 20) or "" for p in out.iterdir()
                if fs.is_file(p) and NAME.fullmatch(p.name)}


def collect(n: int, out: Path, root: str, wait_s: float) -> None:
    """Every node's dump of this job's processes into `out` (see the module's docstring)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ctx = ray.get_runtime_context()
    nodes, view = job_processes(ctx.get_job_id(), (ctx.get_node_id(), os.getpid()))
    writer.write_text(out / "ray.json", json.dumps(view, indent=1, default=str) + "\n", root=root)
    task = ray.remote(num_cpus=0, max_retries=0)(dump_here)
    refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
        n, node["pids"], label(node), 30.0): label(node) for node_id, node in nodes.items()}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=wait_s)
    for ref in ready:
        try:
            files = ray.get(ref, timeout=5)
        except Exception as e:  # noqa: BLE001 - the node's dump failed: its own line
            files = {f"{refs[ref]}.failed": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}\n"}
        for name, text in files.items():
            if NAME.fullmatch(name) and name.startswith(refs[ref]):
                writer.write_text(out / name, text, root=root)
    for ref in late:
        ray.cancel(ref, force=True)
        writer.write_text(out / f"{refs[ref]}.failed", f"no dump within {wait_s:g} s\n", root=root)


# ---------------------------------------------------------------------------------------------- the job
class Job:
    """The watchdog's callbacks for one Ray job: record, collect, act (vrun.launch.watchdog.Watchdog)."""

    def __init__(self, plan, where: Place, ray_job: Optional[str]):
        from vrun.launch.slurm.node import cluster_of

        self.plan, self.where, self.ray_job = plan, where, ray_job
        self.cluster = cluster_of(plan.cluster_group)
        self.kind = str(plan.cluster)

    def record(self, event: str, **fields) -> None:
        fields = {"attempt": attempt(), **({"ray_job": self.ray_job} if self.ray_job else {}), **fields}
        rundir.record(self.where.dir, event, **fields)
        if not self.where.same_run:
            print("vrun: event " + json.dumps({"event": event, "t": round(time.time(), 3), **fields}, default=str),
                  flush=True)

    def collect(self, n: int, out: Path) -> None:
        from vrun.launch import watchdog

        watchdog.poke_nccl(self.where.dir)  # every rank asked for its flight-recorder dump (vrun.launch.flightrec)
        collect(n, out, self.where.dir, watchdog.DUMP_WAIT_S)
        watchdog.collect_nccl(self.where.dir, out)

    def requeue_refusal(self) -> str:
        """Why this job cannot be submitted again from here ("" when it can)."""
        if self.kind == "kuberay":
            return ("run.on_stall=requeue on KubeRay acts as cancel: a pod cannot apply a RayJob (submit it again "
                    "from where it was planned: python -m vrun resubmit <run dir>)")
        if not self.where.same_run:
            return f"run.on_stall=requeue acts as cancel: {self.where.why}, so the job cannot be submitted again from it"
        return ""

    def act(self, action: str, summary: str, hosts: list) -> None:
        """A stall past its grace: cancel, or submit again (see the module's docstring); then this driver ends."""
        from vrun.launch import watchdog

        why = ""
        if action == "requeue":
            why = self.requeue_refusal()
            again = watchdog.stalls_in_a_row(rundir.events(self.where.dir))
            if not why and again >= self.cluster.max_requeues:
                why = (f"stalled {again + 1} times in a row without getting past its step, {again} submitted again "
                       f"(cluster.max_requeues={self.cluster.max_requeues}): not submitted again")
            if not why:
                from vrun.rundir import no_progress

                stop = no_progress.before_restart(self.where.dir, self.plan, self.cluster.no_progress_attempts)
                if stop is not None:
                    why = stop.line()
                    self.record("stopped", **stop.fields())
            if not why:
                self.record("stall_action", action="requeued", summary=summary, exclude=[],
                            note=NO_EXCLUDE.get(self.kind, ""))
                try:
                    start_requeue(self.where.dir, os.getpid(), summary)
                except OSError as e:
                    self.record("stall_action", action="requeue_failed", summary=summary, error=str(e)[:300])
                    why = "the resubmission could not be started"
                else:
                    self.end(STALLED_EXIT, "vrun: watchdog: the job ends; it is submitted again once it has")
                    return
        self.record("stall_action", action="cancelled", summary=summary, **({"why": why} if why else {}))
        self.end(STALLED_EXIT, "vrun: watchdog: " + (why + "; " if why else "") + "the job ends (cancelled)")

    def end(self, code: int, line: str) -> None:
        """This driver ends now, non-zero: Ray stops the job's actors with it."""
        print(line, flush=True)
        keep_log()  # cluster=ray: its log kept in the run dir (vrun.launch.rayjob_own)
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


    def time_limit(self) -> None:
        """cluster=ray at cluster.time_min after the entry's start: recorded as `time_limit`, then the job ends."""
        from vrun.rundir import checkpoints

        step = checkpoints.read_tracker(Path(self.where.dir) / "checkpoints")[0]
        self.record("time_limit", requeued=False, step=step)
        self.end(TIME_LIMIT_EXIT, f"vrun: time limit: cluster.time_min={self.cluster.time_min} passed; "
                 f"{'step ' + str(step) + ' saved' if step is not None else 'no checkpoint saved'}; the job ends")


class RayWatchdog(Watchdog):
    """The watchdog, ending a cluster=ray job at its time limit as well (end_at: unix seconds)."""

    def __init__(self, *a, end_at: Optional[float] = None, on_end=None, **kw):
        super().__init__(*a, **kw)
        self.end_at, self.on_end = end_at, on_end

    def tick(self) -> None:
        super().tick()
        if self.end_at is not None and self.clock() >= self.end_at:
            self.end_at = None
            self.on_end()


def start(config_path: str, config) -> Optional[Watchdog]:
    """In a cluster=ray or cluster=kuberay job's entry, mode=train: verl's deadline put into the job's runtime env
    (vrun.launch.deadline.ray_env), then, with the plan's `watch`, the watchdog started beside verl's driver.
    Returns it (None where nothing is watched)."""
    from omegaconf import OmegaConf

    from vrun.launch import deadline, flightrec
    from vrun.rundir.files import RunDirError
    from vrun.rundir.record import PlanRecord

    here = os.path.dirname(os.path.abspath(config_path))
    try:
        record = PlanRecord.load(here)
    except RunDirError:
        return None
    if record.mode != "train" or str(record.cluster) not in ("ray", "kuberay"):
        return None
    where = place(here, record)
    job = Job(record, where, submission_id())
    env, end, line = deadline.ray_env(job.kind, job.cluster.time_min, job.cluster.signal_delay_s)
    for k, v in env.items():  # every worker of the job reads it (verl's run_ppo passes this runtime env to ray.init)
        OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{k}", v, force_add=True)
        os.environ[k] = v
    for k, v in flightrec.ray_runtime_env(where.dir, os.environ).items():  # every worker: the recorder, its listener
        OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.{k}", v, force_add=True)
    print(f"vrun: {line}", flush=True)
    if record.watch is None:
        return None
    if not where.same_run:
        print(f"vrun: watchdog: {where.why}: stalls and events go under the job's working dir {here}, each event "
              "also printed here as a `vrun: event` line", flush=True)
    log = stdout_file() or tee_stdout()
    if log is None:
        print("vrun: watchdog: this driver's output cannot be read back: the job is not watched", flush=True)
        return None
    from vrun.launch.phases import RayPhases, ray_job_id

    dog = RayWatchdog(where.dir, log, record.watch, record=job.record, collect=job.collect, act=job.act,
                      plan=record, end_at=end if job.kind == "ray" else None, on_end=job.time_limit,
                      phases=RayPhases(None, job_id=ray_job_id))
    dog.start()
    return dog


def learn(config_path: str) -> None:
    """At the job's end, in its own entry: the run's measured step time (verl's step lines in this driver's output)
    into the calibration record, as the local launch and a SLURM job's node 0 do (vrun.planning.measured); nothing
    when the output cannot be read back or holds no step. Never raises."""
    try:
        from vrun.planning import measured
        from vrun.rundir import joblog
        from vrun.rundir.record import PlanRecord

        here = os.path.dirname(os.path.abspath(config_path))
        record = PlanRecord.load(here)
        log = stdout_file()
        if record.mode != "train" or log is None:
            return
        sys.stdout.flush()
        m = joblog.read([log])
        if m.steps:
            measured.learn(Path(place(here, record).dir), m)
    except Exception:  # noqa: BLE001 - learning never fails a finished run
        pass


def start_requeue(run_dir: str, driver_pid: int, summary: str) -> None:
    """`python -m vrun.launch.raywatch requeue <run dir> <driver pid>` in its own session: it outlives this job."""
    import vrun

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_JOB_") and k != "RAY_ADDRESS"}
    top = str(Path(vrun.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([top] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    subprocess.Popen([sys.executable, "-m", "vrun.launch.raywatch", "requeue", run_dir, str(driver_pid), summary],
                     env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, cwd="/")


def requeue(run_dir: str, driver_pid: int, summary: str, wait_s: float = REQUEUE_WAIT_S) -> int:
    """Once the driver is gone: `python -m vrun resubmit <run dir>`, tried until Ray calls the job ended (it says so
    a moment after its driver exits) or wait_s passed; a failure recorded as requeue_failed, then cancelled."""
    from vrun.rundir import state

    end = time.monotonic() + wait_s
    while time.monotonic() < end and state.alive(driver_pid):
        time.sleep(0.5)
    tries = []
    while True:
        # detached: the submission's own outcome, not the new job's end (following it, a job that fails later
        # would read as a failed submission and be submitted again)
        p = subprocess.run([sys.executable, "-m", "vrun", "resubmit", run_dir, "--detach"], capture_output=True,
                           text=True, timeout=300, errors="replace")
        tries.append((p.stdout + p.stderr).strip())
        if p.returncode == 0 or time.monotonic() >= end:
            break
        time.sleep(3)
    log = Path(run_dir) / ".vrun" / f"requeue-{int(time.time())}.log"
    try:
        if not fs.exists(log.parent):
            os.mkdir(log.parent)
        writer.write_text(log, "\n---\n".join(tries) + "\n", root=run_dir)
    except OSError:
        pass
    if p.returncode:
        last = (tries[-1].splitlines() or ["?"])[-1][:300]
        rundir.record(run_dir, "stall_action", attempt=attempt(), action="requeue_failed", summary=summary, error=last)
        rundir.record(run_dir, "stall_action", attempt=attempt(), action="cancelled", summary=summary,
                      why=f"python -m vrun resubmit failed: {last}")
    return p.returncode


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "requeue" and sys.argv[3].isdigit():
    sys.exit(requeue(sys.argv[2], int(sys.argv[3]), sys.argv[4]))

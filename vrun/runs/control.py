"""`python -m vrun cancel` and `resubmit`: act on a run's jobs as SLURM records them — a requeued job is cancelled like
a running one; a run is submitted again only when none of its jobs is queued or running."""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from vrun.core.text import summarised
from vrun.core import fs
from vrun.rundir import records as rundir
from vrun.rundir import state
from vrun.runs.common import Usage, one_run

def cmd_cancel(a) -> int:
    targets = []
    sweep = False
    for path in a.runs:
        ps = state.points(path)
        sweep = sweep or len(ps) > 1 or not fs.is_file(Path(path) / "plan.json")
        targets += [state.load(p) for p in ps]
    state.refresh(targets)
    from vrun.rundir import rayjob

    rayjob.refresh([r for r in targets if r.on_ray], with_logs="none")
    live = [r for r in targets if r.active]
    ended = [r for r in targets if not r.active]
    if not live:
        r = ended[0]
        if len(ended) == 1:
            raise Usage(f"error: run={r.dir}: {_ended(r)}; nothing to {'stop' if r.state == 'lost' else 'cancel'}; "
                        "fix: " + (f"resubmit it (python -m vrun resubmit {shlex.quote(str(r.dir))})"
                                   if r.on_slurm or r.on_ray else
                           "plan and start it again (python runner.py ...)"))
        raise Usage(f"error: runs={' '.join(a.runs)}: none of the {len(ended)} runs is pending or running "
                    f"({', '.join(sorted({r.state for r in ended}))}); nothing to cancel; fix: python -m vrun runs "
                    f"{' '.join(a.runs)}")
    if sweep and not a.yes:
        question = f"cancel {len(live)} run(s) ({len(ended)} already ended)? [y/N] "
        if not sys.stdin.isatty():
            raise Usage(f"error: runs={' '.join(a.runs)}: cancelling {len(live)} run(s) of a sweep needs "
                        "confirmation and there is no terminal to ask on; fix: add --yes")
        if input(question).strip().lower() not in ("y", "yes"):
            print("nothing cancelled")
            return 1
    ids = {}
    if any(r.on_slurm for r in live):  # every job confirmed as its run's before any is cancelled
        from vrun.rundir import jobs

        queue = jobs.squeue()
        ids = {str(r.dir): own_jobs(r, queue) for r in live if r.on_slurm}
    for r in ended:
        print(f"skipped {r.dir}: {_ended(r)}")
    failed = []
    for r in live:
        try:
            cancel_one(r, ids.get(str(r.dir)))
        except Usage as e:
            if not r.on_ray or len(live) == 1:
                raise
            failed.append(str(e))  # each Ray point proven and stopped on its own: one refusal stops no other
    stopping = [r for r in live if not r.on_ray or not any(str(r.dir) in f for f in failed)]
    for line in failed:
        print(line, file=sys.stderr)
    if a.no_wait:
        return 2 if failed else 0
    rc = wait_stopped(stopping, a.timeout)
    return 2 if failed else rc


def _ended(r: state.Run) -> str:
    if r.state == "planned":
        return f"a plan (mode={r.plan.mode}), never started"
    return f"the run has ended: {state.describe(r)}"


def own_jobs(r: state.Run, queue: Optional[dict]) -> list:
    """The run's job ids to scancel: those the run dir recorded that squeue lists as pending or running, each
    confirmed as this run's by the job name and the dir it was submitted from (vrun.rundir.jobs.not_this_runs).
    Raises Usage, naming the job, when any recorded id is not a job id, cannot be confirmed or is another's."""
    if queue is None:
        raise Usage(f"error: run={r.dir}: squeue cannot be run here, so its jobs cannot be confirmed as this run's: "
                    "nothing cancelled; fix: cancel from a SLURM login node (where squeue works)")
    bad = [j for j in r.job_ids if not rundir.job_id_ok(j)]
    if bad:
        raise Usage(f"error: run={r.dir}: records job id {bad[0]!r}, not a SLURM job id (a positive whole number, "
                    f"or <job>_<task>): nothing cancelled; fix: check the run's jobs with squeue --me -O "
                    "JobID,Name,WorkDir and scancel the run's own by hand")
    ids = [j for j in r.job_ids if j in queue and queue[j].active]
    if not ids:
        raise Usage(f"error: run={r.dir}: SLURM lists none of its jobs ({summarised(r.job_ids, sep=',') or 'none recorded'}) "
                    f"as pending or running: nothing cancelled; fix: python -m vrun status {r.dir}")
    for j in ids:
        why = state.not_own(r, queue[j])
        if why:
            raise Usage(f"error: run={r.dir}: job {j} {why}: nothing cancelled; fix: check it with squeue -j {j} "
                        "-O JobID,Name,WorkDir, and scancel it by hand only if it is this run's")
    return ids


def cancel_one(r: state.Run, ids: Optional[list] = None) -> None:
    """Stop one run: on SLURM, scancel ids (own_jobs: confirmed as the run's); on a Ray cluster, stop its job once
    the cluster's record proves it is the run's; locally, SIGTERM its process."""
    if r.on_ray:
        from vrun.runs import rayjobs

        rayjobs.cancel_one(r)
        return
    if r.on_slurm:
        try:
            p = subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise Usage(f"error: scancel {' '.join(ids)}: cannot run scancel here ({type(e).__name__}); fix: cancel from "
                        "a SLURM login node (where squeue works)") from None
        if p.returncode:
            raise Usage(f"error: scancel {' '.join(ids)}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}; "
                        f"fix: check the job with squeue -j {','.join(ids)}")
        cur = r.attempts[-1] if r.attempts else None
        rundir.record(str(r.dir), "cancelled", attempt=r.attempt, job_ids=ids, job_id=cur.job_id if cur else None,
                      restart=cur.restart if cur else 0)
        print(f"cancelled job {summarised(ids, sep=',')}: {r.dir}", flush=True)
        return
    pid = next((e.get("pid") for e in reversed(r.events) if e["event"] == "entrypoint_started"), None) or r.pid
    host = r.host
    if host != socket.gethostname():
        raise Usage(f"error: run={r.dir}: runs on {host}, not here ({socket.gethostname()}); fix: cancel it on {host}")
    from vrun.runs import owner

    why = owner.not_proven(pid, r.plan.run_id)
    if why:
        raise Usage(f"error: run={r.dir}: pid {owner.shown(pid)} {why}: nothing signalled; fix: stop the run "
                    "from the terminal that started it")
    try:
        os.kill(int(pid), signal.SIGTERM)
    except ProcessLookupError:
        pass
    rundir.record(str(r.dir), "cancelled", attempt=r.attempt, pid=pid)
    print(f"cancelled process {pid}: {r.dir}", flush=True)


def wait_stopped(runs: list, timeout: float) -> int:
    """Until SLURM no longer lists the jobs (local: the process is gone)."""
    deadline = time.monotonic() + timeout
    left = list(runs)
    from vrun.rundir import jobs

    while left and time.monotonic() < deadline:
        queue = jobs.squeue() if any(r.on_slurm for r in left) else {}
        still = []
        for r in left:
            if r.on_ray:
                from vrun.runs import rayjobs

                running = [] if rayjobs.stopped(r) else [r.job_id]
            elif r.on_slurm:
                running = [j for j in r.job_ids if queue is not None and j in queue and queue[j].active]
            else:
                pid = next((e.get("pid") for e in reversed(r.events) if e["event"] == "entrypoint_started"), None)
                running = [pid] if pid and state.alive(int(pid)) else []
            (still if running else []).append(r)
            if not running:
                print(f"stopped: {r.dir}", flush=True)
        left = still
        if left:
            time.sleep(1)
    if left:
        print(f"still stopping after {timeout:g} s: {' '.join(str(r.dir) for r in left)} (SLURM kills what is left "
              "after its KillWait)", file=sys.stderr)
        return 1
    return 0



def cmd_resubmit(a) -> int:
    r = one_run(a.run)
    if r.on_ray or r.plan.cluster == "ray":
        from vrun.rundir import rayjob
        from vrun.runs import rayjobs

        rayjob.refresh([r], with_logs="none", budget_s=2 * rayjob.timeout_of(r.plan))
        return rayjobs.resubmit(r, a.detach)
    if not r.on_slurm:
        raise Usage(f"error: run={r.dir}: never submitted to SLURM (no slurm_job.json); fix: submit it with "
                    "python runner.py ... cluster=slurm")
    if r.active:
        raise Usage(f"error: run={r.dir}: still {state.describe(r)} (job {r.job_id}); fix: python -m vrun cancel "
                    f"{r.dir} first, or wait for it")
    exclude = tuple(h for h in (a.exclude or "").split(",") if h)
    from vrun.launch.slurm import submit as slurm

    from vrun.core.problems import PlanError

    try:
        slurm.resubmit(str(r.dir), a.detach, exclude)
    except PlanError as e:
        raise Usage(str(e)) from None
    return 0



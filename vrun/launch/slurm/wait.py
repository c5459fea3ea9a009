"""SLURM: waiting on submitted jobs (cluster.detach=false, and `resubmit` without --detach) without ever hanging.

The outcome comes from the run dirs' own progress lines and squeue (vrun.rundir.state), never from blocking on
submitit's result: completed, failed, cancelled, lost or timed out, with or without accounting, the command
returns within a poll or two of the job's end with the state, its cause and the next command. Ctrl-C detaches
in one line (the jobs keep running). Accounting missing is said once, in words.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vrun.core.problems import PlanError, Problem

# seconds the submitter waits, once a job has ended, for it to leave the queue and for its error line
SETTLE_S = 10.0


def accounting_note(job_ids: list) -> str:
    """One line when sacct cannot answer here (submitit would warn on every poll), else ''."""
    try:
        ok = subprocess.run(["sacct", "-n", "-X", "-j", ",".join(job_ids), "-o", "JobID"], capture_output=True,
                            text=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return "" if ok else ("note: this cluster keeps no job accounting (sacct fails): a job that leaves the queue "
                          "without recording its end is reported as lost, with what its log says")


def until_ended(jobs: list, stream=None, poll_s: float | None = None) -> None:
    """jobs: (submitit job, run dir). Shows progress until every job has ended, then returns when all completed;
    otherwise exits non-zero with one line per job that did not (its state, cause, next command)."""
    from vrun.config import cli_errors
    from vrun.rundir import state
    from vrun.launch.slurm import watch

    stream = stream or sys.stdout
    note = accounting_note([j.job_id for j, _ in jobs])
    if note:
        print(note, file=stream, flush=True)
    try:
        watch.until_done(jobs, stream, **({"poll_s": poll_s} if poll_s else {}))
    except KeyboardInterrupt:
        dirs = " ".join(d for _, d in jobs)
        ids = ",".join(j.job_id for j, _ in jobs)
        print(f"\ndetached: job {ids} keeps running; python -m vrun status {dirs} / python -m vrun cancel {dirs}",
              file=sys.stderr, flush=True)
        sys.exit(130)
    settle([j.job_id for j, _ in jobs], [d for _, d in jobs])
    problems = []
    for job, d in jobs:
        r = state.load(Path(d))
        state.refresh([r])
        for line in preflight_lines(r):
            print(line, file=stream, flush=True)
        jid = r.job_id or job.job_id
        if r.state == "completed":
            print(f"job {jid}: completed" + (f" after {r.restarts} restart(s)" if r.restarts else ""), file=stream,
                  flush=True)
            continue
        problems.append(Problem("slurm", r.state, f"job {jid} {outcome(r)}", next_command(r)))
    if problems:
        cli_errors.emit([p.line() for p in PlanError(problems).problems])


def settle(job_ids: list, dirs: list, grace_s: float = SETTLE_S) -> None:
    """A job that has said how it ended may still be leaving the queue, and a node that exited non-zero records
    its error line (with the cause from its log) a moment later: wait for both, a few seconds at most."""
    import time

    from vrun.rundir import state

    from vrun.rundir import jobs

    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        queue = jobs.squeue()
        runs = [state.load(Path(d)) for d in dirs]
        pending_cause = any(r.state == "failed" and str((r.failure or {}).get("error", "")).startswith("exit code")
                            for r in runs)
        if not pending_cause and (queue is None or not any(j in queue and queue[j].active for j in job_ids)):
            return
        time.sleep(0.5)


def outcome(r) -> str:
    """How the run ended, with what came before: `failed on n1: …`, `timeout: time limit: step 40 saved; no
    requeue left (…) after 2 restart(s)`, `cancelled outside vrun (scancel) while running`."""
    from vrun.rundir import state

    if r.state == "failed" and r.failure:
        text = f"failed on {r.failure['node']}: {r.failure['error']}"
    else:
        text = state.describe(r)
    if r.stall and r.state != "running":
        text += f" ({r.stall.get('summary')})"
    if r.restarts:
        text += f" after {r.restarts} restart(s)"
    return text


def next_command(r) -> str:
    d = r.dir
    if r.state in ("cancelled", "timeout", "preempted", "node_fail"):
        return f"python -m vrun resubmit {d} (same plan and run dir; resumes from the last whole checkpoint)"
    return f"python -m vrun status {d}; python -m vrun logs {d}; then python -m vrun resubmit {d}"


def preflight_lines(r) -> list:
    """A preflight job's problems (preflight.json, written by the nodes' probe), one line each."""
    from vrun.rundir import files

    report = files.optional_object(Path(r.dir) / "preflight.json")
    if report is None:
        return []
    found = report.get("problems") or []
    found = found if isinstance(found, list) else [found]
    if not found:
        return [f"preflight: all checks passed on {len(report.get('nodes') or [])} node(s)"]
    return [f"preflight: {len(found)} problem(s) on the nodes:"] + [f"  {p}" for p in found]

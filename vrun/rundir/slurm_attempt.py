"""An attempt seen through SLURM: its job's record put over what the run's lines say (`from_job`: pending, started
again, or how it ended), its submitit log read where SLURM no longer knows the job (`from_log`), why an attempt SLURM
started again ended (`requeue_cause`), a job gone before it started (`lost_pending`), and where its logs are
(`log_paths`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from vrun.core import fs
from vrun.rundir.run_types import ACTIVE, SLURM_ENDS, Attempt, Run, time_limit_words


def from_job(a: Attempt, job, run: Run, after: Optional[Attempt] = None) -> None:
    """One attempt against its job's record."""
    if job.active:
        if job.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
            if after is not None:
                a.state, a.phase = "requeued", f"{after.end}; pending"
            elif a.started is None:
                a.state, a.phase = "pending", f"pending ({job.reason})" if job.reason else "pending"
        elif a.state == "pending":
            a.state, a.phase = "running", f"starting on {job.nodes}"
        return
    word = SLURM_ENDS.get(job.state)
    a.ended = a.ended or job.end
    if a.state not in ACTIVE and not (a.state == "failed" and word in ("timeout", "cancelled", "node_fail",
                                                                         "preempted")):
        return  # the run's own lines said how it ended (SLURM may say COMPLETED for a task that failed)
    if word == "completed":
        a.state, a.phase = "completed", "exited 0 (SLURM: COMPLETED)"
    elif word == "cancelled":
        a.state = "cancelled"
        if a.last("stall_action") is not None:
            a.phase = a.phase if a.phase.startswith("stalled") else "stalled, cancelled by the watchdog"
        elif _cancelled_by_vrun(run, a):
            a.phase = "cancelled with python -m vrun cancel"
        else:
            a.phase = ("cancelled outside vrun while pending (never started)" if a.started is None and not job.nodes
                       else "cancelled outside vrun (scancel) while running")
    elif word == "timeout":
        tl = a.last("time_limit")
        a.state, a.phase = "timeout", time_limit_words(tl if tl else {"step": run.checkpoint_step()})
    elif word == "node_fail":
        a.state, a.phase = "node_fail", f"node failure on {job.nodes or '?'}; SLURM did not requeue it"
    elif word == "preempted":
        a.state, a.phase = "preempted", "preempted; not requeued"
    else:
        from_log(run, a)
        if a.state in ACTIVE or a.state == "lost":
            a.state, a.phase = "failed", f"SLURM: {job.state}" + (f" ({job.reason})" if job.reason else "")
            out = Path(str((run.slurm or {}).get("stdout") or ""))
            if a.started is None and run.slurm and run.slurm.get("stdout") and not fs.exists(out):
                a.phase += (f": it never started, without writing its log {out}: the nodes likely cannot see {out.parent} "
                            "(node-local storage such as /tmp?); put the run dir on storage every node shares")
    a.end = a.phase


def _cancelled_by_vrun(run: Run, a: Attempt) -> bool:
    """A `cancelled` line written for this attempt's job (cancel names the job ids it scancelled)."""
    return any(e["event"] == "cancelled" and a.job_id in [str(j) for j in (e.get("job_ids") or [])]
               and (a.started is None or e["t"] >= a.started) for e in run.events)


def requeue_cause(run: Run, a: Attempt) -> str:
    """Why an attempt that SLURM started again ended: the job's own requeue signal (the time limit, a preemption),
    else SLURM's word in its log (a node failure), else what its nodes saw."""
    sig = next((e for e in reversed(a.events) if e["event"] == "signalled" and "node" not in e), None)
    if sig and isinstance(sig.get("why"), str):
        return sig["why"]
    from vrun.rundir.cause import ending, tail_lines

    lines = tail_lines(log_paths(run, a.job_id), a.key)
    end = ending(lines)
    if end and end[0] == "node_fail":
        import re

        m = re.search(r"Node failure on (\S+)", "\n".join(lines))
        return "node failure" + (f" on {m.group(1)}" if m else "")
    if end:
        return {"timeout": "the time limit", "preempted": "preemption", "cancelled": "a cancellation"}[end[0]]
    stop = a.last("signalled")
    if stop and isinstance(stop.get("why"), str):
        return stop["why"]
    if a.failure:
        return f"a failure on {a.failure['node']}: {a.failure['error']}"
    return ""


def from_log(run: Run, a: Attempt) -> None:
    """An attempt whose job SLURM no longer knows and whose lines say no end: what its log says."""
    from vrun.rundir.cause import decisive_line, ending, tail_lines

    lines = tail_lines(log_paths(run, a.job_id), a.key)
    end = ending(lines)
    if end:
        kind, line = end
        a.state = kind
        a.phase = {"timeout": lambda: time_limit_words({"step": run.checkpoint_step()}),
                   "preempted": lambda: "preempted; not requeued",
                   "node_fail": lambda: f"node failure ({line}); not requeued",
                   "cancelled": lambda: ("cancelled" if _cancelled_by_vrun(run, a) else
                                         "cancelled outside vrun (scancel) while running")}[kind]()
    else:
        cause = decisive_line(lines)
        head = f"job {a.job_id} left the queue without recording an exit"
        a.state = "lost"
        a.phase = f"{head}: {cause}" if cause else f"{head} (killed, node lost, or cancelled outside vrun)"
    a.end = a.phase


def lost_pending(run: Run) -> str:
    """A job gone from SLURM's record before it started, with no accounting to say why."""
    out = Path(str((run.slurm or {}).get("stdout") or ""))
    head = f"job {run.job_id} left the queue before it started"
    if run.slurm and run.slurm.get("stdout") and not fs.exists(out):
        return (f"{head}, without writing its log {out}: cancelled outside vrun, or the nodes could not open "
                f"{out.parent}")
    return f"{head} (cancelled outside vrun?)"


def log_paths(run: Run, job_id: Optional[str], node: int = 0) -> list:
    """submitit's stderr and stdout files of one node (task) of one job."""
    if not run.slurm or not job_id:
        return []
    folder = Path(str(run.slurm.get("folder") or "").replace("%j", str(job_id)))
    return [folder / f"{job_id}_{node}_log.err", folder / f"{job_id}_{node}_log.out"]

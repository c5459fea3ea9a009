"""Progress while a submission waits (cluster.detach=false): one line per job — pending reason → nodes joined
k/N → Ray up → training started → exit. On a terminal the lines update in place; otherwise one line is printed
per change, so a CI log shows each step once."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from vrun.rundir import state
from vrun.core import fs

POLL_S = 1.0


def line(job_id: str, run: state.Run) -> str:
    """The run's current job (a resubmission after a stall is a new one) and its state."""
    return f"job {run.job_id or job_id} {Path(run.dir).name}: {state.describe(run)}"


def until_done(jobs: list, stream=None, poll_s: float = POLL_S) -> None:
    """jobs: (submitit job, run dir). Returns when every job has ended or recorded its end."""
    stream = stream or sys.stdout
    tty = stream.isatty()
    shown: dict = {}
    seen: dict = {}
    drawn = 0
    while True:
        runs = [state.load(Path(d)) for _, d in jobs]
        if not tty:  # every recorded step once, even those that passed between two polls
            for (job, _), r in zip(jobs, runs):
                # from this job's own first line: a resubmission does not replay the earlier attempts' steps
                first = next((i for i, e in enumerate(r.events) if str(e.get("job_id")) == str(job.job_id)),
                             len(r.events))
                for n in range(max(seen.get(job.job_id, 0), first) + 1, len(r.events)):
                    before = state.Run(dir=r.dir, plan=r.plan, slurm=r.slurm, events=r.events[:n])
                    state.derive(before)
                    _show(stream, shown, job.job_id, line(job.job_id, before))
                seen[job.job_id] = len(r.events)
        state.refresh(runs)
        lines = [line(job.job_id, r) for (job, _), r in zip(jobs, runs)]
        if tty:
            if drawn:
                stream.write(f"\x1b[{drawn}A")
            for text in lines:
                stream.write("\x1b[2K" + text + "\n")
            drawn = len(lines)
        else:
            for (job, _), text in zip(jobs, lines):
                _show(stream, shown, job.job_id, text)
        stream.flush()
        if all(not r.active or (r.reason == "squeue unavailable" and _finished(job, ask=True))
               for (job, _), r in zip(jobs, runs)):
            return
        time.sleep(poll_s)


def _show(stream, shown: dict, key: str, text: str) -> None:
    if shown.get(key) != text:
        stream.write(text + "\n")
        shown[key] = text


def _finished(job, ask: bool = False) -> bool:
    """submitit wrote the job's result (or its exception); `ask`: also submitit's own view (where squeue fails)."""
    try:
        return fs.exists(job.paths.result_pickle) or (ask and job.done())
    except Exception:  # noqa: BLE001 - a submitit without paths: rely on the progress lines
        return False

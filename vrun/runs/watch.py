"""Progress while a submission waits (cluster.detach=false): one line per job — pending reason → nodes joined
k/N → Ray up → training started → exit. On a terminal the lines update in place; otherwise one line is printed
per change, so a CI log shows each step once."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from vrun.runs import state

POLL_S = 1.0


def line(job_id: str, run: state.Run) -> str:
    return f"job {job_id} {Path(run.dir).name}: {state.describe(run)}"


def until_done(jobs: list, stream=None, poll_s: float = POLL_S) -> None:
    """jobs: (submitit job, run dir). Returns when every job has ended or recorded its end."""
    stream = stream or sys.stdout
    tty = stream.isatty()
    shown: dict = {}
    drawn = 0
    while True:
        runs = [state.load(Path(d)) for _, d in jobs]
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
                if shown.get(job.job_id) != text:
                    stream.write(text + "\n")
                    shown[job.job_id] = text
        stream.flush()
        if all(not r.active or _finished(job) for (job, _), r in zip(jobs, runs)):
            return
        time.sleep(poll_s)


def _finished(job) -> bool:
    """submitit wrote the job's result (or its exception)."""
    try:
        return job.paths.result_pickle.exists()
    except Exception:  # noqa: BLE001 - a submitit without paths: rely on the progress lines
        return False

"""What a run dir records about itself, and the index of run dirs the project wrote.

Written by the planner (plan.json carries FORMAT; the run dir is added to the index), by the submitting process
(`submitted`), by the job on its nodes (`started`, `nodes_joined`, `ray_up`, `entrypoint_started`, `exited`,
`failed`, `requeued`) and by `python -m vrun cancel` (`cancelled`): one JSON line per event in
<run dir>/progress.jsonl, with the time and the host. A run's state is read from these lines, so it never depends
on SLURM's accounting. Standard library only: the job imports this on every node.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Optional

from vrun import writer

# plan.json's "format": what `python -m vrun` knows how to read. Raise it when a run dir's files change meaning.
FORMAT = 1
PROGRESS = "progress.jsonl"


def record(run_dir: str, event: str, **fields) -> None:
    """Append one event; never fails the caller (a full disk must not turn a finished run into a failed one)."""
    line = {"event": event, "t": round(time.time(), 3), "host": socket.gethostname(), **fields}
    try:
        writer.append_line(Path(run_dir) / PROGRESS, json.dumps(line), root=run_dir)
    except OSError:
        pass


def events(run_dir: str) -> list:
    """Every event recorded so far (a line cut short by a crash is skipped)."""
    try:
        text = (Path(run_dir) / PROGRESS).read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def state_dir(environ: Optional[dict] = None) -> Path:
    """Where the index lives: $VRUN_STATE_DIR, else $XDG_STATE_HOME/vrun, else ~/.local/state/vrun."""
    e = os.environ if environ is None else environ
    if e.get("VRUN_STATE_DIR"):
        return Path(e["VRUN_STATE_DIR"])
    base = e.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "vrun"


def index_path(environ: Optional[dict] = None) -> Path:
    return state_dir(environ) / "runs.jsonl"


def index_add(run_dir: str) -> None:
    """Remember a run dir the project wrote (any hydra.run.dir / hydra.sweep.dir); never fails the caller."""
    p = index_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        writer.append_line(p, json.dumps({"run_dir": str(Path(run_dir).absolute()), "t": round(time.time(), 3)}))
    except OSError:
        pass

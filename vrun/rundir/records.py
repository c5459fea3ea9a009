"""What a run dir records about itself, and the index of run dirs the project wrote.

Written by the planner (plan.json, vrun.rundir.record, carries its format; the run dir is added to the index), by the submitting process
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

from vrun.core import writer

PROGRESS = "progress.jsonl"


def record(run_dir: str, event: str, **fields) -> None:
    """Append one event; never fails the caller (a full disk must not turn a finished run into a failed one)."""
    line = {"event": event, "t": round(time.time(), 3), "host": socket.gethostname(), **fields}
    try:
        writer.append_line(Path(run_dir) / PROGRESS, json.dumps(line), root=run_dir)
    except OSError:
        pass


def events(run_dir: str) -> list:
    """Every well-formed event recorded so far: a line cut short by a crash, or one that is not an event (no
    name, no finite time, a non-integer attempt or pid), is skipped."""
    try:
        text = (Path(run_dir) / PROGRESS).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            e = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if valid_event(e):
            out.append(e)
    return out


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def job_id_ok(j) -> bool:
    """A SLURM job id as sbatch prints it: a positive whole number, without leading zeros (an array task:
    <job>_<task>); no heterogeneous component (+N), nothing a path or an option could hide in."""
    import re

    return isinstance(j, (str, int)) and not isinstance(j, bool) and re.fullmatch(
        r"[1-9][0-9]{0,19}(_(0|[1-9][0-9]{0,9}))?", str(j)) is not None


def valid_event(e) -> bool:
    """The shape every reader of progress lines relies on."""
    if not isinstance(e, dict) or not isinstance(e.get("event"), str):
        return False
    t = e.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < 1e11:  # NaN fails too
        return False
    if "attempt" in e and e["attempt"] is not None and not (_int(e["attempt"]) and e["attempt"] >= 0):
        return False
    if "pid" in e and e["pid"] is not None and not _int(e["pid"]):
        return False
    if "host" in e and e["host"] is not None and not isinstance(e["host"], str):
        return False
    if "hosts" in e and not (isinstance(e["hosts"], list) and all(isinstance(h, str) for h in e["hosts"])):
        return False
    if "job_id" in e and e["job_id"] is not None and not job_id_ok(e["job_id"]):
        return False
    if "job_ids" in e and not (isinstance(e["job_ids"], list) and all(job_id_ok(j) for j in e["job_ids"])):
        return False
    for k in ("node", "rc"):
        if k in e and e[k] is not None and not (_int(e[k]) or (k == "node" and isinstance(e[k], str))):
            return False
    return True


def run_id(run_dir: str) -> str:
    """The run's id, recorded in plan.json and exported to the run's processes as VRUN_RUN_ID (what `cancel`
    checks before it signals a process): derived from the run dir's absolute path."""
    import hashlib

    return hashlib.sha256(str(Path(run_dir).absolute()).encode()).hexdigest()[:20]


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

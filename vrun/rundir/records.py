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
PROGRESS_LIMIT = 16 << 20  # bytes of progress lines read (the newest): a run writes a few kB


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
    from vrun.core import fs

    p = Path(run_dir) / PROGRESS
    raw, why = fs.read_checked(p, PROGRESS_LIMIT, own=True, binary=True, tail=True)
    if raw is None:
        if why != "no such file":
            fs.ignored(p, why, "no progress read")
        return []
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
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


# dirs the state dir never is: the system's own (and /tmp, shared by every user)
SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media", "/mnt", "/opt",
               "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/tmp")


def resolve_state_dir(environ: Optional[dict] = None) -> tuple[Optional[Path], Optional[str]]:
    """(the state dir, None), or (None, one line saying why it is refused). $VRUN_STATE_DIR (`~` expanded; an
    absolute path), else $XDG_STATE_HOME/vrun when XDG_STATE_HOME is absolute (the XDG spec: a relative one is
    ignored), else ~/.local/state/vrun. Refused: a system dir (/, /etc, /tmp, ...) and a dir that exists but is not
    the user's own or is writable by every user."""
    from vrun.core import fs

    e = os.environ if environ is None else environ
    given = e.get("VRUN_STATE_DIR")
    if given:
        key, raw = "VRUN_STATE_DIR", os.path.expanduser(given)
        if not os.path.isabs(raw):
            return None, (f"error: VRUN_STATE_DIR={given}: not an absolute path (it would depend on the current "
                          f"dir); fix: VRUN_STATE_DIR={os.path.join(os.path.expanduser('~'), '.local', 'state', 'vrun')}")
    else:
        xdg = e.get("XDG_STATE_HOME") or ""
        base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".local", "state")
        key, given, raw = ("XDG_STATE_HOME", xdg, base) if base == xdg else ("HOME", os.path.expanduser("~"), base)
        raw = os.path.join(raw, "vrun")
    fix = f"{key}=a dir of your own, e.g. {os.path.join(os.path.expanduser('~'), '.local', 'state')}"
    real = os.path.realpath(raw)
    if real in SYSTEM_DIRS or os.path.normpath(raw) in SYSTEM_DIRS:
        return None, f"error: {key}={given}: the state dir would be {real}, a system dir; fix: {fix}"
    info = fs.stat(real)[0]
    if info is not None:
        why = fs.untrusted(info)
        if why:
            return None, f"error: {key}={given}: the state dir {real} is {why}; fix: {fix}"
    return Path(raw), None


def state_dir(environ: Optional[dict] = None) -> Optional[Path]:
    """Where the index, the calibration record and the kept trees live (resolve_state_dir); None when refused."""
    return resolve_state_dir(environ)[0]


def state_dir_problem(environ: Optional[dict] = None) -> Optional[str]:
    return resolve_state_dir(environ)[1]


def index_path(environ: Optional[dict] = None) -> Optional[Path]:
    d = state_dir(environ)
    return None if d is None else d / "runs.jsonl"


def index_add(run_dir: str) -> None:
    """Remember a run dir the project wrote (any hydra.run.dir / hydra.sweep.dir); never fails the caller."""
    p = index_path()
    if p is None:
        return
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        writer.append_line(p, json.dumps({"run_dir": str(Path(run_dir).absolute()), "t": round(time.time(), 3)}))
    except OSError as e:
        from vrun.core import fs

        st = fs.stat(p, follow=False)[0]
        if st is not None:  # there, and not a file the index can be added to (a FIFO, a link, a dir): said
            fs.ignored(p, fs.read_checked(p, own=True)[1] or e.strerror or str(e), "the run is not added to the "
                       "index: `python -m vrun runs` lists it only when given its dir")

"""Whether a process is a run's own, proven before `cancel` signals it: a pid greater than 1, not this process,
alive, and started with the run's id in its environment (VRUN_RUN_ID, exported by the run to every process it
starts: vrun/launch/environment.py), read from /proc/<pid>/environ. A recorded pid that is stale (reused by
another process), -1, 0, 1, a group or not a number is never signalled. Standard library only."""
from __future__ import annotations

import os
from typing import Any, Optional

VAR = "VRUN_RUN_ID"


def shown(pid: Any) -> str:
    s = repr(pid) if not isinstance(pid, (int, str)) else str(pid)
    return s if len(s) <= 24 and s.isprintable() else s[:21] + "..."


def not_proven(pid: Any, run_id: Optional[str], proc: str = "/proc") -> Optional[str]:
    """Why the process `pid` is not proven to be the run `run_id`'s own (None: it is)."""
    if isinstance(pid, bool) or not isinstance(pid, int):
        if not (isinstance(pid, str) and pid.isdigit() and pid.isascii()):
            return "is not a process id"
        pid = int(pid)
    if pid <= 1:
        return "is not a single process (0, 1 and negative ids name groups or init)"
    if pid == os.getpid():
        return "is this process"
    if not run_id:
        return "cannot be checked: the plan records no run id (planned by an older vrun)"
    try:
        with open(os.path.join(proc, str(pid), "environ"), "rb") as f:
            env = f.read()
    except FileNotFoundError:
        return "is no longer running"
    except OSError as e:
        return f"cannot be checked ({e.strerror or type(e).__name__})"
    if (f"{VAR}={run_id}").encode() not in env.split(b"\0"):
        return f"is not this run's process (its environment lacks {VAR}={run_id}: a reused or unrelated pid)"
    return None

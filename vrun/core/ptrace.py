"""What this machine lets a stall dump read of another process: py-spy present, Yama's ptrace_scope, and whether
this process holds CAP_SYS_PTRACE. Read by the plan's `watch` row and by a node's stall dump (vrun.launch.stacks);
the rule on top of them is vrun.planning.watch.attach_rule."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Optional

from vrun.core import fs

CAP_SYS_PTRACE = 19


def py_spy() -> Optional[str]:
    """py-spy next to this Python (the venv's) or on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if fs.is_file(here) else shutil.which("py-spy")


def scope(proc: str = "/proc") -> Optional[int]:
    """Yama's ptrace_scope (0-3), None without Yama (or where the file says something else)."""
    text = fs.read_small(f"{proc}/sys/kernel/yama/ptrace_scope", 16)
    return int(text.strip()) if text and text.strip().isdigit() else None


def has_cap_sys_ptrace(proc: str = "/proc") -> bool:
    for line in (fs.read_small(f"{proc}/self/status", 1 << 16) or "").splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
            except (IndexError, ValueError):
                return False
    return False

"""A Ray job seen from its own driver (cluster=ray, cluster=kuberay): its attempt as its submission numbered it
(VRUN_ATTEMPT), its submission id (Ray's job config), where its records go (`place`: the run dir when plan.json at
the path the plan recorded is this run, the nodes sharing its storage; else the job's working dir, Ray's uploaded
copy), and this driver's own output read back (`stdout_file`: Ray's job supervisor writes it to a regular file;
`tee_stdout` where it is no file).
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vrun.core import fs

SUBMISSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def attempt() -> int:
    """This job's attempt number as its submission set it (VRUN_ATTEMPT: vrun.launch.rayjobs), 0 where unset: the
    events it records join that attempt (vrun.rundir.state groups a Ray run's events by attempt)."""
    a = os.environ.get("VRUN_ATTEMPT", "0")
    return int(a) if a.isascii() and a.isdigit() and len(a) < 7 else 0


@dataclass(frozen=True)
class Place:
    """Where the job's records go: `dir`, the run dir itself when `same_run`, else the job's working dir."""
    dir: str
    same_run: bool
    why: str = ""   # why not the run dir


def place(here: str, record) -> Place:
    """The run dir at record.run_dir when its plan.json is this run's (run_id), else `here` (the job's copy)."""
    from vrun.rundir.files import RunDirError
    from vrun.rundir.record import PlanRecord

    target = str(record.run_dir)
    if os.path.realpath(here) == os.path.realpath(target):
        return Place(target, True)
    if not fs.is_dir(target):
        return Place(here, False, f"the run dir {target} is not on this node")
    try:
        other = PlanRecord.load(target)
    except RunDirError as e:
        return Place(here, False, f"the run dir {target} cannot be read here ({str(e)[:200]})")
    if other.run_id != record.run_id:
        return Place(here, False, f"{target} here holds another run ({other.run_id}, not {record.run_id})")
    return Place(target, True)


def submission_id() -> Optional[str]:
    """This job's submission id, from the job config Ray's supervisor gives its driver; None outside a Ray job."""
    try:
        meta = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")).get("metadata") or {}
    except (ValueError, AttributeError):
        return None
    sid = meta.get("job_submission_id") if isinstance(meta, dict) else None
    return sid if isinstance(sid, str) and SUBMISSION_ID.fullmatch(sid) else None


# ---------------------------------------------------------------------------------------------- the driver's log
def stdout_file() -> Optional[Path]:
    """/proc/<pid>/fd/1 when this process's stdout is a regular file (Ray's job supervisor writes it there)."""
    import stat

    path = Path(f"/proc/{os.getpid()}/fd/1")
    st, _ = fs.stat(path)
    return path if st is not None and stat.S_ISREG(st.st_mode) else None


def tee_stdout() -> Optional[Path]:
    """This process's stdout copied into a private temp file as it goes (fd 1 becomes a pipe read by a thread
    that writes on to the old stdout and the file); the file, or None where it cannot."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix="vrun-driver-", suffix=".log")
        r, w = os.pipe()
        sys.stdout.flush()
        old = os.dup(1)
        os.dup2(w, 1)
        os.close(w)
    except OSError:
        return None

    def pump() -> None:
        while True:
            try:
                data = os.read(r, 1 << 16)
            except OSError:
                return
            if not data:
                return
            for out in (old, fd):
                try:
                    os.write(out, data)
                except OSError:
                    pass

    threading.Thread(target=pump, name="vrun-tee", daemon=True).start()
    return Path(name)

"""One writer per run or sweep dir: planning a run (or a sweep) and submitting it, or `resubmit`, holds an exclusive
flock on <dir>/.vrun.lock until the jobs are submitted (a local run: until the process ends); a second process
planning into the same dir at the same moment is refused with one line naming the dir and the holder's pid. The
lock file holds the holder's pid (what the refusal names), goes when the lock is let go, and is no run file: a dir
holding only it counts as empty (vrun.checks.paths; one a killed process left behind). A dir this process created
for the lock and left empty (the plan was refused after it) is removed at exit.
Standard library only.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import os
from typing import Optional

from vrun.core import fs
from vrun.core.problems import Problem

LOCK = ".vrun.lock"

_held: dict = {}       # absolute dir → the lock file's descriptor (held until the process ends)
_created: list = []    # dirs this process created to lock them, outermost first


def take(dir_: str, key: str, create: bool = True) -> Optional[Problem]:
    """Lock dir_ (created if missing, when `create`) for this process: None once held (again: a no-op), else the
    Problem naming the holder (or why the lock file cannot be opened)."""
    d = os.path.abspath(dir_)
    if d in _held:
        return None
    if not create and not fs.is_dir(d):
        return Problem(key, d, "no such directory", "give a run dir the runner wrote")
    missing = []
    cur = d
    while not os.path.lexists(cur) and cur != os.path.dirname(cur):
        missing.append(cur)
        cur = os.path.dirname(cur)
    path = os.path.join(d, LOCK)
    try:
        os.makedirs(d, exist_ok=True)
        for _ in range(5):  # the file may be replaced between open and flock: hold the one the path names
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                return Problem(key, d, f"another process (pid {holder}) is planning or submitting into this dir "
                               f"right now ({LOCK} is locked): two plans in one dir would mix their files",
                               f"wait for pid {holder} to end (or stop it), then run the command again")
            now, _ = fs.stat(path, follow=False)
            if now is not None and (now.st_dev, now.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
                break
            os.close(fd)
        else:
            return Problem(key, d, f"{LOCK} kept being replaced while it was being locked",
                           f"{key}=<another directory>")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except (OSError, ValueError) as e:  # ValueError: a NUL byte
        why = "is a symbolic link" if getattr(e, "errno", None) == errno.ELOOP else \
            (getattr(e, "strerror", None) or str(e))
        return Problem(key, d, f"cannot lock the dir: {LOCK} {why}", f"{key}=<a writable directory of its own>")
    _held[d] = fd
    _created.extend(reversed(missing))
    return None


def release_all() -> None:
    """Every lock this process holds let go, its file removed (submitted: waiting on the job needs none, and the
    job's own requeue submits into the run dir). A process that opened the file before it went, and locks it
    after, sees it is no longer the file the path names and opens the path again (take)."""
    while _held:
        d, fd = _held.popitem()
        try:
            os.unlink(os.path.join(d, LOCK))
        except OSError:
            pass
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


@atexit.register
def _tidy() -> None:
    """At exit: the locks let go, then the dirs created only to be locked (the plan was refused after) removed,
    innermost first."""
    release_all()
    for d in reversed(_created):
        try:
            os.rmdir(d)
        except OSError:
            pass

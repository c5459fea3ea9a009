"""Questions about a path that never raise: is it a file, a dir, a link, there at all, and if not, why.

Paths reach the project from users (data files, checkpoints, run dirs) and can be anything a string can be: a
name longer than the filesystem takes, a NUL byte, a dir that cannot be read, `~nosuchuser`. `pathlib.Path.is_file()`
and the other pathlib probes raise on some of these (`OSError: File name too long`, `ValueError: embedded null
byte`; `Path.expanduser()` a RuntimeError); a plan must answer "not there, because ..." instead. The probes that
raise (pathlib's, `os.stat`, `os.access`, `os.path.getsize`/`getmtime`, ...) are called here and nowhere else in
`vrun/` (tests/test_structure.py holds it so); `os.path.exists`/`isfile`/`isdir`/`islink` and
`os.path.expanduser`, which never raise, stay usable anywhere.
"""
from __future__ import annotations

import os
import stat as _stat
from typing import Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


def stat(path: PathLike, follow: bool = True) -> tuple[Optional[os.stat_result], Optional[str]]:
    """(the stat, None), or (None, why not) in the OS's words ("No such file or directory", "File name too long",
    "embedded null byte"). follow=False: the link itself, not what it points at."""
    try:
        return os.stat(os.fspath(path), follow_symlinks=follow), None
    except OSError as e:
        return None, e.strerror or str(e)
    except (ValueError, TypeError) as e:
        return None, str(e)


def exists(path: PathLike) -> bool:
    return stat(path)[0] is not None


def is_file(path: PathLike) -> bool:
    st = stat(path)[0]
    return st is not None and _stat.S_ISREG(st.st_mode)


def is_dir(path: PathLike) -> bool:
    st = stat(path)[0]
    return st is not None and _stat.S_ISDIR(st.st_mode)


def is_link(path: PathLike) -> bool:
    st = stat(path, follow=False)[0]
    return st is not None and _stat.S_ISLNK(st.st_mode)


def mtime(path: PathLike) -> Optional[float]:
    st = stat(path)[0]
    return None if st is None else st.st_mtime


def missing(path: PathLike) -> Optional[str]:
    """None when the path is there; else why not ("no such file", or the OS's reason when it is another)."""
    st, why = stat(path)
    if st is not None:
        return None
    return "no such file" if why == os.strerror(2) else why


def readable(path: PathLike) -> bool:
    try:
        return os.access(os.fspath(path), os.R_OK)
    except (OSError, ValueError, TypeError):
        return False


def read_small(path: PathLike, limit: int = 1 << 20) -> Optional[str]:
    """The text of a regular file of at most `limit` bytes; None for anything else (missing, a FIFO or device,
    too large, unreadable). Never blocks, never raises."""
    import stat as st

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError, TypeError):
        return None
    try:
        info = os.fstat(fd)
        if not st.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = os.read(fd, limit + 1)
        return None if len(data) > limit else data.decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


# a KubeRay pod running as a site's uid, not the planner's: the planner's uid, whose run dir files it trusts as its
# own (vrun.launch.kuberay sets it in the job's env; nowhere else sets it)
TRUST_UID_ENV = "VRUN_TRUST_UID"


def untrusted(info: os.stat_result) -> Optional[str]:
    """Why a file or dir is not the user's own to trust (owned by another user, or writable by others), or None. What
    the project reads back from the state dir or a run dir is trusted no more than the command line: another user's
    or a world-writable file could say anything (a group-writable one is the user's umask, not a stranger)."""
    if hasattr(os, "getuid") and info.st_uid != os.getuid() and str(info.st_uid) != os.environ.get(TRUST_UID_ENV):
        return f"owned by uid {info.st_uid}, not by this user ({os.getuid()})"
    if info.st_mode & _stat.S_IWOTH:
        return f"writable by every user (mode {_stat.S_IMODE(info.st_mode):o})"
    return None


def read_checked(path: PathLike, limit: int = 1 << 20, own: bool = False, binary: bool = False,
                 tail: bool = False) -> tuple[Optional[Union[str, bytes]], Optional[str]]:
    """(the content, None), or (None, why not): "no such file" when it is not there, else the reason it was refused
    ("a FIFO, not a regular file", "larger than 1048576 bytes", "a symbolic link", "owned by uid 65534 ...").
    Regular files only, opened without blocking (a FIFO or device is refused, never waited on) and read up to
    `limit` bytes; tail=True reads the last `limit` bytes of a larger file instead of refusing it. own=True (files
    in the state dir and run dirs): a link is refused, and so is a file owned by another user or writable by
    others, and one in such a dir. Never raises."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (getattr(os, "O_NOFOLLOW", 0) if own else 0)
    try:
        fd = os.open(os.fspath(path), flags)
    except OSError as e:
        if e.errno == 2:
            return None, "no such file"
        if own and is_link(path):
            return None, "a symbolic link (the project writes none there)"
        return None, e.strerror or str(e)
    except (ValueError, TypeError) as e:
        return None, str(e)
    try:
        info = os.fstat(fd)
        if not _stat.S_ISREG(info.st_mode):
            return None, f"{_kind(info.st_mode)}, not a regular file"
        if own:
            why = untrusted(info)
            parent = stat(os.path.dirname(os.path.abspath(os.fspath(path))))[0]
            why = why or (parent is not None and untrusted(parent) and f"in a dir {untrusted(parent)}") or None
            if why:
                return None, why
        if info.st_size > limit:
            if not tail:
                return None, f"larger than {limit} bytes ({info.st_size})"
            os.lseek(fd, info.st_size - limit, os.SEEK_SET)
        chunks, left = [], limit + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > limit:
            if not tail:
                return None, f"larger than {limit} bytes"
            data = data[-limit:]
        return (data if binary else data.decode("utf-8", errors="replace")), None
    except OSError as e:
        return None, e.strerror or str(e)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((_stat.S_ISFIFO, "a FIFO"), (_stat.S_ISCHR, "a character device"),
                       (_stat.S_ISBLK, "a block device"), (_stat.S_ISSOCK, "a socket"), (_stat.S_ISDIR, "a dir")):
        if test(mode):
            return name
    return "not a file"


_SAID: set = set()


def ignored(path: PathLike, why: str, then: str, fix: Optional[str] = None) -> None:
    """Say once per process, on one line to stderr, that a file the project reads back was ignored and why."""
    import sys

    line = f"warning: file={path}: {why}; ignored ({then}); fix: {fix or f'remove it (rm {path})'}"
    if line not in _SAID:
        _SAID.add(line)
        print(line.replace("\n", "\\n"), file=sys.stderr)

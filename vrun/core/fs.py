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

"""A short content hash of a set of files: the fingerprint of verl's config tree and of verl_mlite's config groups
(what a plan was composed against) and the key of the composed verl tree kept in the state dir.

Hashed once per process for the same files unchanged (path, size, mtime): a sweep records the stack at every point.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from vrun.core import fs


def files(root: Path, paths: list[Path], parsed: bool = False) -> str:
    """16 hex digits over the files' paths relative to root and their contents (parsed: their YAML content, so
    comments and layout do not count)."""
    stats = []
    for f in paths:
        st, why = fs.stat(f)
        if st is None:
            raise OSError(f"{f}: {why}")
        stats.append((str(f), st.st_size, st.st_mtime_ns))
    return _hash(str(root), tuple(stats), parsed)


@functools.lru_cache(maxsize=16)
def _hash(root: str, stats: tuple, parsed: bool) -> str:
    import json

    import yaml

    h = hashlib.sha256()
    for name, _, _ in stats:
        f = Path(name)
        body = json.dumps(yaml.safe_load(f.read_text()), sort_keys=True).encode() if parsed else f.read_bytes()
        h.update(str(f.relative_to(root)).encode() + b"\0" + body + b"\0")
    return h.hexdigest()[:16]

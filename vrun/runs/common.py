"""What every verb of `python -m vrun` shares: the one-line usage error, one run read back, durations."""
from __future__ import annotations

from vrun.rundir import state


class Usage(Exception):
    """A one-line error for the user (already formatted)."""


def one_run(path: str) -> state.Run:
    ps = state.points(path)
    if len(ps) != 1:
        raise Usage(f"error: run={path}: a sweep dir of {len(ps)} runs; fix: give one of its run dirs "
                    f"(python -m vrun runs {path} lists them)")
    r = state.load(ps[0])
    state.refresh([r])
    return r

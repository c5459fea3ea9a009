"""A run's slow phases read back from its events: the watchdog records `slow` when a phase turns slow (progress
continues: vrun.launch.phases) and `slow_over` when it is back within; a phase is slow now when its last `slow` of
the attempt was not followed by its `slow_over`. Standard library only."""
from __future__ import annotations

# the most slow phases a run names (a step has six)
SHOWN = 6


def active(events: list) -> list:
    """The `slow` events still in force, one per phase, in the order they were recorded (events: one attempt's)."""
    now: dict = {}
    for e in events:
        phase = e.get("phase")
        if not isinstance(phase, str):
            continue
        if e.get("event") == "slow":
            now.pop(phase, None)
            now[phase] = e
        elif e.get("event") == "slow_over":
            now.pop(phase, None)
    return list(now.values())[-SHOWN:]


# a summary read back is said up to this many characters (the watchdog writes about 60)
LINE_CHARS = 200


def line(e: dict) -> str:
    """`sync 4.1× its band, growing over the last 20 steps (since step 312)` (the event is read back: a summary or
    phase that is no string is not said, a long one is cut)."""
    step, said = e.get("step"), e.get("summary")
    said = said if isinstance(said, str) and said else e.get("phase") if isinstance(e.get("phase"), str) else "a phase"
    said = said if len(said) <= LINE_CHARS else said[:LINE_CHARS - 1] + "…"
    whole = isinstance(step, int) and not isinstance(step, bool)
    return said + (f" (since step {step})" if whole else "")

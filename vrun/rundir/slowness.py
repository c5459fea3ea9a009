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


def line(e: dict) -> str:
    """`sync 4.1× its band, growing over the last 20 steps (since step 312)`."""
    step = e.get("step")
    return f"{e.get('summary') or e.get('phase')}" + (f" (since step {step})" if isinstance(step, int) else "")

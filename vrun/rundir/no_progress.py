"""Restarts that make no progress stop, and a resume that ends after no step is no completion.

A run is restarted from its last whole checkpoint (SLURM's requeue on a node failure or a preemption, the job's own
at its time limit, a stall's requeue, a Ray job submitted again). Each training attempt records where it started:
its `resumed` event holds the whole checkpoint step it loaded (None: step 0). An attempt made progress when the
next one started from a newer whole checkpoint (or, for the last one, when a newer one is there now). When
cluster.no_progress_attempts attempts in a row ended without, whatever ended each, the run is stopped where the next
attempt would start: one `stopped` event with one line (`3 attempts in a row ended before step 312's checkpoint;
stopped`). A `stopped` event starts the count afresh: a run submitted again by hand after it gets as many attempts.

A training attempt that exits 0 after resuming and printed no verl step line did nothing: it is a failure (`exited 0
after 0 steps`), not a completion, unless the checkpoint it resumed from already holds the run's last step, or verl's
console logger is off (no step line can be seen then). Standard library only: the job's node imports this.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

KNOB = "cluster.no_progress_attempts"
STOPPED = "stopped"


def _step(v) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


@dataclass(frozen=True)
class Stop:
    """The rule's verdict: `attempts` in a row ended without a checkpoint newer than `step` (None: none yet)."""
    attempts: int
    step: Optional[int]
    next_save: Optional[int]   # the step whose save none of them reached, where the save period is known
    limit: int

    def line(self) -> str:
        if self.next_save is not None:
            where = f"before step {self.next_save:,}'s checkpoint"
        elif self.step is not None:
            where = f"without a checkpoint newer than step {self.step:,}'s"
        else:
            where = "before the first checkpoint"
        last = f"the last whole one: step {self.step:,}" if self.step is not None else "no whole checkpoint yet"
        n = f"{self.attempts} attempts in a row" if self.attempts != 1 else "1 attempt"
        return (f"{n} ended {where}; stopped ({last}; {KNOB}={self.limit}; fix: see why "
                "in python -m vrun status, then python -m vrun resubmit)")

    def fields(self) -> dict:
        """The `stopped` event's fields."""
        return {"why": self.line(), "attempts": self.attempts, "step": self.step, "limit": self.limit}


def streak(starts: list, now: Optional[int]) -> int:
    """Attempts, counted back from the last, that ended without a newer whole checkpoint. starts: the whole step each
    attempt started from (None: step 0), in order; now: the newest whole step after the last one ended."""
    ends = list(starts[1:]) + [now]
    n = 0
    for s, e in zip(reversed(starts), reversed(ends)):
        if (_step(e) or 0) > (_step(s) or 0):
            break
        n += 1
    return n


def starts_of(events: Iterable[dict]) -> list:
    """The whole step each training attempt started from (its `resumed` event), since the rule last stopped the run."""
    out: list = []
    for e in events:
        if e.get("event") == STOPPED:
            out = []
        elif e.get("event") == "resumed":
            out.append(_step(e.get("step")))
    return out


def next_save(step: Optional[int], save_freq: Optional[int]) -> Optional[int]:
    """The first periodic save after `step` (verl saves at every multiple of trainer.save_freq)."""
    if save_freq is None or save_freq <= 0:
        return None
    return ((step or 0) // save_freq + 1) * save_freq


def judge(events: Iterable[dict], now: Optional[int], limit: int, save_freq: Optional[int] = None) -> Optional[Stop]:
    """Whether the next attempt must not start: a Stop when `limit` (> 0) attempts in a row ended without a newer
    whole checkpoint than `now`'s predecessors, None otherwise (and always when limit is 0: the rule is off)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        return None
    n = streak(starts_of(events), now)
    if n < limit:
        return None
    return Stop(n, _step(now), next_save(_step(now), save_freq), limit)


def before_restart(run_dir, plan, limit: int) -> Optional[Stop]:
    """Where a restart is decided (a stall's requeue): the rule over the run's events with the newest whole
    checkpoint there now (read only: vrun.rundir.checkpoints.decide)."""
    from vrun.rundir import checkpoints, records

    if limit <= 0:  # the rule turned off (cluster.no_progress_attempts=0)
        return None
    now = checkpoints.decide(Path(run_dir) / "checkpoints", plan, bool(getattr(plan, "resume_mesh_change", False))).step
    return judge(records.events(str(run_dir)), now, limit, save_freq_of(plan))


# ------------------------------------------------------------------------------------------ verl's values in the plan
def verl_value(plan, key: str) -> Optional[str]:
    """The value the plan gives verl for `key` (its override list; the last one wins), as written; None: verl's
    default."""
    found = None
    for o in getattr(plan, "verl_overrides", None) or []:
        k, sep, v = str(o).lstrip("+~").partition("=")
        if sep and k == key:
            found = v
    return found


def save_freq_of(plan) -> Optional[int]:
    v = verl_value(plan, "trainer.save_freq")
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def console_on(plan) -> bool:
    """verl prints its step lines (the console logger: in verl's default loggers, and in any list naming it)."""
    v = verl_value(plan, "trainer.logger")
    return v is None or "console" in v


def total_steps(plan) -> Optional[int]:
    """The run's last step where the plan knows it (trainer.total_training_steps, or the data's rows)."""
    c = getattr(plan, "cost", None) or {}
    n, source = c.get("steps"), str(c.get("steps_from") or "")
    return n if _step(n) and not source.startswith("per 100") else None


# ------------------------------------------------------------------------------------------ a resume that does nothing
def zero_steps(resumed_step: Optional[int], steps_seen: Iterable[int], console: bool,
               total: Optional[int]) -> Optional[str]:
    """Why an attempt that exited 0 after resuming from a checkpoint is a failure (None: it is a completion; an
    attempt that started from step 0 is not a resume: a trainer that prints no step line, a probe, is its own
    judge). Pure."""
    if not console or resumed_step is None:
        return None
    if total is not None and resumed_step is not None and resumed_step >= total:
        return None  # resumed at the run's last step: nothing was left to do
    if any(s > (resumed_step or 0) for s in steps_seen):
        return None
    start = f"resumed from global_step_{resumed_step}"
    of = f" of {total:,}" if total is not None else ""
    return (f"exited 0 after 0 steps ({start}{of}, no verl step line after it): a resume that trains nothing is not a "
            "completion")


def settle_zero_steps(run, paths_of: Callable) -> None:
    """A run read back (vrun.rundir.state.Run): each attempt that ended `completed` after resuming is read from its
    own log (paths_of(attempt) → its files; a log appended across attempts from the attempt's marker on) and made a
    failure when it printed no step past its checkpoint."""
    from vrun.rundir import joblog
    from vrun.rundir.cause import tail_lines

    if getattr(run.plan, "mode", "train") != "train":
        return
    console, total = console_on(run.plan), total_steps(run.plan)
    for a in run.attempts:
        resumed = a.last("resumed")
        if a.state != "completed" or resumed is None:
            continue
        files = [Path(p) for p in paths_of(a)]
        lines = tail_lines(files, a.key if getattr(run, "on_slurm", False) else None, joblog.LOG_TAIL)
        steps = [s for s, v in (joblog.parse_line(x) or (None, None) for x in lines) if s is not None and v]
        why = zero_steps(_step(resumed.get("step")), steps, console, total)
        if why:
            a.state, a.phase = "failed", why
            a.end = why
            a.failure = {"node": a.host or (a.hosts[0] if a.hosts else "node 0"), "error": why, "t": a.ended}

"""A bound for each phase of a step, from the plan and then from the run; and when a phase that keeps finishing is
`slow`. Pure arithmetic: the plan's phase bands in (plan.json `time.phases`), bounds out (plan.json `watch.phases`);
the run's own durations (verl's timing_s/<name> per step) in, a bound or a verdict out.

From the plan (`plan_bounds`): a phase's bound is max(PHASE_FLOOR_S, PHASE_FACTOR × its band's high end), the save's
PHASE_FACTOR × the save estimate (vrun.estimate.timelimit.save_seconds). PHASE_FACTOR is the whole step's factor
(vrun.planning.watch.STALL_FACTOR): a phase at three times its pessimistic end is stuck, not slow, for the same reason
a step is. PHASE_FLOOR_S holds what no band models and every phase pays: Ray's dispatch of the method to every worker,
a collective's communicator built on its first call (the weight sync's NCCL group is built each step on the NCCL
checkpoint engine: seconds to tens of seconds at hundreds of ranks), a garbage collector's pause, and the state API's
own view, which lags by its poll. On `make run`'s plan (GLM-5.1 on 256 GPUs) the weight sync's bound is 5 min
against the whole step's 28 min.

From the run (`run_bound`): once MIN_STEPS steps past the attempt's WARMUP_STEPS (the model load, the engine's CUDA
graphs, the first refit) were measured, the bound is max(the plan's bound, RUN_FACTOR × this run's median): a run
slower than its plan everywhere is not stalled everywhere, and the plan's bound stays the floor.

Slow (`slow`): a phase that finished in SLOW_FACTOR times both its band's high end and this run's median of the
phases before it (MIN_STEPS of them at least) — progress continues, so it is not a stall, but a weight sync growing
from seconds to minutes is worth a line. `trend` says which way the last TREND_STEPS went.
"""
from __future__ import annotations

import math
import statistics
from typing import Optional

from vrun.core.units import clock
from vrun.rundir.record import PhaseBound

PHASE_FACTOR = 3.0
PHASE_FLOOR_S = 60.0
RUN_FACTOR = 3.0
WARMUP_STEPS = 2
MIN_STEPS = 3
SLOW_FACTOR = 3.0
TREND_STEPS = 20
# a trend: the later half's median over the earlier half's beyond this ratio is growing (below its inverse: easing)
TREND_RATIO = 1.25

# the plan's phases, in step order, as the watch names them; `save` is the checkpoint's
WORDS = {"rollout": "rollout", "log_prob": "log-prob", "train": "train", "sync": "weight sync",
         "offload": "offload", "save": "save"}
# verl's timer (timing_s/<key>) that measures each phase (ray_trainer.fit's marked_timer names; the log-prob phase is
# the old policy's and the reference's, each timed on its own; offload has no timer of its own: it is inside gen)
TIMERS = {"rollout": ("gen",), "log_prob": ("old_log_prob", "ref"), "train": ("update_actor",),
          "sync": ("update_weights",), "save": ("save_checkpoint",)}


def plan_bounds(bands: dict, save_s: Optional[float], factor: float = PHASE_FACTOR,
                floor: float = PHASE_FLOOR_S) -> dict:
    """{phase: PhaseBound} from {phase: (low_s, high_s)} (the plan's bands, scaled as the plan reports them) and the
    save estimate (None: no save bound). A phase with no time at all (high end 0: not in this step) gets none."""
    out = {}
    for name in WORDS:  # in step order
        if name not in bands:
            continue
        low, high = bands[name]
        if not finite(high) or high <= 0:
            continue
        bound = max(floor, factor * high)
        why = f"{factor:g} × the high end" if bound > floor else "the floor"
        out[name] = PhaseBound(bound_s=round(bound, 1), low_s=round(max(low, 0.0), 2), high_s=round(high, 2),
                               basis=why)
    if save_s is not None and finite(save_s) and save_s > 0:
        bound = max(floor, factor * save_s)
        out["save"] = PhaseBound(bound_s=round(bound, 1), low_s=0.0, high_s=round(save_s, 1),
                                 basis=f"{factor:g} × the save estimate" if bound > floor else "the floor")
    return out


def measured(durations: list) -> list:
    """A phase's durations past the attempt's warm-up (durations: in step order, this attempt's)."""
    return [d for d in durations[WARMUP_STEPS:] if finite(d) and d >= 0]


def median(durations: list) -> Optional[float]:
    """This run's median for a phase (warm-up excluded), None before MIN_STEPS were measured."""
    got = measured(durations)
    return statistics.median(got) if len(got) >= MIN_STEPS else None


def run_bound(plan_bound: Optional[float], durations: list, factor: float = RUN_FACTOR,
              floor: float = PHASE_FLOOR_S) -> Optional[float]:
    """The bound in force: the plan's until the run measured enough, then max(the plan's, factor × the median);
    a phase the plan has no band for is bounded by the run alone (never under the floor)."""
    m = median(durations)
    if m is None:
        return plan_bound
    return max(floor, factor * m) if plan_bound is None else max(plan_bound, factor * m)


def slow(duration: float, band_high: Optional[float], before: list,
         factor: float = SLOW_FACTOR) -> Optional[float]:
    """The phase's ratio to its band's high end (to this run's median where it has no band) when this duration is
    `factor` times both, else None. before: the phase's durations of this attempt's earlier steps."""
    m = median(before)
    if m is None or not finite(duration) or duration < factor * m or m <= 0:
        return None
    if band_high is not None and finite(band_high) and band_high > 0:
        return duration / band_high if duration >= factor * band_high else None
    return duration / m


def trend(durations: list, steps: int = TREND_STEPS) -> str:
    """Which way the phase went over its last `steps` durations: `growing`, `easing` or `steady` (the later half's
    median against the earlier half's)."""
    last = [d for d in durations[-steps:] if finite(d)]
    if len(last) < 4:
        return "steady"
    half = len(last) // 2
    a, b = statistics.median(last[:half]), statistics.median(last[half:])
    if a > 0 and b / a >= TREND_RATIO:
        return "growing"
    if b > 0 and a / b >= TREND_RATIO:
        return "easing"
    return "steady"


def slow_line(phase: str, ratio: float, has_band: bool, direction: str, n: int) -> str:
    """`sync 4.1× its band, growing over the last 20 steps`."""
    what = "its band" if has_band else "this run's median"
    return f"{phase} {ratio:.1f}× {what}, {direction} over the last {n} steps"


def watch_line(bounds: dict) -> str:
    """The plan's `watch` row's phase part: `weight sync 5 min (plan 21–105 s)`, in step order."""
    parts = []
    for name, b in bounds.items():
        band = f"estimate {band_text(0.0, b.high_s)}" if name == "save" else f"plan {band_text(b.low_s, b.high_s)}"
        parts.append(f"{WORDS.get(name, name)} {duration(b.bound_s)} ({band})")
    return ", ".join(parts)


def duration(s: float) -> str:
    """A measured or bounding time: whole seconds from 10 s on (`321 s` is `5 min`)."""
    return clock(round(s) if s >= 10 else round(s, 1))


def band_text(low: float, high: float) -> str:
    """`21–105 s` (a save's: `105 s`)."""
    return f"{_n(low)}–{_n(high)} s" if low > 0 else f"{_n(high)} s"


def _n(x: float) -> str:
    return f"{x:.2g}" if x < 10 else f"{x:,.0f}"


def finite(x) -> bool:
    """A real number, not a bool, not NaN or infinite (a value read back from plan.json or a log)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

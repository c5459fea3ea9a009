"""A run's own ETA and cost: where it is (step N of the total), what each phase measured beside the plan's band, when
the last step comes, the GPU-hours spent and projected to the end, and where this attempt's time limit falls on the
pace it keeps (`on this pace the limit ends at step 1,410 of 2,000; the last save before it at 1,400`).

`project` is the arithmetic alone (pure: figures in, an Outlook out); `of` feeds it from a run read back — plan.json
(the step band, the phases' bands, the total steps, the time limit, trainer.save_freq), verl's step lines in the
job's output (vrun.rundir.joblog) and the attempts' start and end times (vrun.rundir.state). Nothing is written:
`status` and `runs` only read.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional

from vrun.core.units import elapsed
from vrun.rundir import joblog

# clusters whose attempts end at a time limit (cluster.time_min): a SLURM job, a Ray job's entry, a RayJob's deadline
LIMITED = ("slurm", "ray", "kuberay")
# an ETA further out than this is no time of day (and past what the platform's clock can print): the time left is said
ETA_MAX_S = 10 * 365 * 86400


@dataclass(frozen=True)
class Phase:
    """One phase of the step: its measured median beside the plan's band."""
    name: str
    measured_s: float
    low_s: Optional[float]
    high_s: Optional[float]

    @property
    def where(self) -> str:
        if self.low_s is None or self.high_s is None:
            return ""
        return "above" if self.measured_s > self.high_s else "below" if self.measured_s < self.low_s else "in"

    def words(self) -> str:
        if self.low_s is None or self.high_s is None:
            return f"{self.name} {_s(self.measured_s)} s (no band)"
        out = "" if self.where == "in" else f", {self.where} it"
        return f"{self.name} {_s(self.measured_s)} s (plan {_s(self.low_s)}–{_s(self.high_s)}{out})"


@dataclass(frozen=True)
class Outlook:
    step: Optional[int]                  # the last step verl printed
    total: Optional[int]                 # the run's last step, where the plan knows it
    pace_s: Optional[float]              # seconds per step ahead
    pace_from: str                       # "measured over N steps", "the plan's middle", ""
    remaining_s: Optional[float]         # seconds of training left (the steps to go at the pace)
    eta: Optional[float]                 # unix time of the last step (while the run is running)
    spent_gpu_h: float
    projected_gpu_h: Optional[float]     # spent + what the steps to go take
    limit_step: Optional[int] = None     # the step this attempt's time limit falls at on this pace
    limit_save: Optional[int] = None     # the last periodic save before it
    limit_left_s: Optional[float] = None  # seconds the last step comes before the limit (when it does)
    phases: tuple = field(default_factory=tuple)

    def summary(self) -> dict:
        return {"step": self.step, "total": self.total, "pace_s": _r(self.pace_s), "pace_from": self.pace_from,
                "remaining_s": _r(self.remaining_s), "eta": _r(self.eta), "spent_gpu_hours": round(self.spent_gpu_h, 3),
                "projected_gpu_hours": _r(self.projected_gpu_h, 3), "limit_step": self.limit_step,
                "limit_save": self.limit_save, "limit_left_s": _r(self.limit_left_s),
                "phases": {p.name: {"measured_s": _r(p.measured_s, 2), "low_s": p.low_s, "high_s": p.high_s,
                                    "where": p.where} for p in self.phases}}

    def progress_line(self, now: float) -> str:
        """`step 14 of 20 (70%), 6 to go at 61.7 s/step (measured over 13 steps): the last step ≈ 12:41:05 (in
        6m10s)`."""
        if self.step is None:
            head = "no step yet" + (f" of {self.total:,}" if self.total else "")
        elif self.total:
            head = f"step {self.step:,} of {self.total:,} ({100 * min(self.step / self.total, 1):.0f}%)"
        else:
            head = f"step {self.step:,} (the total is not in the plan: trainer.total_training_steps)"
        if not self.total or self.pace_s is None:
            return head
        left = max(self.total - (self.step or 0), 0)
        if left == 0:
            return head + ": the last step is done"
        tail = f", {left:,} to go at {_s(self.pace_s)} s/step ({self.pace_from})"
        if self.eta is not None:
            tail += f": the last step ≈ {_clock(self.eta, now)} (in {elapsed(self.eta - now)})"
        elif self.remaining_s is not None:
            tail += f": {elapsed(self.remaining_s)} of training left"
        return head + tail

    def cost_line(self) -> str:
        out = f"{self.spent_gpu_h:.2f} GPU-hours spent"
        if self.projected_gpu_h is not None and self.total:
            out += f", {self.projected_gpu_h:.2f} projected to step {self.total:,}"
        return out

    def limit_line(self) -> Optional[str]:
        if self.limit_step is None:
            return None
        if self.limit_left_s is not None:
            return f"on this pace the last step ({self.total:,}) comes {elapsed(self.limit_left_s)} before the time limit"
        of = f" of {self.total:,}" if self.total else ""
        save = f"; the last save before it at {self.limit_save:,}" if self.limit_save else \
            "; no periodic save before it (trainer.save_freq)" if self.limit_save is None else "; no save before it"
        return f"on this pace the limit ends at step {self.limit_step:,}{of}{save}"


def _num(v) -> Optional[float]:
    """A figure read back (plan.json's open maps): a finite non-negative number, else None."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return float(v) if ok else None


def pace(step_times: list) -> Optional[float]:
    """Seconds per step: the mean of verl's step times (saves included), the first left out when there are three
    or more (the warm-up: compilation, the first rollout's start)."""
    xs = [x for x in (_num(v) for v in step_times) if x is not None]
    if len(xs) >= 3:
        xs = xs[1:]
    mean = sum(xs) / len(xs) if xs else 0.0
    return mean if mean > 0 else None  # steps of no time are no pace (nothing can be projected from them)


def project(*, step: Optional[int], total: Optional[int], step_times: list, plan_middle_s: Optional[float],
            gpus: int, spent_s: float, running: bool, now: float, attempt_started: Optional[float] = None,
            time_limit_s: Optional[float] = None, save_freq: Optional[int] = None,
            phases_measured: Optional[dict] = None, phases_plan: Optional[dict] = None) -> Outlook:
    """The arithmetic. step_times: verl's timing_s/step per step; spent_s: the attempts' seconds together;
    attempt_started / time_limit_s: the running attempt's start and its limit (None: no limit)."""
    measured = pace(step_times)
    n = len([x for x in step_times if _num(x) is not None])
    plan_middle_s, time_limit_s = _num(plan_middle_s), _num(time_limit_s)
    p, src = (measured, f"measured over {n} step{'s' if n != 1 else ''}") if measured is not None else \
        (plan_middle_s, "the plan's middle") if plan_middle_s else (None, "")
    left = max(total - (step or 0), 0) if total else None
    remaining = left * p if left is not None and p is not None else None
    spent_h = gpus * max(spent_s, 0.0) / 3600.0
    projected = spent_h + gpus * remaining / 3600.0 if remaining is not None else None
    eta = now + remaining if running and remaining is not None and remaining <= ETA_MAX_S else None
    limit_step = limit_save = limit_left = None
    if running and time_limit_s and attempt_started is not None and p:
        end = attempt_started + time_limit_s
        reach = (step or 0) + max(int((end - now) // p), 0)
        if total and reach >= total:
            limit_step, limit_left = total, max(end - now - (total - (step or 0)) * p, 0.0)
        else:
            limit_step = reach
            limit_save = (reach // save_freq) * save_freq if save_freq and save_freq > 0 else None
    rows = []
    for name, m in (phases_measured or {}).items():
        band = (phases_plan if isinstance(phases_plan, dict) else {}).get(name)
        band = band if isinstance(band, dict) else {}
        low, high = _num(band.get("low_s")), _num(band.get("high_s"))
        if _num(m) is not None:
            rows.append(Phase(name, float(m), low, high) if low is not None and high is not None and low <= high
                        else Phase(name, float(m), None, None))
    return Outlook(step, total, p, src, remaining, eta, spent_h, projected, limit_step, limit_save, limit_left,
                   tuple(rows))


def of(run, m: Optional[joblog.Measured] = None, now: Optional[float] = None) -> Outlook:
    """A run read back (vrun.rundir.state.Run) and its measured steps (vrun.planning.measured.of)."""
    from vrun.rundir import no_progress

    now = time.time() if now is None else now
    if m is None:
        from vrun.planning import measured

        m = measured.of(run)
    plan = run.plan
    t = plan.time if isinstance(plan.time, dict) else {}
    times = m.series("timing_s/step") or m.series("perf/time_per_step")
    phases = {}
    for name, keys in joblog.PHASES.items():
        vals = [m.median(k) for k in keys]
        if any(v is not None for v in vals):
            phases[name] = sum(v for v in vals if v is not None)
    cur = run.attempts[-1] if run.attempts else None
    limit = None
    if str(plan.cluster) in LIMITED:
        tm = _num((plan.cluster_group or {}).get("time_min"))
        limit = tm * 60 if tm else None
    return project(step=max(m.steps) if m.steps else None, total=no_progress.total_steps(plan), step_times=times,
                   plan_middle_s=t.get("step_middle_s"), gpus=run.gpus, spent_s=run.elapsed_s,
                   running=run.state == "running", now=now, attempt_started=cur.started if cur else None,
                   time_limit_s=limit, save_freq=no_progress.save_freq_of(plan), phases_measured=phases,
                   phases_plan=t.get("phases") or {})


def lines(o: Outlook, now: Optional[float] = None) -> list:
    """`status`'s lines."""
    now = time.time() if now is None else now
    out = [f"progress {o.progress_line(now)}"]
    if o.phases:
        out.append("phases   " + " · ".join(p.words() for p in o.phases))
    out.append(f"gpu-h    {o.cost_line()}")
    limit = o.limit_line()
    if limit:
        out.append(f"limit    {limit}")
    return out


def sweep_line(outlooks: list) -> Optional[str]:
    """`runs`'s last line over several runs: their GPU-hours spent and projected, summed."""
    if len(outlooks) < 2 or not any(o.spent_gpu_h > 0 for o in outlooks):
        return None
    spent = sum(o.spent_gpu_h for o in outlooks)
    known = [o for o in outlooks if o.projected_gpu_h is not None]
    proj = sum(o.projected_gpu_h for o in known) + sum(o.spent_gpu_h for o in outlooks if o.projected_gpu_h is None)
    tail = "" if len(known) == len(outlooks) else f" ({len(outlooks) - len(known)} without a total: their spent only)"
    return f"total    {len(outlooks)} runs: {spent:.2f} GPU-hours spent, {proj:.2f} projected to their last steps{tail}"


def _r(x: Optional[float], nd: int = 1) -> Optional[float]:
    return round(x, nd) if x is not None else None


def _s(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.0f}" if x >= 10 else f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def _clock(t: float, now: float) -> str:
    fmt = "%H:%M:%S" if t - now < 86400 else "%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(t))

"""Which phase of the step the job is in, and since when, from Ray's state API; each phase held to its bound
(vrun.planning.phase_bounds), and a phase that keeps finishing but slowly recorded as `slow`.

What the state API sees of verl: its single controller calls each worker group's methods as Ray actor tasks, so
every worker running one shows as a RUNNING actor task named `<class>.<method>` with its start time. The methods
each phase runs (verl's trainer fit() and its worker classes, the same in 0.9.1, a6ef5009 and 1dda039b):
generate_sequences (the agent loop's workers, the rollout; the rollout servers' generate), compute_log_prob and
compute_ref_log_prob (log-prob), update_actor and update_critic (train), update_weights and
execute_checkpoint_engine (the weight sync: the actors' and the rollout's checkpoint engine; the rollout servers'
wake_up, release_kv_cache and resume_kv_cache around it), sleep (offload) and save_checkpoint (save). A colocated
worker group runs one fused class whose methods carry their role's prefix (`actor_rollout_update_actor`,
`actor_rollout_ref_compute_ref_log_prob`): a method is known by its name or by `_<name>` at its end. Nothing in
verl is touched or wrapped. A cluster whose task events are off (RAY_enable_task_events=0) lists no task: the whole
step's bound alone holds there.

A frozen dashboard never holds the watchdog: a query runs in its own thread with the state API's timeout, one at a
time; while it has not answered the watch goes on with the whole step's bound alone (`RayPhases.look` is None).

Durations come from verl's own step lines (timing_s/<timer>, vrun.rundir.joblog): the run's median per phase, past
the attempt's warm-up, raises a bound (`PhaseWatch.bound`) and judges a phase `slow` (`PhaseWatch.feed`).
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from vrun.planning import phase_bounds as pb

STATE_TIMEOUT_S = 20        # each request to the state API
QUERY_EVERY_S = 5.0         # how often the running tasks are asked for
METHOD_CHARS = 100          # a method's name as a stall names it (the end of it; read from the cluster)
# verl's worker methods, by the phase they run in (the plan's phase names)
METHODS = {"generate_sequences": "rollout", "generate": "rollout",
           "compute_log_prob": "log_prob", "compute_ref_log_prob": "log_prob",
           "update_actor": "train", "update_critic": "train",
           "update_weights": "sync", "execute_checkpoint_engine": "sync", "wake_up": "sync",
           "release_kv_cache": "sync", "resume_kv_cache": "sync",
           "sleep": "offload", "save_checkpoint": "save"}


def phase_of(task_name: str) -> Optional[str]:
    """The phase an actor task runs in, from its name (`WorkerDict.actor_rollout_update_actor`,
    `Rank.update_weights`), else None."""
    method = str(task_name or "").rsplit(".", 1)[-1]
    if method in METHODS:
        return METHODS[method]
    ends = [m for m in METHODS if method.endswith("_" + m)]
    return METHODS[max(ends, key=len)] if ends else None


@dataclass(frozen=True)
class Running:
    """A phase some worker is in: since when (unix seconds, the earliest of its running tasks), the method."""
    phase: str
    since: float
    method: str
    tasks: int


def running(tasks: list) -> dict:
    """{phase: Running} from the state API's running tasks ((name, start unix seconds) pairs)."""
    out: dict = {}
    for name, start in tasks:
        phase = phase_of(name)
        if phase is None or not isinstance(start, (int, float)) or start <= 0:
            continue
        got = out.get(phase)
        if got is None or start < got.since:
            method = re.sub(r"[^A-Za-z0-9_]", "?", str(name).rsplit(".", 1)[-1])[-METHOD_CHARS:]  # said in lines
            out[phase] = Running(phase, float(start), method, (got.tasks if got else 0) + 1)
        else:
            out[phase] = Running(phase, got.since, got.method, got.tasks + 1)
    return out


def list_running(address: Optional[str], job_id: Optional[str], timeout_s: float = STATE_TIMEOUT_S) -> list:
    """The running actor tasks Ray's state API lists: (name, start unix seconds) pairs (this job's only where the
    cluster is shared: job_id, hex)."""
    from ray.util.state import list_tasks

    filters: list = [("state", "=", "RUNNING")]
    if job_id:
        filters.append(("job_id", "=", job_id))
    tasks = list_tasks(address=address, filters=filters, detail=True, limit=10000, timeout=int(timeout_s),
                       raise_on_missing_output=False)
    return [(t.name or t.func_or_class_name, (t.start_time_ms or 0) / 1000.0) for t in tasks
            if getattr(t, "type", "ACTOR_TASK") == "ACTOR_TASK"]


def ray_job_id() -> Optional[str]:
    """This process's Ray job (hex) once its driver connected (verl's run_ppo calls ray.init), else None."""
    import ray

    return ray.get_runtime_context().get_job_id() if ray.is_initialized() else None


class RayPhases:
    """The phases running now, asked of the state API in a thread of its own at most every QUERY_EVERY_S: `look`
    answers at once with the newest answer (None before the first, or once it is older than its query interval
    plus the timeout: a frozen dashboard)."""

    def __init__(self, address: Optional[str], job_id: Optional[Callable[[], Optional[str]]] = None,
                 query: Optional[Callable[[], list]] = None, clock=time.time):
        """address: the cluster's (a dashboard's http address, or a GCS address it is found from; None: the
        RAY_ADDRESS of this process); job_id: where the cluster is shared, this job's id (hex) when known (asked at
        each query: None then means nothing is asked yet)."""
        self.query = query or (lambda: self._list(address, job_id))
        self.clock = clock
        self.lock = threading.Lock()
        self.answer: Optional[dict] = None
        self.answered_at = 0.0
        self.asked_at = 0.0
        self.busy = False
        self.error = ""

    @staticmethod
    def _list(address: Optional[str], job_id: Optional[Callable[[], Optional[str]]]) -> Optional[list]:
        if job_id is None:
            return list_running(address, None)
        job = job_id()
        return list_running(address, job) if job else None

    def look(self) -> Optional[dict]:
        now = self.clock()
        with self.lock:
            if not self.busy and now - self.asked_at >= QUERY_EVERY_S:
                self.busy, self.asked_at = True, now
                threading.Thread(target=self._ask, name="vrun-phases", daemon=True).start()
            fresh = self.answer is not None and now - self.answered_at <= QUERY_EVERY_S + STATE_TIMEOUT_S
            return self.answer if fresh else None

    def _ask(self) -> None:
        try:
            tasks = self.query()
            got, error = (running(tasks) if tasks is not None else None), ""
        except Exception as e:  # noqa: BLE001 - the state API unreachable: the whole step's bound still holds
            got, error = None, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        with self.lock:
            self.busy = False
            if got is not None:
                self.answer, self.answered_at = got, self.clock()
            if error and error != self.error:
                print(f"vrun: watchdog: Ray's state API did not answer ({error[:200]}): the whole step's bound "
                      "holds", flush=True)
            self.error = error


@dataclass
class PhaseWatch:
    """Each phase's bound and this attempt's durations (verl's timers, per step), pure: fed step metrics, asked
    about the running phases. bounds: plan.json `watch.phases` ({phase: PhaseBound})."""
    bounds: dict
    durations: dict = field(default_factory=dict)     # phase -> [seconds per step], this attempt's
    slow_now: dict = field(default_factory=dict)      # phase -> steps since its `slow` was said, while slow

    def __post_init__(self):
        """Only bounds that can bound (plan.json is read back: a bound that is not a positive finite number of
        seconds, or a phase the watch does not know, is left out: that phase has the whole step's bound)."""
        self.bounds = {k: b for k, b in self.bounds.items() if k in pb.WORDS and pb.finite(b.bound_s)
                       and b.bound_s > 0}

    def feed(self, metrics: dict) -> list:
        """One step's metrics (joblog.parse_line's): each phase's duration kept; returns the `slow` verdicts
        [(phase, ratio, line)] of phases that turned slow at this step, and [(phase, None, "")] of those back
        within (a phase still slow is said again every TREND_STEPS steps, with its trend then)."""
        out = []
        for phase, timers in pb.TIMERS.items():
            got = [metrics[f"timing_s/{k}"] for k in timers if f"timing_s/{k}" in metrics]
            if not got:
                continue
            d = float(sum(got))
            before = self.durations.setdefault(phase, [])
            band = self.bounds.get(phase)
            ratio = pb.slow(d, band.high_s if band is not None else None, before)
            before.append(d)
            said = self.slow_now.get(phase)
            if ratio is not None and (said is None or said >= pb.TREND_STEPS):
                n = min(len(pb.measured(before)), pb.TREND_STEPS)
                line = pb.slow_line(pb.WORDS.get(phase, phase), ratio, band is not None,
                                    pb.trend(pb.measured(before)), n)
                out.append((phase, round(ratio, 2), line))
                said = 0
            elif ratio is None and said is not None:
                out.append((phase, None, ""))
            if ratio is not None:
                self.slow_now[phase] = said + 1
            else:
                self.slow_now.pop(phase, None)
        return out

    def bound(self, phase: str) -> Optional[float]:
        plan = self.bounds.get(phase)
        return pb.run_bound(plan.bound_s if plan is not None else None, self.durations.get(phase, []))

    def stalled(self, now: float, phases: Optional[dict]) -> Optional[dict]:
        """The first running phase past its bound: {"phase", "quiet", "bound", "line", "method"}, else None."""
        for name, r in (phases or {}).items():
            bound = self.bound(name)
            quiet = now - r.since
            if bound is None or quiet <= bound:
                continue
            plan = self.bounds.get(name)
            m = pb.median(self.durations.get(name, []))
            said = []
            if plan is not None:
                said.append(f"plan {pb.band_text(plan.low_s, plan.high_s)}" if name != "save"
                            else f"save estimate {pb.band_text(0.0, plan.high_s)}")
            if m is not None:
                said.append(f"this run {pb.band_text(0.0, m)}")
            line = f"stalled in {pb.WORDS.get(name, name)} for {pb.duration(quiet)}" + (
                f" ({', '.join(said)})" if said else "") + f" in {r.method}, past its bound of {round(bound)} s"
            return {"phase": name, "quiet": quiet, "bound": round(bound, 1), "line": line, "method": r.method}
        return None

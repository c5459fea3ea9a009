"""Each phase's own bound and the slow state, as arithmetic (vrun.planning.phase_bounds), as the state API's running
tasks read (vrun.launch.phases) and inside the watchdog's loop on a real log file; the plan's `watch` row on
`make run`'s own plan. The same on a real Ray cluster: tests/test_phase_watch.py; on the SLURM harness:
tests/test_phase_watch_slurm.py."""
import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from vrun.launch import phases as ph
from vrun.launch.watchdog import Watchdog
from vrun.planning import phase_bounds as pb
from vrun.planning import watch as watching
from vrun.rundir import slowness
from vrun.rundir.record import PhaseBound, WatchRecord, typed

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

STEP = "(TaskRunner pid=1) step:{n} - timing_s/gen:1.0 - timing_s/old_log_prob:{lp} - timing_s/update_actor:2.0 - " \
       "timing_s/update_weights:{sync} - timing_s/step:5.0 - perf/throughput:10.0"


class Run:
    stall_after_s = None
    stall_grace_s = None
    on_stall = "cancel"


def test_plan_bounds_take_the_factor_or_the_floor_and_the_save_estimate():
    got = pb.plan_bounds({"rollout": (33.0, 97.0), "sync": (16.0, 107.0), "offload": (0.5, 1.8),
                          "log_prob": (0.0, 0.0), "nonsense": (1.0, 2.0)}, 425.0)
    assert list(got) == ["rollout", "sync", "offload", "save"]  # a phase with no time, and an unknown one, get none
    assert got["sync"] == PhaseBound(bound_s=321.0, low_s=16.0, high_s=107.0, basis="3 × the high end")
    assert got["offload"].bound_s == pb.PHASE_FLOOR_S and got["offload"].basis == "the floor"
    assert got["save"].bound_s == 1275.0 and got["save"].basis == "3 × the save estimate"
    assert pb.plan_bounds({"sync": (1.0, float("nan"))}, float("inf")) == {}
    # the policy: on make run's numbers the weight sync is bounded 5× below the whole step; stall_after_s rules all
    w = watching.policy(Run, 553.0, None, 32, bands={"sync": (16.08, 107.12), "train": (99.6, 280.3)}, save_s=425.1)
    assert w.stall_after_s == 1659.0 and w.phases["sync"].bound_s == 321.4
    assert w.stall_after_s / w.phases["sync"].bound_s >= 5
    row = watching.line(w)
    assert "each phase from an attempt's second step: train 14 min (plan 100–280 s), weight sync 5 min (plan " \
           "16–107 s), save 21 min (estimate 425 s), then 3 × this run's median where longer" in row, row

    class Given(Run):
        stall_after_s = 30

    w = watching.policy(Given, 553.0, None, 1, bands={"sync": (16.0, 107.0)}, save_s=400.0)
    assert w.phases == {} and "each phase" not in watching.line(w)


def test_an_old_watch_record_without_phases_still_loads():
    old = {"stall_after_s": 600.0, "first_step_s": 1200.0, "on_stall": "report", "grace_s": 600.0, "basis": "x"}
    assert typed(WatchRecord, old, "plan.json").phases == {}
    new = dict(old, phases={"sync": {"bound_s": 90.0, "low_s": 3.9, "high_s": 29.0, "basis": "3 × the high end"}})
    assert typed(WatchRecord, new, "plan.json").phases["sync"].bound_s == 90.0
    # a bound edited into nonsense bounds nothing (the whole step's bound holds), never stalls at once
    bad = {"sync": PhaseBound(bound_s=-5.0, low_s=0, high_s=1), "train": PhaseBound(float("nan"), 0, 1),
           "gpu": PhaseBound(5.0, 0, 1), "rollout": PhaseBound(float("inf"), 0, 1)}
    assert ph.PhaseWatch(bad).bounds == {}


def test_the_run_raises_a_bound_after_its_warm_up_never_below_the_plan():
    assert pb.run_bound(90.0, [50.0, 40.0, 30.0, 30.0]) == 90.0  # two measured past the warm-up: the plan's
    assert pb.run_bound(90.0, [50.0, 40.0, 30.0, 40.0, 35.0]) == 105.0  # 3 × the median 35
    assert pb.run_bound(900.0, [50.0, 40.0, 30.0, 40.0, 35.0]) == 900.0  # the plan's band is the floor
    assert pb.run_bound(None, [1, 1, 1, 1, 1]) == pb.PHASE_FLOOR_S  # no band: the run's own, never under the floor
    assert pb.run_bound(None, [1, 1]) is None


def test_slow_is_several_times_both_the_band_and_the_run():
    before = [9.0, 9.0, 4.0, 4.0, 5.0]  # median past the warm-up: 4
    assert pb.slow(20.0, 4.0, before) == 5.0  # 5× its band, 5× this run's median
    assert pb.slow(20.0, 10.0, before) is None  # twice its band: not slow
    assert pb.slow(11.0, 1.0, before) is None  # 11× its band but under 3× this run's median
    assert pb.slow(20.0, None, before) == 5.0  # no band: this run's median alone
    assert pb.slow(20.0, 4.0, before[:4]) is None  # too few measured steps to judge
    assert pb.trend([1.0] * 10 + [2.0] * 10) == "growing" and pb.trend([2.0] * 10 + [1.0] * 10) == "easing"
    assert pb.trend([1.0, 1.1, 0.9, 1.0]) == "steady" and pb.trend([1.0]) == "steady"
    assert pb.slow_line("sync", 4.1, True, "growing", 20) == "sync 4.1× its band, growing over the last 20 steps"


def test_verl_methods_map_to_phases_fused_prefixes_included():
    assert ph.phase_of("WorkerDict.actor_rollout_update_actor") == "train"
    assert ph.phase_of("WorkerDict.actor_rollout_ref_compute_ref_log_prob") == "log_prob"
    assert ph.phase_of("WorkerDict.actor_rollout_compute_log_prob") == "log_prob"
    assert ph.phase_of("Rank.actor_rollout_update_weights") == "sync"
    assert ph.phase_of("vLLMHttpServer.wake_up") == "sync" and ph.phase_of("vLLMHttpServer.sleep") == "offload"
    assert ph.phase_of("AgentLoopWorker.generate_sequences") == "rollout"
    assert ph.phase_of("WorkerDict.actor_rollout_save_checkpoint") == "save"
    assert ph.phase_of("TaskRunner.run") is None and ph.phase_of("WorkerDict.init_model") is None
    assert ph.phase_of("") is None and ph.phase_of(None) is None
    got = ph.running([("W.actor_rollout_update_weights", 100.0), ("W.actor_rollout_update_weights", 90.0),
                      ("W.update_actor", 0), ("TaskRunner.run", 5.0)])
    assert got == {"sync": ph.Running("sync", 90.0, "actor_rollout_update_weights", 2)}
    odd = ph.running([("W.\x1b[2J" + "x" * 300 + "_update_weights", 1.0)])["sync"].method
    assert odd.endswith("x_update_weights") and len(odd) == ph.METHOD_CHARS and "\x1b" not in odd


def test_a_stalled_phase_is_named_with_its_band_and_this_runs_median():
    w = ph.PhaseWatch({"sync": PhaseBound(bound_s=90.0, low_s=21.0, high_s=105.0)})
    for d in (60.0, 50.0, 48.0, 40.0, 48.0):
        w.feed({"timing_s/update_weights": d})
    running = {"sync": ph.Running("sync", 1000.0, "actor_rollout_update_weights", 8)}
    assert w.bound("sync") == 144.0  # 3 × this run's 48 s beats the plan's 90
    assert w.stalled(1000.0 + 144.0, running) is None
    got = w.stalled(1000.0 + 360.0, running)
    assert got["phase"] == "sync" and got["bound"] == 144.0
    assert got["line"] == "stalled in weight sync for 6 min (plan 21–105 s, this run 48 s) in " \
                          "actor_rollout_update_weights, past its bound of 144 s"


def test_slow_is_recorded_once_and_its_end_too():
    w = ph.PhaseWatch({"log_prob": PhaseBound(bound_s=60.0, low_s=1.6, high_s=4.0)})
    said = [w.feed({"timing_s/old_log_prob": d, "timing_s/ref": 0.0}) for d in (5, 5, 0.3, 0.3, 0.3, 20.0, 21.0, 0.3)]
    assert said[:5] == [[]] * 5 and said[6] == []
    assert said[5] == [("log_prob", 5.0, "log-prob 5.0× its band, growing over the last 4 steps")]
    assert said[7] == [("log_prob", None, "")]
    events = [{"event": "slow", "phase": "log_prob", "step": 6, "summary": said[5][0][2]},
              {"event": "slow", "phase": "sync", "step": 7, "summary": "weight sync 4.0× its band"},
              {"event": "slow_over", "phase": "log_prob", "step": 8}]
    assert [e["phase"] for e in slowness.active(events)] == ["sync"]
    assert slowness.line(events[1]) == "weight sync 4.0× its band (since step 7)"
    # read back from a file anyone could edit: no string, no whole step, a summary of 5,000 characters
    assert slowness.line({"phase": ["x"], "summary": 12, "step": 7.5}) == "a phase"
    assert slowness.line({"phase": "sync", "summary": None, "step": True}) == "sync"
    assert len(slowness.line({"summary": "y" * 5000, "step": 3})) == slowness.LINE_CHARS + len(" (since step 3)")


def test_a_frozen_dashboard_never_holds_the_watch(monkeypatch):
    """A real HTTP address whose server takes the connection and never answers: the query waits in its own thread;
    `look` answers at once (None: the whole step's bound holds) and asks no second time while one is out."""
    pytest.importorskip("ray.util.state")
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    try:
        rp = ph.RayPhases(f"http://127.0.0.1:{srv.getsockname()[1]}")
        t0 = time.monotonic()
        assert rp.look() is None and rp.busy
        assert rp.look() is None and time.monotonic() - t0 < 2.0
    finally:
        srv.close()
    calls = []
    rp = ph.RayPhases(None, query=lambda: calls.append(1) or [("W.actor_rollout_update_actor", 5.0)])
    rp.look()
    deadline = time.monotonic() + 10
    while rp.look() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rp.look() == {"train": ph.Running("train", 5.0, "actor_rollout_update_actor", 1)} and calls == [1]


class Seen:
    """The phases running, as RayPhases.look answers (what the state API listed: tests/test_phase_watch.py reads
    them from a real cluster)."""

    def __init__(self):
        self.now = None

    def look(self):
        return self.now


def test_the_watchdog_reports_a_phase_past_its_bound_and_a_slow_one(tmp_path):
    """A real log and loop: steps come well within the whole step's 10 minutes; log-prob turns slow at step 6
    (`slow`, no action); then the weight sync runs past its 1-second bound: `stalled` naming the phase, acted on
    after the grace as any stall."""
    log = tmp_path / "job.log"
    log.write_text("")
    seen, events, acted = Seen(), [], []
    w = WatchRecord(stall_after_s=600.0, first_step_s=1200.0, on_stall="cancel", grace_s=0.5, basis="test",
                    phases={"log_prob": PhaseBound(bound_s=60.0, low_s=1.6, high_s=4.0),
                            "sync": PhaseBound(bound_s=1.0, low_s=0.1, high_s=0.3)})
    dog = Watchdog(str(tmp_path), log, w, record=lambda e, **f: events.append((e, f)), collect=lambda n, out: None,
                   act=lambda *a: acted.append(a), poll_s=0.1, phases=seen)
    seen.now = {"sync": ph.Running("sync", time.time() - 30, "actor_rollout_update_weights", 8)}
    dog.tick()
    assert events == []  # before the attempt's first step: the whole step's bound alone
    with open(log, "a") as f:
        for n, lp in enumerate((0.3, 0.3, 0.3, 0.3, 0.3, 20.0), start=1):
            f.write(STEP.format(n=n, lp=lp, sync=0.2) + "\n")
    seen.now = {"sync": ph.Running("sync", time.time(), "actor_rollout_update_weights", 8)}
    dog.tick()
    assert [e for e, _ in events] == ["slow"] and events[0][1]["phase"] == "log_prob", events
    assert events[0][1]["summary"].startswith("log-prob 5.0× its band") and events[0][1]["step"] == 6
    dog.start()
    deadline = time.monotonic() + 30
    while not acted and time.monotonic() < deadline:
        time.sleep(0.1)
    dog.stop()
    dog.join(10)
    stalled = [f for e, f in events if e == "stalled"]
    assert len(stalled) == 1 and stalled[0]["phase"] == "sync" and stalled[0]["phase_bound_s"] == 1.0, events
    assert stalled[0]["summary"].startswith("stalled in weight sync for ") and \
        "(plan 0.1–0.3 s, this run 0.2 s) in actor_rollout_update_weights, past its bound of 1 s; stalled at " \
        "step 6 for " in \
        stalled[0]["summary"], stalled[0]["summary"]
    assert acted and acted[0][0] == "cancel" and acted[0][1] == stalled[0]["summary"]
    assert json.dumps(events)


def test_make_runs_plan_bounds_the_weight_sync_5x_below_the_step(tmp_path):
    """`make run`'s plan (GLM-5.1 GRPO on 256 GPUs): plan.json `watch.phases` and the printed row."""
    from conftest import PY, ROOT

    p = subprocess.run([PY, str(ROOT / "runner.py"), "model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan",
                        f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "VRUN_STATE_DIR": str(tmp_path / "state")})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    watch = json.loads((tmp_path / "run" / "plan.json").read_text())["watch"]
    assert set(watch["phases"]) >= {"rollout", "log_prob", "train", "sync", "save"}
    assert watch["stall_after_s"] / watch["phases"]["sync"]["bound_s"] >= 5, watch
    row = next(line for line in p.stdout.splitlines() if line.startswith("watch "))
    assert f"weight sync {pb.duration(watch['phases']['sync']['bound_s'])} (plan " in row, row
    assert Path(tmp_path / "run").is_dir()


def test_a_sync_growing_for_20_steps_is_said_again_with_its_trend():
    """A weight sync steady at 20 s, then growing by 30% a step: slow once it passes 3× both its band (105 s) and
    the run's median, said again every 20 steps while it stays slow, `growing` each time."""
    w = ph.PhaseWatch({"sync": PhaseBound(bound_s=321.0, low_s=16.0, high_s=105.0)})
    durations = [20.0] * 12 + [20.0 * 1.3 ** k for k in range(1, 40)]
    said = [(i + 1, got) for i, d in enumerate(durations) for got in w.feed({"timing_s/update_weights": d})]
    slow = [(step, line) for step, (_, ratio, line) in said if ratio is not None]
    assert len(slow) >= 2 and slow[1][0] - slow[0][0] == pb.TREND_STEPS, said
    first = slow[0][1]
    assert first.startswith("weight sync ") and "× its band, growing over the last 20 steps" in first, first

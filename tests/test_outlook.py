"""A run's own ETA and cost (vrun.runs.outlook.project): the arithmetic alone, figures in and an Outlook out."""
import pytest

from vrun.runs import outlook

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

NOW = 1_000_000.0


def test_pace_leaves_out_the_warm_up_and_keeps_the_saves():
    assert outlook.pace([]) is None
    assert outlook.pace([90.0]) == 90.0
    assert outlook.pace([90.0, 10.0]) == 50.0                 # two steps: both
    assert outlook.pace([90.0, 10.0, 10.0, 40.0]) == 20.0     # the first left out, the save step (40) kept
    assert outlook.pace([float("nan"), -1.0, 10.0]) == 10.0


def test_eta_and_gpu_hours_on_the_measured_pace():
    o = outlook.project(step=1_000, total=2_000, step_times=[120.0] + [60.0] * 10, plan_middle_s=40.0, gpus=256,
                        spent_s=20 * 3600.0, running=True, now=NOW)
    assert o.pace_s == 60.0 and o.pace_from == "measured over 11 steps"
    assert o.remaining_s == 1_000 * 60.0 and o.eta == NOW + 60_000.0
    assert o.spent_gpu_h == pytest.approx(256 * 20)
    assert o.projected_gpu_h == pytest.approx(256 * 20 + 256 * 60_000 / 3600)
    line = o.progress_line(NOW)
    assert line.startswith("step 1,000 of 2,000 (50%), 1,000 to go at 60 s/step (measured over 11 steps)"), line
    assert "(in 16h40m)" in line
    assert o.cost_line() == f"5120.00 GPU-hours spent, {256 * 20 + 256 * 60_000 / 3600:.2f} projected to step 2,000"


def test_without_a_measured_step_the_plans_middle_and_no_eta_once_ended():
    o = outlook.project(step=None, total=100, step_times=[], plan_middle_s=40.0, gpus=8, spent_s=0.0,
                        running=False, now=NOW)
    assert o.pace_s == 40.0 and o.pace_from == "the plan's middle" and o.eta is None
    assert o.projected_gpu_h == pytest.approx(8 * 100 * 40 / 3600)
    assert o.progress_line(NOW) == "no step yet of 100, 100 to go at 40 s/step (the plan's middle): 1h06m of " \
                                   "training left"
    unknown = outlook.project(step=7, total=None, step_times=[5.0], plan_middle_s=None, gpus=8, spent_s=60.0,
                              running=True, now=NOW)
    assert unknown.projected_gpu_h is None and unknown.eta is None
    assert unknown.progress_line(NOW).startswith("step 7 (the total is not in the plan")
    assert unknown.cost_line() == f"{8 * 60 / 3600:.2f} GPU-hours spent"


def test_the_time_limit_outlook():
    """An attempt of 240 min that started 2,400 s ago at step 0, 10 s a step: the limit falls at step 1,400."""
    kw = dict(total=2_000, step_times=[10.0] * 5, plan_middle_s=None, gpus=8, spent_s=2_400.0, running=True,
              now=NOW, attempt_started=NOW - 2_400, time_limit_s=240 * 60.0)
    o = outlook.project(step=200, save_freq=100, **kw)
    assert (o.limit_step, o.limit_save) == (200 + (240 * 60 - 2_400) // 10, 1_400)
    assert o.limit_line() == "on this pace the limit ends at step 1,400 of 2,000; the last save before it at 1,400"
    o = outlook.project(step=210, save_freq=None, **kw)
    assert o.limit_line().endswith("; no periodic save before it (trainer.save_freq)")
    o = outlook.project(step=210, save_freq=5_000, **kw)
    assert o.limit_line().endswith("; no save before it")
    fits = outlook.project(step=1_900, save_freq=100, **kw)
    assert fits.limit_step == 2_000 and fits.limit_left_s == pytest.approx(240 * 60 - 2_400 - 1_000)
    assert fits.limit_line() == "on this pace the last step (2,000) comes 3h03m before the time limit"
    ended = outlook.project(step=200, save_freq=100, **{**kw, "running": False})
    assert ended.limit_line() is None
    no_limit = outlook.project(step=200, save_freq=100, **{**kw, "time_limit_s": None})
    assert no_limit.limit_line() is None


def test_phases_beside_their_bands():
    o = outlook.project(step=3, total=None, step_times=[1.0], plan_middle_s=None, gpus=8, spent_s=1.0, running=False,
                        now=NOW, phases_measured={"rollout": 21.4, "sync": 48.0, "train": 2.0},
                        phases_plan={"rollout": {"low_s": 9.05, "high_s": 30.1}, "sync": {"low_s": 3.9, "high_s": 26.1},
                                     "train": {"low_s": 5.4, "high_s": 14.5}})
    assert [p.words() for p in o.phases] == ["rollout 21 s (plan 9.1–30)", "sync 48 s (plan 3.9–26, above it)",
                                             "train 2.0 s (plan 5.4–14, below it)"]
    assert o.summary()["phases"]["sync"]["where"] == "above"


def test_a_sweep_sums_spent_and_projected():
    a = outlook.project(step=10, total=20, step_times=[60.0] * 10, plan_middle_s=None, gpus=8, spent_s=3600.0,
                        running=True, now=NOW)
    b = outlook.project(step=5, total=None, step_times=[60.0] * 5, plan_middle_s=None, gpus=16, spent_s=1800.0,
                        running=True, now=NOW)
    assert outlook.sweep_line([a]) is None
    line = outlook.sweep_line([a, b])
    assert line == (f"total    2 runs: {8 + 8:.2f} GPU-hours spent, {8 + 8 * 600 / 3600 + 8:.2f} projected to their "
                    "last steps (1 without a total: their spent only)"), line


def test_figures_read_back_that_are_no_figures_are_left_out():
    """plan.json's open maps and a log's values as a hostile or older file may hold them: never a crash."""
    o = outlook.project(step=5, total=10, step_times=[True, "3", None, float("inf"), 2.0], plan_middle_s="x", gpus=8,
                        spent_s=60.0, running=True, now=NOW, attempt_started=NOW - 60, time_limit_s=float("inf"),
                        save_freq=2, phases_measured={"rollout": 1.0, "sync": float("nan"), "train": 3.0},
                        phases_plan={"rollout": "y", "train": {"low_s": 5, "high_s": 1}})
    assert o.pace_s == 2.0 and o.limit_step is None and o.eta == NOW + 10.0
    assert [p.words() for p in o.phases] == ["rollout 1.0 s (no band)", "train 3.0 s (no band)"]
    zero = outlook.project(step=5, total=10, step_times=[0.0, 0.0], plan_middle_s=None, gpus=8, spent_s=60.0,
                           running=True, now=NOW, attempt_started=NOW - 60, time_limit_s=600.0, save_freq=2)
    assert zero.limit_step is None and zero.remaining_s is None and zero.progress_line(NOW).startswith("step 5 of 10")
    huge = outlook.project(step=10 ** 30, total=10 ** 31, step_times=[1e6], plan_middle_s=None, gpus=2 ** 31 - 1,
                           spent_s=1e12, running=True, now=NOW)
    assert huge.eta is None and "step 1,000,000,000,000,000,000,000,000,000,000 of" in huge.progress_line(NOW)
    assert huge.progress_line(NOW).endswith("of training left")

"""Restarts that make no progress stop (vrun.rundir.no_progress): the rule over the attempts' `resumed` events and
the newest whole checkpoint, whatever ended each attempt; a resume that exits 0 after 0 steps is a failure."""
import pytest

from vrun.rundir import no_progress as rule

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml


def resumed(step):
    return {"event": "resumed", "t": 1.0, "step": step}


def test_streak_counts_attempts_back_to_the_last_that_saved():
    assert rule.streak([], None) == 0
    assert rule.streak([None], None) == 1                      # one attempt, no checkpoint yet
    assert rule.streak([None, None, None], None) == 3
    assert rule.streak([None, 20, 20, 20], 20) == 3            # the first reached step 20's save, the rest did not
    assert rule.streak([None, 20, 20, 20], 40) == 0            # the last one saved step 40: progress
    assert rule.streak([300, 312, 312], 312) == 2
    assert rule.streak([312, 300], 300) == 2                   # a newest checkpoint cut short (300 < 312): no progress


def test_judge_stops_at_the_knob_and_says_so_in_one_line():
    events = [resumed(300), resumed(312), resumed(312)]
    assert rule.judge(events, 312, 3, 12) is None              # two attempts in a row without progress, not three
    stop = rule.judge(events + [resumed(312)], 312, 3, 12)
    assert stop is not None and stop.attempts == 3
    line = stop.line()
    assert line.startswith("3 attempts in a row ended before step 324's checkpoint; stopped"), line
    assert "step 312" in line and "cluster.no_progress_attempts=3" in line and "\n" not in line
    assert rule.judge(events + [resumed(312)], 312, 0, 12) is None      # 0: the rule is off
    assert rule.judge(events + [resumed(312)], 312, True, 12) is None   # not a count
    none_yet = rule.judge([resumed(None)] * 3, None, 3, None)
    assert none_yet.line().startswith("3 attempts in a row ended before the first checkpoint; stopped"), none_yet
    assert rule.judge([resumed(None)], None, 1, 2).line().startswith("1 attempt ended before step 2's checkpoint")
    no_period = rule.judge([resumed(40)] * 3, 40, 3, -1)
    assert "without a checkpoint newer than step 40's" in no_period.line()


def test_a_stop_starts_the_count_afresh():
    """A run submitted again by hand after the rule stopped it gets as many attempts again."""
    events = [resumed(None)] * 3 + [{"event": "stopped", "t": 2.0}] + [resumed(None)]
    assert rule.starts_of(events) == [None]
    assert rule.judge(events, None, 3) is None
    assert rule.judge(events + [resumed(None), resumed(None)], None, 3) is not None


class Plan:
    def __init__(self, overrides, cost=None):
        self.verl_overrides = overrides
        self.cost = cost or {}
        self.mode = "train"


def test_the_plans_verl_values():
    p = Plan(["trainer.save_freq=20", "+trainer.logger=[wandb]", "trainer.save_freq=5"],
             {"steps": 200, "steps_from": "trainer.total_training_steps"})
    assert rule.save_freq_of(p) == 5 and not rule.console_on(p) and rule.total_steps(p) == 200
    q = Plan([], {"steps": 100, "steps_from": "per 100 steps (no trainer.total_training_steps)"})
    assert rule.save_freq_of(q) is None and rule.console_on(q) and rule.total_steps(q) is None
    assert rule.save_freq_of(Plan(["trainer.save_freq=${oops}"])) is None


def test_a_resume_that_trains_nothing_is_a_failure():
    why = rule.zero_steps(4, [1, 2, 3, 4], True, 100)
    assert why and why.startswith("exited 0 after 0 steps (resumed from global_step_4 of 100"), why
    assert rule.zero_steps(4, [1, 2, 3, 4, 5], True, 100) is None      # it trained step 5
    assert rule.zero_steps(100, [], True, 100) is None                 # already at the last step: nothing to do
    assert rule.zero_steps(4, [], False, 100) is None                  # no console logger: no step line to see
    assert rule.zero_steps(None, [], True, None) is None               # started from step 0: not a resume


# ------------------------------------------------------------------------------------------ read back by the verbs
@pytest.fixture
def run_dir(tmp_path):
    import json

    from conftest import record_json

    d = tmp_path / "run"
    d.mkdir()
    data = record_json(d, mode="train", cluster="slurm")
    data["verl_overrides"] = [*data.get("verl_overrides", []), "trainer.save_freq=4", "trainer.logger=[console]"]
    data["cost"] = {**(data.get("cost") or {}), "steps": 20, "steps_from": "trainer.total_training_steps"}
    (d / "plan.json").write_text(json.dumps(data))
    (d / "slurm_job.json").write_text(json.dumps({"job_id": "7", "folder": str(tmp_path / "sub" / "%j"),
                                                  "stdout": "x", "stderr": "y"}))
    return d


def _attempt(d, job, step, end="exited", **fields):
    from vrun.rundir import records

    records.record(str(d), "started", job_id=job, restart=0, attempt=0, hosts=["n0", "n1"])
    records.record(str(d), "resumed", job_id=job, restart=0, attempt=0, step=step)
    if end:
        records.record(str(d), end, job_id=job, restart=0, attempt=0, node=0, **fields)


def _log(d, job, text):
    from vrun.rundir.cause import marker

    folder = d.parent / "sub" / job
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{job}_0_log.out").write_text(marker(job, 0, "n0") + "\n" + text)


def test_a_stopped_run_is_failed_with_its_line_in_status_and_runs(run_dir, capsys):
    from vrun.rundir import records, state
    from vrun.runs import cli

    for job in ("7", "8", "9"):
        _attempt(run_dir, job, None, end="failed", error="boom")
    stop = rule.judge(records.events(str(run_dir)), None, 3, 4)
    records.record(str(run_dir), "stopped", job_id="9", restart=0, attempt=0, node=0, **stop.fields())
    r = state.load(run_dir)
    assert r.state == "failed" and r.phase.startswith("3 attempts in a row ended before step 4's checkpoint; stopped")
    assert state.describe(r).startswith("failed: 3 attempts in a row"), state.describe(r)
    assert cli.main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "state    failed: 3 attempts in a row ended before step 4's checkpoint; stopped" in out, out
    assert cli.main(["runs", str(run_dir)]) == 0
    assert "↳ failed: 3 attempts in a row ended before step 4's checkpoint; stopped" in capsys.readouterr().out


def test_a_resume_that_exits_0_after_0_steps_is_failed(run_dir):
    from vrun.rundir import state

    _log(run_dir, "7", "".join(f"(TaskRunner pid=1) step:{s} - timing_s/step:1.0\n" for s in range(1, 5)))
    _attempt(run_dir, "7", None, rc=0)
    assert state.load(run_dir).state == "completed"            # trained steps 1-4, then exited 0
    _log(run_dir, "8", "Resuming from global_step_4\n")
    _attempt(run_dir, "8", 4, rc=0)
    r = state.load(run_dir)
    assert r.state == "failed", r.phase
    assert r.phase.startswith("exited 0 after 0 steps (resumed from global_step_4 of 20"), r.phase
    assert r.failure["error"] == r.phase and r.attempts[0].state == "completed"
    _log(run_dir, "9", "Resuming from global_step_4\n(TaskRunner pid=1) step:5 - timing_s/step:1.0\n")
    _attempt(run_dir, "9", 4, rc=0)
    assert state.load(run_dir).state == "completed"            # a resume that trained step 5


def test_status_and_runs_write_nothing_into_the_run_dir(run_dir, capsys):
    """The verbs only read: the outlook, the rule's verdict and a zero-step resume are derived, never recorded."""
    from vrun.runs import cli

    _log(run_dir, "7", "".join(f"step:{s} - timing_s/step:2.0 - timing_s/gen:1.0\n" for s in range(1, 5)))
    _attempt(run_dir, "7", 4, rc=0)

    def snapshot():
        return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.parent.rglob("*")}

    before = snapshot()
    for argv in (["status", str(run_dir)], ["status", "--json", str(run_dir)], ["runs", str(run_dir)],
                 ["runs", "--json", str(run_dir)]):
        assert cli.main(argv) == 0
    capsys.readouterr()
    assert snapshot() == before


def test_a_ray_jobs_start_is_stopped_after_attempts_without_progress(tmp_path, monkeypatch):
    """cluster=ray: the job's entry (vrun.launch.entry.resume_problem, before verl starts) applies the rule as a SLURM
    node does, so a resubmission by hand or by a stall's requeue is not started again after
    cluster.no_progress_attempts attempts in a row ended without a newer whole checkpoint."""
    import json

    from conftest import record_json
    from vrun.launch import entry
    from vrun.rundir import records

    d = tmp_path / "run"
    d.mkdir()
    data = record_json(d, mode="train", cluster="ray")
    data["cluster_group"] = {**(data.get("cluster_group") or {}), "no_progress_attempts": 2}
    (d / "plan.json").write_text(json.dumps(data))
    (d / "verl_config.yaml").write_text(f"trainer:\n  default_local_dir: {d / 'checkpoints'}\n")
    from vrun.rundir.checkpoints import CHECKED_ENV

    monkeypatch.delenv(CHECKED_ENV, raising=False)
    monkeypatch.setenv("VRUN_ATTEMPT", "1")
    from omegaconf import OmegaConf

    config = OmegaConf.load(d / "verl_config.yaml")
    assert entry.resume_problem(str(d / "verl_config.yaml"), config) == ""   # attempt 1 after one without a save
    monkeypatch.setenv("VRUN_ATTEMPT", "2")
    records.record(str(d), "resumed", attempt=0, step=None)  # an earlier attempt, as the entry recorded it
    line = entry.resume_problem(str(d / "verl_config.yaml"), config)
    assert line.startswith("vrun: 2 attempts in a row ended before step 20's checkpoint; stopped"), line
    assert [e["event"] for e in records.events(str(d))][-1] == "stopped"

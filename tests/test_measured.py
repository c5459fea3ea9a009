"""A run's measured step times (verl's console lines, in verl's own format) beside the plan's estimate, in `status`
and `runs`, and the calibration record the next plan of the same kind uses. The state dir is pinned per test."""
import dataclasses
import json
import sys

import pytest

from conftest import plan
from vrun.planning import calibration, report
from vrun.rundir import joblog, records as rundir
from vrun.runs import cli

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml


@pytest.fixture
def state_dir(own_state_dir):
    return own_state_dir


@pytest.fixture(scope="module")
def verl_lines():
    """Step lines as verl's console logger prints them (its own concat_dict_to_str, numpy scalars included),
    through Ray's TaskRunner prefix, with foreign and corrupt lines between them."""
    np = pytest.importorskip("numpy")
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    out = ["(TaskRunner pid=4242) INFO: loading checkpoint shards", "random noise step: not a step"]
    for step, (gen, total) in enumerate([(300.0, 420.0), (100.0, 200.0), (110.0, 210.0), (90.0, 190.0)], start=1):
        data = {"timing_s/gen": np.float64(gen), "timing_s/old_log_prob": 10.5,
                "timing_s/update_actor": np.float32(60.0),
                "timing_s/update_weights": 12, "timing_s/step": np.float64(total), "perf/throughput": 1234.5,
                "perf/mfu/actor": np.float64(0.21), "actor/pg_loss": -0.01, "response_length/mean": 812.0}
        line = concat_dict_to_str(data, step=step)
        out.append(f"(TaskRunner pid=4242) {line}" if step != 2 else f"\x1b[36m(TaskRunner pid=4242)\x1b[0m {line}")
    out += ["step:7 - timing_s/step:hello - timing_s/gen:np.float64(", "step:x - timing_s/step:1.0",
            "\x00\xff garbage", "step:8 - timing_s/step"]
    return out


def test_verl_lines_are_parsed_and_foreign_lines_skipped(verl_lines):
    m = joblog.parse(verl_lines)
    assert sorted(m.steps) == [1, 2, 3, 4]
    assert m.step_s == 200.0                       # median of steps 2–4 (step 1 is the warm-up)
    s = m.summary()
    assert s["rollout_s"] == 100.0 and s["train_s"] == 60.0 and s["sync_s"] == 12.0 and s["log_prob_s"] == 10.5
    assert s["mfu"] == 0.21 and s["throughput"] == 1234.5
    assert m.skipped == 2                          # step:7 and step:8 carried nothing readable


def test_an_unreadable_log_is_no_measurement(tmp_path):
    assert joblog.read([tmp_path / "missing.log"]).steps == {}
    f = tmp_path / "bin.log"
    f.write_bytes(b"\xff\xfe\x00step:1 - timing_s/step:\xff\n")
    assert joblog.read([f]).step_s is None


def planned_run(tmp_path, name="r", overrides=("model=qwen3_5_35b", "algo=grpo", "mode=train")):
    p = plan(list(overrides), str(tmp_path / name))
    report.write(p)
    return p


def finished(p, lines):
    (tmp := __import__("pathlib").Path(p.run_dir)).mkdir(parents=True, exist_ok=True)
    (tmp / joblog.JOB_LOG).write_text("\n".join(lines) + "\n")
    rundir.record(p.run_dir, "started", attempt=0, pid=1)
    rundir.record(p.run_dir, "exited", attempt=0, node=0, rc=0)


def test_status_and_runs_show_measured_beside_predicted(tmp_path, state_dir, verl_lines, capsys):
    p = planned_run(tmp_path)
    finished(p, verl_lines)
    assert cli.main(["status", p.run_dir]) == 0
    out = capsys.readouterr().out
    pred = [x for x in out.splitlines() if x.startswith("predict  step ≈")]
    meas = [x for x in out.splitlines() if x.startswith("measured step 200 s")]
    assert pred and "estimate" in pred[0], out
    assert meas and "rollout 100" in meas[0] and "× the estimate's middle" in meas[0], out
    assert cli.main(["runs", p.run_dir]) == 0
    out = capsys.readouterr().out
    head, row = out.splitlines()[:2]
    # the table shows plan.json's bound (rounded to 0.1 s when written), so the expectation rounds the same way
    low, high = round(p.time.low, 1), round(p.time.high, 1)
    assert "STEP S (MEAS/EST)" in head and f"200/{low:.0f}–{high:.0f}" in row, out
    assert cli.main(["status", "--json", p.run_dir]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["measured"]["step_s"] == 200.0 and j["predicted"]["low_s"] == round(p.time.low, 1)


def test_the_next_plan_of_the_kind_is_calibrated(tmp_path, state_dir, verl_lines, capsys):
    """A run's end (measured.learn_at_end, in the job's own process) teaches the calibration; `status` and `runs`
    only read: they write no calibration record."""
    from vrun.planning import measured

    first = planned_run(tmp_path, "a")
    finished(first, verl_lines)
    cli.main(["status", first.run_dir])
    cli.main(["runs", first.run_dir])
    capsys.readouterr()
    assert not (state_dir / calibration.FILE).exists()  # read verbs write nothing
    measured.learn_at_end(first.run_dir)
    rec = json.loads((state_dir / calibration.FILE).read_text())
    (entries,) = rec.values()
    assert entries[0]["measured_s"] == 200.0
    assert entries[0]["predicted_s"] == pytest.approx(first.time.model_middle, rel=1e-3)
    nxt = plan(["model=qwen3_5_35b", "algo=grpo", "mode=plan"], str(tmp_path / "b"))
    assert nxt.time.calibration == "calibrated from 1 run"
    assert nxt.time.central == pytest.approx(200.0 * nxt.time.model_middle / first.time.model_middle, rel=1e-2)
    line = [x for x in report.table(nxt).splitlines() if x.startswith("step    ")][0]
    assert "calibrated from 1 run" in line
    # another kind (another GPU part) is not calibrated by it
    other = plan(["model=qwen3_5_35b", "algo=grpo", "mode=plan", "cluster.gpu=H200"], str(tmp_path / "c"))
    assert other.time.calibration == ""
    # a run learned twice records once; two more runs make three
    measured.learn_at_end(first.run_dir)
    for n in ("d", "e"):
        r = planned_run(tmp_path, n)
        finished(r, verl_lines)
        measured.learn_at_end(r.run_dir)
    third = plan(["model=qwen3_5_35b", "algo=grpo", "mode=plan"], str(tmp_path / "f"))
    assert third.time.calibration == "calibrated from 3 runs"


def test_a_corrupt_calibration_record_is_none(tmp_path, state_dir):
    state_dir.mkdir(parents=True)
    (state_dir / calibration.FILE).write_text("{not json")
    p = plan(["model=qwen3_5_35b", "algo=grpo", "mode=plan"], str(tmp_path / "r"))
    assert p.time.calibration == ""
    (state_dir / calibration.FILE).write_text(json.dumps({"qwen3_5_35b|H100|vllm|grpo": [{"measured_s": "x"}, 3]}))
    p = plan(["model=qwen3_5_35b", "algo=grpo", "mode=plan"], str(tmp_path / "r2"))
    assert p.time.calibration == ""


def test_a_local_run_tees_its_output_to_job_log_and_learns(tmp_path, state_dir, verl_lines, capfd):
    """vrun.launch.local.train: the child's output reaches the terminal and <run dir>/job.log; its steps calibrate."""
    from vrun.launch import local

    p = planned_run(tmp_path)
    script = "import sys\nfor line in %r: print(line)\nprint('to stderr', file=sys.stderr)\n" % (verl_lines,)
    p = dataclasses.replace(p, argv=[sys.executable, "-c", script])
    assert local.train(p) == 0
    cap = capfd.readouterr()
    log = (tmp_path / "r" / joblog.JOB_LOG).read_text(errors="replace")
    assert "timing_s/step" in cap.out and "timing_s/step" in log and "to stderr" in log
    assert "to stderr" in cap.err.splitlines() and "to stderr" not in cap.out.splitlines()  # streams stay apart
    assert list(json.loads((state_dir / calibration.FILE).read_text()).values())[0][0]["measured_s"] == 200.0


def test_a_slurm_run_is_read_from_its_first_nodes_stdout(tmp_path, state_dir, verl_lines, capsys):
    """On SLURM the measured steps come from submitit's stdout of node 0, found through slurm_job.json."""
    planned_run(tmp_path)
    d = tmp_path / "r"
    logs = tmp_path / "sub" / "77"
    logs.mkdir(parents=True)
    (logs / "77_0_log.out").write_text("\n".join(verl_lines) + "\n")
    (d / "slurm_job.json").write_text(json.dumps({"job_id": "77", "folder": str(tmp_path / "sub" / "%j"),
                                                  "spec": {"nodes": 2}}))
    assert cli.main(["status", str(d)]) == 0
    assert "measured step 200 s" in capsys.readouterr().out

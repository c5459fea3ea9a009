"""Every file the project reads back is an input, trusted no more than the command line: the state dir (calibration
record, runs index, kept verl trees), run dirs (plan.json, slurm_job.json, progress.jsonl, job.log) and checkpoints
(config.json, safetensors headers). Each door is handed generated hostile files (a FIFO, a link to elsewhere,
another user's or a world-writable file, a huge sparse file, truncated JSON, values that are not finite, negative,
or of the wrong type); each answer is one line, quick (a timeout proves it does not hang), without a traceback, and
writes nothing outside the run dir."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import PY, ROOT, problems_of, record_json, runner

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

NOBODY = 65534
HUGE = 1 << 30  # a sparse file past every limit (1 GiB, no disk used)
FILE_DOORS = ("fifo", "symlink", "other_owner", "world_writable", "huge", "truncated", "dir")


def vrun(*args, env=None, timeout=30):
    return subprocess.run([PY, "-m", "vrun", *args], cwd=ROOT, env=dict(os.environ if env is None else env),
                          capture_output=True, text=True, timeout=timeout)


@contextmanager
def within(seconds: int):
    """The block must finish in time: a read that blocks (a FIFO opened for reading) fails the test."""
    def late(*_):
        raise TimeoutError(f"took over {seconds} s: a read blocked")

    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def plant(path: Path, door: str, good: bytes) -> Path:
    """`door` at `path`, made from the good content where it needs one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if door == "fifo":
        os.mkfifo(path)
    elif door == "symlink":
        elsewhere = path.parent.parent / f"elsewhere-{path.name}"
        elsewhere.write_bytes(good)
        path.symlink_to(elsewhere)
    elif door == "other_owner":
        path.write_bytes(good)
        os.chown(path, NOBODY, NOBODY)
    elif door == "world_writable":
        path.write_bytes(good)
        os.chmod(path, 0o666)
    elif door == "huge":
        with open(path, "wb") as f:
            f.truncate(HUGE)
    elif door == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif door == "dir":
        path.mkdir()
    else:
        raise ValueError(door)
    return path


def warning_lines(err: str) -> list:
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err, err
    return lines


needs_root = pytest.mark.skipif(os.getuid() != 0, reason="os.chown to another user needs root")


def door_params(doors=FILE_DOORS):
    return [pytest.param(d, marks=needs_root) if d == "other_owner" else d for d in doors]


# --------------------------------------------------------------------------- the state dir's path

@pytest.mark.parametrize("spelling", ["/", "//", "/etc", "/tmp", "/usr/", "/var/tmp", "/home", "/./", "/etc/..",
                                      "relative/state", "./state", "~nosuchuser/state"])
def test_a_state_dir_at_a_system_dir_or_relative_is_refused(spelling):
    from vrun.rundir import records

    path, why = records.resolve_state_dir({"VRUN_STATE_DIR": spelling})
    assert path is None and why.startswith("error: VRUN_STATE_DIR=") and "; fix: " in why and "\n" not in why
    assert why.split("; fix: ")[1] != spelling


def test_a_state_dir_of_another_user_or_world_writable_is_refused(tmp_path):
    from vrun.rundir import records

    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    assert "writable by every user" in records.resolve_state_dir({"VRUN_STATE_DIR": str(d)})[1]
    if os.getuid() == 0:
        os.chmod(d, 0o755)
        os.chown(d, NOBODY, NOBODY)
        assert "owned by uid 65534" in records.resolve_state_dir({"VRUN_STATE_DIR": str(d)})[1]
    os.symlink("/etc", tmp_path / "link")  # a link to a system dir is that dir
    assert "system dir" in records.resolve_state_dir({"VRUN_STATE_DIR": str(tmp_path / "link")})[1]


def test_the_state_dir_as_the_xdg_spec_says(tmp_path, monkeypatch):
    from vrun.rundir import records

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = tmp_path / "home"
    assert records.resolve_state_dir({"VRUN_STATE_DIR": "~/vstate"}) == (home / "vstate", None)
    assert records.resolve_state_dir({"XDG_STATE_HOME": str(tmp_path / "x")}) == (tmp_path / "x" / "vrun", None)
    for relative in ("x", "./x", "state/"):  # the spec: a relative XDG_STATE_HOME is ignored
        assert records.resolve_state_dir({"XDG_STATE_HOME": relative}) == (home / ".local/state/vrun", None)
    assert records.resolve_state_dir({}) == (home / ".local/state/vrun", None)


def test_the_runner_refuses_a_state_dir_at_root_and_expands_a_tilde(tmp_path):
    before = sorted(os.listdir("/"))
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, VRUN_STATE_DIR="/", HOME=str(home))
    proc = subprocess.run([PY, str(ROOT / "runner.py"), "model=qwen3_5_35b", "mode=plan",
                           f"hydra.run.dir={tmp_path / 'r'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    lines = warning_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1 and "VRUN_STATE_DIR=/" in lines[0] and "; fix: " in lines[0]
    assert sorted(os.listdir("/")) == before and not (tmp_path / "r").exists()
    env["VRUN_STATE_DIR"] = "~/vstate"
    proc = subprocess.run([PY, str(ROOT / "runner.py"), "model=qwen3_5_35b", "mode=plan",
                           f"hydra.run.dir={tmp_path / 'r'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "~").exists() and (home / "vstate" / "runs.jsonl").is_file()


# --------------------------------------------------------------------------- the calibration record

KIND = {"model": "m", "gpu": "H100", "engine": "vllm", "algo": "grpo"}
KEY = "m|H100|vllm|grpo"
GOOD_CALIBRATION = json.dumps({KEY: [{"run_dir": "/r", "measured_s": 120.0, "predicted_s": 100.0, "steps": 5}]})


@pytest.mark.parametrize("door", door_params())
def test_a_hostile_calibration_record_is_no_calibration(own_state_dir, door, capsys):
    from vrun.planning import calibration

    own_state_dir.mkdir(parents=True)
    plant(own_state_dir / calibration.FILE, door, GOOD_CALIBRATION.encode())
    with within(10):
        assert calibration.entries(KIND) == []
    lines = warning_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(f"warning: file={own_state_dir / calibration.FILE}: "), lines
    assert "; fix: " in lines[0]


@pytest.mark.parametrize("measured", ["1e400", "-1e400", "Infinity", "NaN", "-5", "0", "1e12", '"fast"', "true",
                                      "[120]", "null", "1e-9"])
def test_a_calibration_outside_sane_bounds_is_ignored_saying_so(own_state_dir, measured, capsys):
    from vrun.planning import calibration

    own_state_dir.mkdir(parents=True)
    (own_state_dir / calibration.FILE).write_text(
        '{"%s": [{"run_dir": "/r", "measured_s": %s, "predicted_s": 100.0, "steps": 5}]}' % (KEY, measured))
    assert calibration.entries(KIND) == []
    lines = warning_lines(capsys.readouterr().err)
    assert len(lines) == 1 and KEY in lines[0] and "not a calibration" in lines[0], lines
    # and never recorded: a measured step of 1e400 (inf) teaches nothing
    assert calibration.record(KIND, "/r2", json.loads(f"[{measured}]")[0], 100.0, 5) is False


def test_a_sane_calibration_still_applies(own_state_dir, capsys):
    from vrun.planning import calibration

    own_state_dir.mkdir(parents=True)
    (own_state_dir / calibration.FILE).write_text(GOOD_CALIBRATION)
    assert [e["measured_s"] for e in calibration.entries(KIND)] == [120.0]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value", ["1e400", "-3", "nan", "inf", "1e12"])
def test_a_job_log_step_line_of_no_real_time_is_no_measurement(tmp_path, value):
    from vrun.rundir import joblog

    log = tmp_path / "job.log"
    log.write_text("".join(f"(TaskRunner pid=1) step:{i} - timing_s/step:{value} - timing_s/gen:{value}\n"
                           for i in range(1, 5)))
    m = joblog.read([log])
    assert m.step_s is None and m.median("timing_s/gen") is None


def test_a_huge_job_log_is_read_from_its_end_quickly(tmp_path):
    from vrun.rundir import joblog

    log = tmp_path / "job.log"
    with open(log, "wb") as f:
        f.truncate(220 << 20)  # 220 MB (sparse), then the recent steps
        f.seek(0, 2)
        f.write(b"".join(b"\nstep:%d - timing_s/step:%d.5" % (i, 40 + i) for i in range(1, 6)))
    t = time.monotonic()
    m = joblog.read([log])
    assert time.monotonic() - t < 5 and m.step_s == 44.0  # the median after the first step


@pytest.mark.parametrize("door", door_params(("fifo", "huge", "dir")))
def test_a_hostile_job_log_is_no_measurement(tmp_path, door):
    from vrun.rundir import joblog

    with within(10):
        assert joblog.read([plant(tmp_path / "job.log", door, b"")]).step_s is None


# --------------------------------------------------------------------------- the kept verl tree

@pytest.mark.parametrize("door", door_params() + ["edited", "another_key", "not_an_object"])
def test_a_hostile_kept_tree_is_composed_again(tmp_path, door, capsys):
    from vrun.compose import verl_tree

    key = {"format": verl_tree.CACHE_FORMAT, "config_name": "ppo_trainer", "groups": [], "tree": "f" * 16}
    tree = {"custom_reward_function": {"path": None, "name": "compute_score"}}
    good = {"key": key, "tree": tree, "digest": verl_tree.content_digest(tree)}
    path = tmp_path / "cache" / "verl-tree-x.json"
    if door == "edited":  # someone's reward function, the fingerprint left as it was
        bad = {**good, "tree": {"custom_reward_function": {"path": "/tmp/evil.py", "name": "compute_score"}}}
        plant(path, "truncated", b"")
        path.write_text(json.dumps(bad))
    elif door == "another_key":
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({**good, "key": {**key, "tree": "0" * 16}}))
    elif door == "not_an_object":
        path.parent.mkdir(parents=True)
        path.write_text("[1, 2]")
    else:
        plant(path, door, json.dumps(good).encode())
    with within(10):
        assert verl_tree.kept_tree(path, key) is None
    lines = warning_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(f"warning: file={path}: ") and "composed again" in lines[0]
    path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
    path.write_text(json.dumps(good))
    assert verl_tree.kept_tree(path, key) == tree


# --------------------------------------------------------------------------- the runs index

@pytest.mark.parametrize("door", door_params())
def test_a_hostile_runs_index_answers_in_one_line(own_state_dir, door):
    own_state_dir.mkdir(parents=True)
    plant(own_state_dir / "runs.jsonl", door, b'{"run_dir": "/nowhere", "t": 1}\n' * 4)
    proc = vrun("runs", timeout=30)
    lines = warning_lines(proc.stderr)
    assert len(lines) <= 1, lines
    if proc.returncode:
        assert proc.returncode == 2 and lines[0].startswith("error: ") and "; fix: " in lines[0]


# --------------------------------------------------------------------------- run dirs

@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "plan.json").write_text(json.dumps(record_json(d)))
    return d


def one_error(proc, *needles):
    lines = warning_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout[-2000:] + proc.stderr
    assert lines[0].startswith("error: ") and "; fix: " in lines[0], lines
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("door", door_params())
@pytest.mark.parametrize("verb", ["status", "show", "export"])
def test_a_hostile_plan_json_is_one_line(run_dir, door, verb):
    good = (run_dir / "plan.json").read_bytes()
    (run_dir / "plan.json").unlink()
    plant(run_dir / "plan.json", door, good)
    before = sorted(os.listdir(run_dir.parent))
    one_error(vrun(verb, str(run_dir)), "plan.json")
    assert sorted(os.listdir(run_dir.parent)) == before


@pytest.mark.parametrize("field,value", [("mesh.nnodes", 10 ** 9), ("mesh.world", 10 ** 9), ("mesh.pp", -1),
                                         ("mesh.gpus_per_node", 0), ("mesh.tp", "Infinity"), ("mesh.dp", 10 ** 30),
                                         ("torchrun.nproc_per_node", 10 ** 12)])
@pytest.mark.parametrize("verb", ["status", "show", "logs"])
def test_a_plan_claiming_an_absurd_mesh_is_one_line_quickly(run_dir, field, value, verb):
    text = (run_dir / "plan.json").read_text()
    data = json.loads(text)
    section, key = field.split(".")
    data[section][key] = "@@" if value == "Infinity" else value
    (run_dir / "plan.json").write_text(json.dumps(data).replace('"@@"', "Infinity"))
    t = time.monotonic()
    one_error(vrun(verb, str(run_dir)), field if value != "Infinity" else "Infinity")
    assert time.monotonic() - t < 20


@pytest.mark.parametrize("nodes", [10 ** 9, 0, -4, 2.5, "many", True])
@pytest.mark.parametrize("verb", ["status", "logs"])
def test_a_job_file_claiming_absurd_nodes_is_one_line(run_dir, nodes, verb):
    (run_dir / "slurm_job.json").write_text(json.dumps({"job_id": "123", "folder": str(run_dir / "slurm"),
                                                        "spec": {"nodes": nodes}}))
    t = time.monotonic()
    one_error(vrun(verb, str(run_dir)), "spec.nodes")
    assert time.monotonic() - t < 20


@pytest.mark.parametrize("door", door_params())
def test_a_hostile_job_file_is_one_line(run_dir, door):
    good = json.dumps({"job_id": "123", "folder": str(run_dir / "slurm"), "spec": {"nodes": 1}}).encode()
    plant(run_dir / "slurm_job.json", door, good)
    one_error(vrun("status", str(run_dir)), "slurm_job.json")


@pytest.mark.parametrize("door", door_params(("fifo", "symlink", "other_owner", "world_writable", "huge", "dir")))
def test_hostile_progress_lines_are_ignored_saying_so(run_dir, door):
    plant(run_dir / "progress.jsonl", door, b'{"event": "submitted", "t": 1.0}\n')
    proc = vrun("status", str(run_dir))
    lines = warning_lines(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    if door != "huge":  # a huge file is read from its end (here: no line a runner writes)
        assert len(lines) == 1 and lines[0].startswith("warning: file=") and "progress.jsonl" in lines[0], lines


def test_status_and_logs_of_a_huge_log_return_quickly(run_dir):
    with open(run_dir / "job.log", "wb") as f:
        f.truncate(220 << 20)
        f.seek(0, 2)
        f.write(b"\nstep:1 - timing_s/step:40.0\nstep:2 - timing_s/step:42.0\n")
    t = time.monotonic()
    proc = vrun("status", str(run_dir))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and time.monotonic() - t < 10, proc.stderr
    assert "measured step 41 s" in proc.stdout or "measured step 42 s" in proc.stdout, proc.stdout


def test_a_fifo_job_log_does_not_hang_logs_or_status(run_dir):
    os.mkfifo(run_dir / "job.log")
    for verb in ("status", "logs"):
        proc = vrun(verb, str(run_dir), timeout=30)
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 1, proc.stderr


# --------------------------------------------------------------------------- the picture at huge meshes

@pytest.mark.parametrize("nodes,gpn,pp", [(12_500, 8, 4), (125_000, 8, 100_000), (1, 8, 2)])
def test_the_picture_stays_small_at_any_mesh(tmp_path, nodes, gpn, pp):
    from vrun.planning import picture

    plan = record_json(tmp_path)
    plan["mesh"].update(nnodes=nodes, gpus_per_node=gpn, world=nodes * gpn, pp=pp)
    t = time.monotonic()
    out = picture.render(plan, str(tmp_path / "plan.svg"))
    assert time.monotonic() - t < 60 and os.path.getsize(out) < 1_000_000


def test_show_of_a_100k_gpu_plan_is_quick_and_small(run_dir):
    data = json.loads((run_dir / "plan.json").read_text())
    data["mesh"].update(nnodes=12_500, gpus_per_node=8, world=100_000)
    (run_dir / "plan.json").write_text(json.dumps(data))
    t = time.monotonic()
    proc = vrun("show", str(run_dir), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t < 60 and (run_dir / "plan.svg").stat().st_size < 1_000_000


# --------------------------------------------------------------------------- sweep limits as Hydra expands them

def test_glob_counts_the_options_it_matches(tmp_path):
    models = len(list((ROOT / "conf" / "model").glob("*.yaml")))
    per = 10_000 // models + 1
    proc = runner("model=glob(*)", f"+sweep_probe=range(0,{per})", "mode=plan",
                  f"hydra.sweep.dir={tmp_path / 's'}")
    lines = warning_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1 and f"{models * per:,} points" in lines[0], proc.stderr
    assert not (tmp_path / "s").exists()


def test_sweep_counts_match_hydra_expansion():
    """The count equals the points Hydra's basic sweeper makes, for every kind of sweep."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.utils import create_config_search_path
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from vrun.checks.composed import sweep_size_problems

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(ROOT / "conf")))
    for args in (["model=glob(*)"], ["model=glob(*,exclude=glm*)", "+a=range(0,3)"], ["+a=choice(1,2,3)", "+b=4,5"],
                 ["+a=range(0,1,0.25)"], ["+a=shuffle(range(10,0,-2))"], ["+a=sort(3,1,2)", "model=glob(qwen*)"]):
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(args)
        n = len(BasicSweeper.split_arguments(parsed, None)[0])
        assert sweep_size_problems(parsed, limit=n) == [], args
        assert sweep_size_problems(parsed, limit=n - 1), args


# --------------------------------------------------------------------------- checkpoints

def write_shard(path: Path, tensors: dict) -> None:
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = max(1, 1 if not shape else abs(int(__import__("math").prod(shape)))) * 2
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


CONFIG = dict(model_type="qwen3_moe", num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
              hidden_size=8, vocab_size=32, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=4)
TENSORS = {"model.embed_tokens.weight": ("BF16", (32, 8)), "model.layers.0.mlp.experts.0.up_proj.weight":
           ("BF16", (4, 8)), "lm_head.weight": ("BF16", (32, 8))}


def checkpoint(d: Path, config: dict | str = None, tensors: dict | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg = CONFIG if config is None else config
    (d / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    if tensors != {}:
        write_shard(d / "model.safetensors", TENSORS if tensors is None else tensors)
    return d


CHECKPOINT_CASES = {
    # a word, a float, a bool, a negative or zero count for a number in config.json
    **{f"{k}={v!r}": (dict(CONFIG, **{k: v}), None, k) for k, v in (
        ("hidden_size", "4096"), ("hidden_size", 8.0), ("num_hidden_layers", True), ("num_experts", -2),
        ("vocab_size", 0), ("num_attention_heads", "many"), ("moe_intermediate_size", [4]))},
    "Infinity": (json.dumps(CONFIG).replace('"hidden_size": 8', '"hidden_size": Infinity'), None, "Infinity"),
    "truncated config": (json.dumps(CONFIG)[:40], None, "not valid JSON"),
    "only a buffer": (CONFIG, {"model.position_ids": ("I64", (4,))}, "weights=0"),
    "negative shape": (CONFIG, {"model.embed_tokens.weight": ("BF16", (-32, 8))}, "shape"),
    "lying quantization": (dict(CONFIG, quantization_config={"quant_method": "gptq", "bits": 4}), None,
                           "quantization_config"),
    "lying expert dtype": (dict(CONFIG, expert_dtype="fp4"), None, "expert_dtype"),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_a_checkpoint_whose_facts_disagree_is_refused(tmp_path, case):
    from vrun.estimate.checkpoint import CheckpointError, read_checkpoint

    config, tensors, needle = CHECKPOINT_CASES[case]
    d = checkpoint(tmp_path / "ckpt", config, tensors)
    with within(10), pytest.raises(CheckpointError) as e:
        read_checkpoint(d)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert e.value.fix and str(d) in str(e.value)


@pytest.mark.parametrize("door", ["fifo", "huge", "dir"])
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_hostile_checkpoint_file_is_refused_without_hanging(tmp_path, door, name):
    from vrun.estimate.checkpoint import CheckpointError, read_checkpoint

    d = checkpoint(tmp_path / "ckpt")
    (d / name).unlink()
    plant(d / name, door, b"")
    with within(10), pytest.raises(CheckpointError) as e:
        read_checkpoint(d)
    assert "\n" not in str(e.value) and e.value.fix


def test_a_config_json_without_weights_plans_from_the_facts_not_zero(tmp_path):
    from conftest import plan

    d = checkpoint(tmp_path / "ckpt", tensors={})
    p = plan(["model=qwen3_5_35b", "mode=plan"], environ=dict(os.environ, QWEN3_5_35B_MODEL_PATH=str(d)))
    assert p.params is not None and p.params.total > 1e9
    assert any("no safetensors weights" in w.line() for w in p.warnings)


def test_a_plan_from_a_lying_checkpoint_is_one_error_line(tmp_path):
    """The plan is refused, not sized from the checkpoint's word (a quantization its tensors do not hold would
    make a plan fit that does not)."""
    d = checkpoint(tmp_path / "ckpt", dict(CONFIG, quantization_config={"quant_method": "fp8"}))
    env = dict(os.environ, QWEN3_5_35B_MODEL_PATH=str(d))
    with within(120):
        errors = problems_of(["model=qwen3_5_35b", "mode=plan"], environ=env)
    assert len(errors) == 1 and errors[0].startswith(f"error: QWEN3_5_35B_MODEL_PATH={d}: ") and "; fix: " in errors[0]
    assert "quantization_config" in errors[0]

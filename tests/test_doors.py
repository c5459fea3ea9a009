"""The earlier doors, as a hostile user tries them, with legal inputs beside each: the state dir's files as FIFOs,
links and dirs (named by the code that reads and writes them), hydra.launcher keys the launcher lacks, env names
no shell exports, booleans typed as words (every boolean knob of the schema), a checkpoint's quantization_config
in every shape but a map, a drawing child whose matplotlib hangs or does not import, and lists read back that are
summarised past a few items."""
import dataclasses
import json
import os
import time
import typing
from pathlib import Path

import pytest

from conftest import runner

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

PLAN = ["model=qwen3_5_35b", "mode=plan"]


def _state_entries():
    """What the state dir holds, by the code that reads or writes it."""
    from vrun.planning import calibration
    from vrun.rundir import records

    index = records.index_path({"VRUN_STATE_DIR": "/x"}).name
    return [index, calibration.FILE, "cache", "matplotlib"]


def _plant(path: Path, kind: str, outside: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        path.symlink_to(outside)
    elif kind == "dir":
        path.mkdir()
    else:  # a file where the project keeps a dir, or an empty file where it keeps one
        path.write_text("")


@pytest.mark.parametrize("kind", ["fifo", "link", "dir", "file"])
def test_hostile_state_dir_entries_never_hang_or_write_through(tmp_path, kind):
    """Every entry of the state dir planted as a FIFO, a link to a file of the user's, a dir or an empty file: the
    plan finishes (the runner's own timeout would say otherwise), exits 0, and the link's target is left as it was."""
    state = tmp_path / "state dir"
    state.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("mine\n")
    for name in _state_entries():
        _plant(state / name, kind, outside)
    env = {**os.environ, "VRUN_STATE_DIR": str(state), "HOME": str(tmp_path / "home")}
    proc = runner(*PLAN, f"hydra.run.dir={tmp_path}/run", env=env, timeout=90)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert outside.read_text() == "mine\n"
    if kind != "file":  # the index could not take the run: said
        assert f"warning: file={state / 'runs.jsonl'}: " in proc.stderr, proc.stderr


def test_a_run_dir_and_state_dir_with_spaces_plan(tmp_path):
    state, run = tmp_path / "my state", tmp_path / "a run dir"
    proc = runner(*PLAN, f"hydra.run.dir='{run}'", env={**os.environ, "VRUN_STATE_DIR": str(state)})
    assert proc.returncode == 0 and (run / "plan.json").exists(), proc.stderr[-2000:]
    assert str(run) in (state / "runs.jsonl").read_text()


@pytest.mark.parametrize("cluster,typed,fix", [
    ("slurm", "+hydra.launcher.partiton=debug", "hydra.launcher.partition=debug"),
    ("slurm", "+hydra.launcher.exclud=n1", "hydra.launcher.exclude=n1"),
    ("local", "+hydra.launcher.partiton=debug", "with cluster=slurm: hydra.launcher.partition=debug"),
    ("ray", "+hydra.launcher.zzz=1", "drop +hydra.launcher.zzz"),
])
def test_an_unknown_launcher_key_names_the_nearest(tmp_path, cluster, typed, fix):
    proc = runner(*PLAN, f"cluster={cluster}", typed, f"hydra.sweep.dir={tmp_path}/s")
    key = typed.lstrip("+").split("=")[0]
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {key}="), proc.stderr[-2000:]
    assert fix in proc.stderr.splitlines()[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "s").exists()


def test_a_known_launcher_key_plans(tmp_path):
    proc = runner(*PLAN, "cluster=slurm", "hydra.launcher.partition=debug", f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("typed,fix", [("+env.A-B=1", "+env.A_B="), ("+env.$X=1", "+env.X="),
                                       ("+model.env.VLLM-X=1", "+model.env.VLLM_X="), ("+env.1A=1", "+env._1A="),
                                       ("+env.É=1", "+env.MY_VAR=")])
def test_env_names_no_shell_exports_are_refused(tmp_path, typed, fix):
    proc = runner(*PLAN, typed, f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 2 and fix in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "r").exists()


def test_legal_env_names_plan(tmp_path):
    proc = runner(*PLAN, "+env._A1=x", "+model.env.VLLM_MY_FLAG=1", f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 0, proc.stderr[-2000:]


def _bool_knobs(cls=None, prefix=""):
    from vrun.config.schema import RunConfig

    cls = cls or RunConfig
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        args = [a for a in typing.get_args(t) if a is not type(None)]
        t = args[0] if typing.get_origin(t) is typing.Union and len(args) == 1 else t
        if dataclasses.is_dataclass(t):
            yield from _bool_knobs(t, f"{prefix}{f.name}.")
        elif t is bool:
            yield f"{prefix}{f.name}"


@pytest.mark.parametrize("knob", sorted(_bool_knobs()))
def test_every_boolean_knob_takes_true_or_false_only(knob):
    from vrun.checks.composed import bool_word_problems

    for word, meant in (("no", "false"), ("yes", "true"), ("on", "true"), ("0", "false"), (1, "true")):
        found = bool_word_problems([(knob, word)])
        assert [p.key for p in found] == [knob] and found[0].fix.startswith(f"{knob}={meant}"), found
    assert not bool_word_problems([(knob, True), (knob, False), (knob, "false"), (knob, "TRUE"),
                                   (knob, "${oc.env:FLAG,false}")])


def test_a_boolean_word_through_the_runner(tmp_path):
    proc = runner(*PLAN, "run.resume=no", f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 2 and proc.stderr.startswith("error: run.resume=no: "), proc.stderr
    assert "fix: run.resume=false" in proc.stderr and not (tmp_path / "r").exists()
    assert runner(*PLAN, "run.resume=false", f"hydra.run.dir={tmp_path}/r2").returncode == 0


def _quantization_cases():
    """quantization_config with each place a map belongs given another JSON type."""
    good = {"quant_method": "compressed-tensors", "quantization": {"quant_algo": "FP8"},
            "config_groups": {"g0": {"weights": {"num_bits": 4}}}}
    places = [(), ("config_groups",), ("config_groups", "g0"), ("config_groups", "g0", "weights"), ("quantization",)]
    for place in places:
        for bad in (["fp8"], "fp8", 8):
            q = json.loads(json.dumps(good))
            if not place:
                q = bad
            else:
                node = q
                for p in place[:-1]:
                    node = node[p]
                node[place[-1]] = bad
            yield ".".join(("quantization_config",) + place), q


@pytest.mark.parametrize("where", ["", "text_config."])
def test_quantization_config_that_is_not_a_map_is_refused_naming_it(tmp_path, where):
    from vrun.estimate.checkpoint import CheckpointError, read_checkpoint
    from vrun.estimate.rollout import formats_from_config

    for i, (key, q) in enumerate(_quantization_cases()):
        d = tmp_path / str(i)
        d.mkdir()
        cfg = {"text_config": {"quantization_config": q}} if where else {"quantization_config": q}
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(CheckpointError) as e:
            read_checkpoint(str(d))
        assert f"{where}{key}=" in str(e.value), (key, str(e.value))
        formats_from_config(cfg)  # the rollout's reader takes the same file without raising
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8"}}))
    read_checkpoint(str(ok))


FAKE_MATPLOTLIB = {
    "hang": "import time\ntime.sleep(10 ** 6)\n",
    "broken": "raise ImportError('libfreetype.so.6: cannot open shared object file')\n",
    # imports and warms up; hangs drawing the plan's own figure (14 x 9 inches)
    "hang_drawing": ("import time\nrcParams = {}\ndef use(x):\n    pass\n"),
}
FAKE_FIGURE = """import time
class _Ax:
    def bar(self, *a, **k):
        return []
class Figure:
    def __init__(self, figsize=None):
        if figsize == (14, 9):
            time.sleep(10 ** 6)
    def add_subplot(self, *a):
        return _Ax()
    def savefig(self, *a, **k):
        pass
"""


@pytest.mark.parametrize("kind,reason", [("hang", "matplotlib's import took longer than 2 s"),
                                         ("broken", "matplotlib did not import (ImportError: libfreetype"),
                                         ("hang_drawing", "the drawing took longer than 2 s")])
def test_a_drawing_child_that_hangs_or_cannot_import_leaves_its_word_and_ends(tmp_path, monkeypatch, kind, reason):
    """The child's bounds, with a matplotlib that hangs in its import, does not import, or hangs drawing: each
    leaves plan.svg.failed with the reason, and the child is gone soon after (the plan never waits for it)."""
    from vrun.planning import picture

    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_MATPLOTLIB[kind])
    if kind == "hang_drawing":
        (fake / "figure.py").write_text(FAKE_FIGURE)
        (fake / "collections.py").write_text("class PatchCollection:\n    pass\n")
        (fake / "patches.py").write_text("class Patch:\n    pass\nclass Rectangle:\n    pass\n")
        (fake / "backends").mkdir()
        (fake / "backends" / "__init__.py").write_text("")
        (fake / "backends" / "backend_svg.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text("{}")
    drawer = picture.Prerenderer(import_s=2, draw_s=2)
    proc = drawer.proc
    svg, why = drawer.render(str(run / "plan.json"))
    assert svg == str(run / "plan.svg"), why
    failed = run / picture.PICTURE_FAILED
    end = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < end:
        time.sleep(0.2)
    assert proc.poll() is not None, "the drawing child outlived its bounds"
    assert failed.exists() and failed.read_text().startswith(reason), failed.read_text() if failed.exists() else None


def test_lists_read_back_are_summarised():
    from vrun.core.text import summarised, summarised_list

    names = [f"global_step_{i}" for i in range(20_000)]
    line = summarised(names)
    assert line == "global_step_0, global_step_1, global_step_2, global_step_3, global_step_4 … and 19,995 more"
    assert summarised(names[:5]) == ", ".join(names[:5]) and summarised([]) == ""
    assert summarised(["\x1b]52;c;AAAA\x07" + "x" * 500]).startswith("\\x1b]52;c;AAAA\\x07") and \
        len(summarised(["x" * 500])) == 80
    assert summarised_list(names) == names[:5] + ["… and 19,995 more"] and summarised_list(names[:3]) == names[:3]
    assert len(json.dumps(summarised_list(names))) < 200


def test_a_partition_list_from_scontrol_is_summarised():
    from vrun.launch.slurm import checks

    parts = [checks.Partition(f"p{i}", 1, None, None, 8) for i in range(20_000)]
    sub = type("S", (), {"parameters": {"partition": "nosuch"}, "nodes": 1, "gpus_per_node": 8})()
    line = checks.partition_problems(sub, parts)[0].line()
    assert "… and 19,995 more" in line and len(line) < 400, line
    assert checks.minutes("²") is None and checks.minutes("1-02:00:00") == 26 * 60


def test_a_fix_that_repeats_the_input_is_caught():
    """The rule conftest holds every runner line and every Problem line to (conftest.fix_repeats_input)."""
    from conftest import fix_repeats_input

    assert fix_repeats_input("error: verl.trainer.use_v1=true: a boolean given as a string; fix: verl.trainer.use_v1=true")
    assert fix_repeats_input("warning: a.b=1: why; fix: a.b=1 (unquoted)")
    assert not fix_repeats_input("error: verl.trainer.use_v1='true': a boolean given as a string; fix: "
                                 "verl.trainer.use_v1=true")
    assert not fix_repeats_input("error: model.env.X=1: a new entry of the map; fix: +model.env.X=1")
    assert not fix_repeats_input("error: hydra.mode=RUN: why; fix: drop hydra.mode")
    from vrun.checks.values import type_problems

    line = type_problems({"trainer": {"use_v1": "true"}}, {"trainer": {"use_v1": False}})[0].line()
    assert line.startswith("error: verl.trainer.use_v1='true': ") and line.endswith("fix: verl.trainer.use_v1=true")

"""Legal inputs are never refused: a value Hydra's grammar and OmegaConf accept plans as typed (quoted
interpolations with spaces, in a run and in a sweep), and a run dir of spaces, quotes, commas, brackets and
non-ASCII letters plans for every entrypoint: RL never puts it on a command line, and SFT's torchrun command line
carries it so that verl's own SFT CLI (Hydra's parser) reads it back unchanged."""
import json
import subprocess
import sys

import pytest
import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from conftest import runner
from hydra_plugins.vrun_sweeper.vrun_sweeper import split_points
from vrun.core import hydra_text

# a directory name no shell or Hydra grammar likes: space, non-ASCII, both quotes, comma, brackets, '#', '=', '\'
AWKWARD = "sp ace é,c'q\"[b]#=x\\y"


def _typed(path: str) -> str:
    """hydra.run.dir=<path> as a user types it on the command line: single-quoted, its quotes escaped (in Hydra's
    quoted strings a backslash not before a quote is itself)."""
    return "hydra.run.dir='" + path.replace("'", "\\'") + "'"


@pytest.mark.parametrize("overrides", [
    ["x=1,2", "y=a,b", "+z=[1,2]", "x=3,4"],  # the last of a key wins, as in Hydra's basic sweeper
    ["m=range(1,4)", "n=choice(a,'b c')", "o={a:1}"],
    ["p='a,b'", "q=${oc.env:HOME}", "r=null"],
])
def test_split_points_is_hydras_where_hydra_reads_its_own_points(overrides):
    """The same points, in the same order, each override reading back as Hydra's own text does (the text may
    differ: a plain override keeps what was typed)."""
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    ours, hydras = split_points(parsed), BasicSweeper.split_arguments(parsed, None)[0]
    assert len(ours) == len(hydras) > 0
    read = lambda point: [(o.get_key_element(), o.value()) for o in parser.parse_overrides(point)]  # noqa: E731
    for a, b in zip(ours, hydras):
        assert read(a) == read(b), (a, b)


@pytest.mark.parametrize("value", ["${oc.decode:'\"a b\"'}", "${oc.env:NOPE,'a b'}", "${oc.env:NOPE,\"it's\"}"])
def test_split_points_read_back_as_typed(value):
    """Each point's text parses back to the value typed, a quoted interpolation included (Hydra's own element
    text escapes it into one its grammar refuses)."""
    parser = OverridesParser.create()
    for overrides in ([f"x={value}"], [f"x=a,{value}"]):
        values = [parser.parse_overrides(point)[0].value() for point in split_points(parser.parse_overrides(overrides))]
        assert values[-1] == value, values


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_quoted_interpolations_with_spaces_plan(tmp_path, sweep):
    values = {"A": "${oc.decode:'\"a b\"'}", "B": "${oc.env:VRUN_TEST_UNSET_X,'c d'}"}
    given = [f"+env.{k}={v}" for k, v in values.items()]
    dirs = ["+env.C=x,y", f"hydra.sweep.dir={tmp_path}/s"] if sweep else [f"hydra.run.dir={tmp_path}/r"]
    proc = runner(*(["-m"] if sweep else []), "model=qwen3_5_35b", "mode=plan", *given, *dirs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plans = sorted((tmp_path / ("s" if sweep else "r")).glob("**/plan.json"))
    assert len(plans) == (2 if sweep else 1)
    for p in plans:
        env = json.loads(p.read_text())["env"]
        assert env["A"] == "a b" and env["B"] == "c d", env


@pytest.mark.parametrize("algo", ["grpo", "sft"])
def test_run_dir_of_awkward_characters_plans(tmp_path, algo):
    run_dir = tmp_path / AWKWARD
    proc = runner("model=qwen3_5_35b", "mesh=8gpu", f"algo={algo}", "mode=plan", _typed(str(run_dir)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["run_dir"] == str(run_dir)


def test_sft_command_line_is_read_back_by_verls_own_cli(tmp_path):
    """The SFT plan's own command (torchrun … verl.trainer.sft_trainer --config-path <dir> … hydra.run.dir=…), run
    through verl's SFT CLI with --cfg: the config it loads is the saved one, and its hydra.run.dir is the run dir's
    sft/ as written, character for character."""
    run_dir = tmp_path / AWKWARD
    proc = runner("model=qwen3_5_35b", "mesh=8gpu", "algo=sft", "mode=plan", _typed(str(run_dir)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    argv = json.loads((run_dir / "plan.json").read_text())["argv"]
    args = argv[argv.index("verl.trainer.sft_trainer") + 1:]
    shown = {}
    for part in ("hydra", "job"):
        out = subprocess.run([sys.executable, "-m", "verl.trainer.sft_trainer", *args, "--cfg", part],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        lines = out.stdout.splitlines()
        first = "hydra" if part == "hydra" else next(iter(yaml.safe_load((run_dir / "verl_config.yaml").read_text())))
        start = next(i for i, line in enumerate(lines) if line.startswith(f"{first}:"))  # skip import-time logs
        shown[part] = yaml.safe_load("\n".join(lines[start:]))
    assert shown["hydra"]["hydra"]["run"]["dir"] == f"{run_dir}/sft"
    assert shown["job"] == yaml.safe_load((run_dir / "verl_config.yaml").read_text())


def test_literal_reads_back_what_hydra_can_give_back():
    """hydra_text.literal(s) parses and resolves back to s for any string without a backslash right before `${`
    (the one spelling Hydra's grammar cannot give back; SFT refuses that run dir naming it)."""
    import random

    rng = random.Random(5)
    chars = "ab é'\"\\,[]{}=#$:~%@ \t"
    for _ in range(400):
        s = "/" + "".join(rng.choice(chars) for _ in range(rng.randint(0, 10)))
        assert hydra_text.reads_back(s) == ("\\${" not in s), repr(s)
    assert not hydra_text.reads_back("/a\\${x}")
    from vrun import entrypoints

    (problem,) = entrypoints.SFT().run_dir_problems("/a\\${x}", "hydra.run.dir")
    assert problem.key == "hydra.run.dir" and "${" in problem.why

"""Junk in every leaf of the run config, in-process, seeded and bounded: each input is refused (one line per
problem, naming a key, no secret) or planned (its files only in its run dir, no secret in them) — never an
unexpected exception, which on the command line would be a traceback or a line that names nothing."""
import random
import time

import pytest
from omegaconf import DictConfig, OmegaConf

from conftest import assert_a_fix, compose
from vrun.checks import composed as check_composed
from vrun.config import cli_errors, schema
from vrun.planning import report
from vrun.core import writer
from vrun.planning.plan import make_plan
from vrun.core.problems import PlanError

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

SECRET = "fuzz-secret-0xC0FFEE"
SEEDS = (12, 1207)
BUDGET_S = 20.0  # per seed: the whole test stays under a minute
JUNK = ["a\nb", "x\r#SBATCH --nodes=999", "\x1b[31m", "", " ", "../../esc", "a/b", "a,b", "~", "/", 0, -1, 1,
        2 ** 63, 10 ** 30, -(10 ** 30), 1.5, 0.0, -0.5, float("inf"), float("nan"), True, False, None, [], {},
        [1, 2], {"k": 1}, "null", "${oc.env:WANDB_API_KEY}", SECRET, "é", "x" * 5000, "1e400"]


def leaves(node, prefix=""):
    if isinstance(node, DictConfig):
        for k in node.keys():
            yield from leaves(node._get_node(k), f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix


def one_line_each(lines):
    for line in lines:
        assert line.startswith(("error: ", "warning: ")) or line.startswith("valid meshes"), line
        assert "\n" not in line and SECRET not in writer.mask(line, {"WANDB_API_KEY": SECRET}), line
        if line.startswith("error: "):
            assert "; fix: " in line, line
            assert_a_fix(line, "")


def base_config(tmp_path):
    env = {"WANDB_API_KEY": SECRET, "HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    base = OmegaConf.merge(schema.schema_node(), compose(["model=qwen3_5_35b", "mode=plan"]))
    return base, env, {g: base[g].name for g in ("model", "algo", "data")}


def outcome(base, key, junk, tmp_path, n, env, choices) -> str:
    """One input through what the command line does: "refused" (lines checked) or "planned" (files checked)."""
    run_dir = tmp_path / "runs" / f"r{n}"
    cfg = base.copy()
    try:
        OmegaConf.update(cfg, key, junk, force_add=True)
    except Exception as e:  # noqa: BLE001 - composition refuses it: one line on the command line
        one_line_each([cli_errors.describe(e)])
        return "refused"
    problems = [p for p in check_composed.config_problems(cfg, env, choices) if not p.warning]
    if problems:
        one_line_each([p.line() for p in problems])
        return "refused"
    try:
        config = schema.typed(cfg)
    except Exception as e:  # noqa: BLE001
        one_line_each([cli_errors.describe(e)])
        return "refused"
    try:
        plan = make_plan(config, str(run_dir), environ=env)
    except PlanError as e:
        assert e.problems, (key, junk)
        one_line_each([p.line() for p in e.problems])
        return "refused"
    except Exception as e:  # an unexpected exception is a traceback on the user's terminal
        pytest.fail(f"{key}={junk!r:.80}: {type(e).__name__}: {str(e)[:300]}")
    report.write(plan)
    for f in (tmp_path / "runs").rglob("*"):
        assert run_dir in f.parents or f == run_dir, (key, junk, f)
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), (key, junk, f)
    import shutil

    shutil.rmtree(run_dir)
    return "planned"


@pytest.mark.parametrize("seed", SEEDS)
def test_junk_in_every_leaf(tmp_path, seed):
    """Every leaf gets junk values; the outcome is a refusal in lines or a plan that writes only its run dir."""
    base, env, choices = base_config(tmp_path)
    keys = sorted(leaves(base))
    rng = random.Random(seed)
    t0, n, outcomes = time.monotonic(), 0, {"refused": 0, "planned": 0}
    order = keys[:]
    rng.shuffle(order)
    while time.monotonic() - t0 < BUDGET_S:
        key = order[n % len(order)]
        junk = rng.choice(JUNK)
        n += 1
        outcomes[outcome(base, key, junk, tmp_path, n, env, choices)] += 1
    assert n >= len(keys) // 2 and outcomes["refused"] and outcomes["planned"], (n, outcomes)


# names no filesystem holds (a component over 255 bytes, a path over 4,096, a NUL byte, a user who does not exist):
# asking pathlib whether such a file exists, or expanding ~, raises; the plan must answer instead
UNHOLDABLE = ["x" * 5000, "/tmp/" + "d" * 300 + "/train.parquet", "a\x00b", "/" + "/".join(["p" * 200] * 30),
              "~nosuchuser9/train.parquet"]


def test_names_no_filesystem_holds(tmp_path):
    """Every leaf that names a file or dir, each such name in turn: refused or planned, never a crash (the
    time-bounded fuzz above reached data.train_files with 5,000 x's only on a fast enough machine)."""
    base, env, choices = base_config(tmp_path)
    keys = [k for k in sorted(leaves(base)) if k.rsplit(".", 1)[-1].endswith(("path", "files", "dir", "paths"))]
    assert any(k.endswith("data.train_files") for k in keys) and len(keys) >= 4, keys
    seen = {"refused": 0, "planned": 0}
    for n, (key, junk) in enumerate((k, j) for k in keys for j in UNHOLDABLE):
        seen[outcome(base, key, junk, tmp_path, n, env, choices)] += 1
    assert seen["planned"], seen

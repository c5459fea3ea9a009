"""A plan is bound to the stack it was composed against: verl (version and config tree) and verl_mlite's config
interface. A second real verl, where one is installed beside this one (VRUN_TEST_OTHER_PYTHON: a Python with
another verl; the CI's a6ef5009 and 1dda039b legs point it at the PyPI leg's venv), shows the refusal across two
real stacks; without one those tests skip, saying why."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, needs_real_mlite, real_mlite_root, without_mlite
from vrun.compose import stack

OTHER = os.environ.get("VRUN_TEST_OTHER_PYTHON")
needs_other_verl = pytest.mark.skipif(not OTHER or not Path(OTHER).exists(),
                                      reason="no second Python with another verl (set VRUN_TEST_OTHER_PYTHON)")


def stack_in(python: str, env: dict) -> dict:
    out = subprocess.run([python, "-c", "import json; from vrun.compose import stack; print(json.dumps(stack.current()))"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_same_environment_matches_itself():
    """Recorded here, checked here: nothing to say."""
    assert stack.mismatch(stack.current()) == []


def test_an_old_plan_without_a_stack_is_one_line():
    (p,) = stack.mismatch(None)
    assert p.line().startswith("error: plan.json=stack: the plan records no stack") and "mode=plan" in p.line()


@needs_real_mlite
def test_record_and_real_package_share_one_interface():
    """The record stands in for verl_mlite at the recorded commit: the same config fingerprint, so a plan
    composed against the record is not refused where the real package is installed."""
    import sys

    rec = stack_in(sys.executable, without_mlite())
    real = stack_in(sys.executable, {**without_mlite(), "MLITE_ROOT": str(real_mlite_root())})
    assert rec["verl_mlite"]["source"] == "record" and real["verl_mlite"]["source"] == "verl_mlite"
    assert rec["verl_mlite"]["config"] == real["verl_mlite"]["config"]
    assert stack.mismatch(rec, real) == []


@needs_other_verl
def test_another_verl_is_refused_naming_both():
    """A plan's stack from one real verl, checked against another real verl: one line naming both versions."""
    import sys

    here = stack_in(sys.executable, without_mlite())
    there = stack_in(OTHER, without_mlite())
    assert here["verl"] != there["verl"]
    (p,) = stack.mismatch(there, here)
    line = p.line()
    assert line.startswith(f"error: verl={here['verl']['version']}: the plan was composed against verl "
                           f"{there['verl']['version']}") and "plan again in this environment" in line


def test_a_changed_mlite_interface_is_refused():
    """verl_mlite's config groups changing under a plan is refused too (its fingerprint is in the stack)."""
    here = stack.current()
    planted = json.loads(json.dumps(here))
    planted["verl_mlite"]["config"] = "0" * 16
    (p,) = stack.mismatch(planted, here)
    assert p.key == "verl_mlite" and "the plan was composed against verl_mlite" in p.why


def test_plan_and_manifest_record_the_stack(tmp_path):
    """plan.json and manifest.json name the verl (version, config tree) and verl_mlite the plan was composed on."""
    from conftest import runner

    proc = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert plan["stack"] == manifest["stack"] == stack.current()
    assert plan["stack"]["verl"]["version"] and len(plan["stack"]["verl"]["tree"]) == 16


@needs_other_verl
def test_a_node_with_another_verl_refuses_before_anything_starts(tmp_path):
    """The node entry's check, run by a Python with the other verl on a plan made here: one line naming both
    verls, raised before Ray or torchrun would start."""
    from conftest import runner

    proc = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/r", env=without_mlite())
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    # as the node reads it: plan.json typed (vrun.rundir.record), its recorded stack checked
    code = ("from vrun.launch.slurm.node import check_stack; from vrun.rundir.record import PlanRecord; "
            f"check_stack(PlanRecord.load({str(tmp_path / 'r')!r}).stack, 'node 0 (n0)')")
    out = subprocess.run([OTHER, "-c", code], cwd=ROOT, env=without_mlite(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: node 0 (n0): error: verl=") and \
        f"the plan was composed against verl {plan['stack']['verl']['version']}" in last

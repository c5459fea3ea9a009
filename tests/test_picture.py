"""plan.svg's structure (vrun/planning/picture.py), parsed from the SVG: one bar group per pipeline stage, the GPU's memory
line, one cell per GPU, the rollout replicas; a sweep's overview only when asked (`python -m vrun show`)."""
import json
import re
import xml.etree.ElementTree as ET

import pytest

from conftest import runner
from vrun.planning import picture
from vrun.runs import cli

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

pytest.importorskip("matplotlib")


@pytest.fixture(autouse=True)
def state_dir(own_state_dir):
    return own_state_dir


def ids(svg_path):
    root = ET.parse(svg_path).getroot()
    return [e.get("id") for e in root.iter() if e.get("id")]


def paths_in(svg_path, gid):
    """The drawn paths (or uses of a defined path) inside the group with this id: one per patch of a collection."""
    root = ET.parse(svg_path).getroot()
    (group,) = [e for e in root.iter() if e.get("id") == gid]
    return [e for e in group.iter() if e.tag.rsplit("}", 1)[-1] in ("path", "use")]


def check_picture(svg, plan):
    found = ids(svg)
    m = plan["mesh"]
    stages = {int(re.match(r"stage(\d+)-", i).group(1)) for i in found if re.match(r"stage\d+-", i)}
    assert stages == set(range(m["pp"])), sorted(stages)
    for s in stages:  # both phases drawn for every stage
        assert any(i.startswith(f"stage{s}-training-") for i in found)
        assert any(i.startswith(f"stage{s}-rollout-") for i in found) == ("rollout" in plan["batch"])
    assert "gpu-limit" in found
    assert len(paths_in(svg, "gpu-cells")) == m["world"]
    r = plan["batch"].get("rollout")
    if r:
        assert len(paths_in(svg, "rollout-replicas")) == m["world"] // (r["tp"] * r["dp"])
    else:
        assert "rollout-replicas" not in found
    assert {i for i in found if i.startswith("time-")} == {f"time-{k}" for k in plan["time"]["phases"]}


def drawn(svg, timeout=90.0):
    """The picture a single run draws in the background, once it is there (the plan does not wait for it)."""
    import time

    end = time.monotonic() + timeout
    while not svg.exists():
        failed = svg.with_name(picture.PICTURE_FAILED)
        assert not failed.exists(), failed.read_text()
        assert time.monotonic() < end, f"{svg} not drawn in {timeout:g} s"
        time.sleep(0.1)
    return svg


def test_make_run_writes_plan_svg_and_prints_its_path(tmp_path):
    d = tmp_path / "r"
    proc = runner("model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan", f"hydra.run.dir={d}")
    assert proc.returncode == 0, proc.stderr
    assert f"picture {d}/plan.svg (drawing)" in proc.stdout.splitlines()
    step = [x for x in proc.stdout.splitlines() if x.startswith("step    ≈")]
    assert len(step) == 1 and " s (rollout " in step[0] and "GPU-hours" in step[0], proc.stdout
    check_picture(drawn(d / "plan.svg"), json.loads((d / "plan.json").read_text()))


def test_sft_picture_has_no_rollout(tmp_path):
    d = tmp_path / "sft"
    proc = runner("model=deepseek_v4_flash", "algo=sft", "mode=plan", f"hydra.run.dir={d}")
    assert proc.returncode == 0, proc.stderr
    check_picture(drawn(d / "plan.svg"), json.loads((d / "plan.json").read_text()))


def test_a_drawing_that_fails_leaves_its_reason_and_show_draws_it_again(tmp_path, capsys):
    """The background child never fails the plan: a plan.json it cannot draw leaves plan.svg.failed with the
    reason; `show` draws in the foreground."""
    import subprocess
    import sys

    from conftest import ROOT

    d = tmp_path / "r"
    proc = runner("model=qwen3_5_35b", "mode=plan", f"hydra.run.dir={d}")
    assert proc.returncode == 0, proc.stderr
    drawn(d / "plan.svg").unlink()
    good = (d / "plan.json").read_text()
    (d / "plan.json").write_text("{not json")
    child = subprocess.run([sys.executable, "-m", "vrun.planning.picture"], cwd=ROOT, capture_output=True, text=True,
                           input=json.dumps({"plan": str(d / "plan.json"), "out": str(d / "plan.svg")}) + "\n",
                           timeout=120)
    assert child.returncode == 1 and not (d / "plan.svg").exists()
    reason = (d / picture.PICTURE_FAILED).read_text()
    assert reason.startswith("RunDirError: ") and "plan.json=not JSON" in reason, reason
    (d / "plan.json").write_text(good)
    capsys.readouterr()
    assert cli.main(["status", str(d)]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("picture ")]
    assert line == [f"picture  not drawn: {reason.splitlines()[0]} (python -m vrun show {d} draws it)"], line
    assert cli.main(["show", str(d)]) == 0
    check_picture(d / "plan.svg", json.loads(good))
    capsys.readouterr()
    assert cli.main(["status", str(d)]) == 0
    assert f"picture  {d / 'plan.svg'}" in capsys.readouterr().out.splitlines()


def test_sweep_points_draw_nothing_until_shown(tmp_path, capsys):
    d = tmp_path / "s"
    proc = runner("-m", "model=qwen3_5_35b", "mesh.pp=1,2", "mesh.ep=4", "mesh.cp=4", "mode=plan",
                  f"hydra.sweep.dir={d}")
    assert proc.returncode == 0, proc.stderr
    points = sorted(p for p in d.iterdir() if (p / "plan.json").is_file())
    assert len(points) == 2 and not any((p / "plan.svg").exists() for p in points)
    assert cli.main(["show", str(d)]) == 0
    assert capsys.readouterr().out.strip() == str(d / picture.OVERVIEW)
    found = ids(d / picture.OVERVIEW)
    assert {"point-0-memory", "point-1-memory", "point-0-time", "point-1-time", "gpu-limit"} <= set(found)
    assert cli.main(["show", str(points[1])]) == 0
    assert capsys.readouterr().out.strip() == str(points[1] / "plan.svg")
    check_picture(points[1] / "plan.svg", json.loads((points[1] / "plan.json").read_text()))


def test_per_stage_memory_reads_memory_stages_when_the_plan_has_them():
    """The adapter: plan.json's memory.stages, when present, is the per-stage truth."""
    plan = {"memory": {"weights_gib": 1, "grads_gib": 1, "optimizer_gib": 1, "activations_gib": 1, "logits_gib": 0,
                       "rollout_gib": 50, "rollout_residents_gib": 3,
                       "stages": [{"stage": 0, "params_gib": 2, "grads_gib": 4, "optimizer_gib": 0,
                                   "activations_gib": 9, "transient_gib": 1, "peak_gib": 16},
                                  {"stage": 1, "params_gib": 3, "grads_gib": 6, "optimizer_gib": 0,
                                   "activations_gib": 5, "transient_gib": 1, "peak_gib": 15}]}}
    s = picture.stage_memory(plan)
    assert [x["training"]["weights"] for x in s] == [2, 3] and s[1]["rollout"]["vllm"] == 50


def test_a_sweeps_points_are_coloured_by_their_memory_verdict(tmp_path):
    """The sweep overview colours each point's bar by its verdict — fits (the GPU holds the band's high end), inside
    the band (planned with a warning), does not fit — and draws its band beside it."""
    def point(fits, may_fit):
        return {"memory": {"peak_gib": 70.0, "gpu_mem_gib": 80.0, "fits": fits, "may_fit": may_fit,
                           "band_gib": [60.0, 85.0]},
                "time": {"step_low_s": 100.0, "step_high_s": 200.0}}

    out = picture.render_overview([("a", point(True, True)), ("b", point(False, True)), ("c", point(False, False))],
                                  str(tmp_path / picture.OVERVIEW))
    root = ET.parse(out).getroot()

    def fill(gid):
        (group,) = [e for e in root.iter() if e.get("id") == gid]
        styles = " ".join(e.get("style") or "" for e in group.iter())
        return next(c for c in picture.VERDICT_COLOURS.values() if c in styles)

    assert [fill(f"point-{i}-memory") for i in range(3)] == [picture.VERDICT_COLOURS[v] for v in
                                                             ("fits", "inside the band", "does not fit")]
    assert {"point-0-band", "point-1-band", "point-2-band"} <= set(ids(out))

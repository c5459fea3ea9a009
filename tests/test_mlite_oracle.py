"""Megatron Lite's own code as the judge of the plan's mesh arithmetic (tests/support/mlite_oracle.py runs it).

- Default meshes: `init_parallel` under torch's fake process group at the first, a middle and the last rank gives
  the plan's DP and EDP, and Megatron Lite's pipeline layout function gives the plan's stage layout (plan.json
  `pipeline`), MTP placement included.
- Random meshes, 300 per model (world 8–1024, TP and ETP in 1/2/4/8 as the models' tp_allowed lists go): the plan's
  mesh rules (`vrun.estimate.mesh.mesh_problems`; batch and rollout checks are not mesh rules) accept exactly the meshes
  Megatron Lite's init, layout and model-family rules accept — apart from DELIBERATE, where the plan is stricter on
  purpose and says why.
Each comparison is also run once on a planted disagreement and must name it.

Needs a Megatron-LM checkout (MLITE_ROOT or VRUN_TEST_MLITE_ROOT), torch and megatron-core (the layout function
uses its PipelineParallelLayerLayout). Which of Megatron Lite's rules run as its code and which are read from its
source (GLM-5, DeepSeek-V4 and Kimi's model modules import transformer_engine, a CUDA-only package) is listed in
the oracle's docstring. Nothing is mocked.
"""
from __future__ import annotations

import functools
import importlib.util
import math
import random

import pytest

from conftest import MODELS, compose, needs_real_mlite, plan, run_mlite_script
from vrun.planning import phases
from vrun.estimate.memory import stage_layout
from vrun.estimate.mesh import Mesh, mesh_problems
from vrun.config.schema import Arch



def _has_megatron_core() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


pytestmark = [needs_real_mlite, pytest.mark.skipif(
    not _has_megatron_core(),
    reason="megatron-core is not installed: Megatron Lite's pipeline layout function needs it "
           "(pip install megatron-core; the a6ef5009 CI leg has it)")]

MESHES_PER_MODEL = 300
# where the plan refuses a mesh Megatron Lite would build, on purpose: the phrase in the plan's reason → why
DELIBERATE = {
    "decoder layers, fewer than": "more pipeline stages than decoder layers leaves stages with no decoder layer "
                                  "(Megatron Lite builds them; they only wait)",
}


@functools.lru_cache(maxsize=None)
def model_cfg(model: str) -> dict:
    return compose([f"model={model}", "mode=plan"])["model"]


def facts(model: str) -> dict:
    a = model_cfg(model)["arch"]
    return {k: a.get(k) for k in ("layers", "heads", "kv_heads", "routed_experts", "gdn_k_heads", "gdn_v_heads",
                                  "mtp_layers")}


def oracle(cases: list[dict], processes: int = 2) -> list[dict]:
    """Verdicts for the cases, in order; the cases are split over a few processes (each init builds every
    process group of the world, which is most of the time)."""
    return run_mlite_script("mlite_oracle.py", cases, processes=processes, timeout=900, cuda_hidden=False)


def case(model: str, m: Mesh, ranks=(0,)) -> dict:
    return {"family": model_cfg(model)["mlite_name"], "facts": facts(model), "ranks": list(ranks),
            "mesh": {"tp": m.tp, "etp": m.etp, "ep": m.ep, "pp": m.pp, "vpp": m.vpp, "cp": m.cp, "world": m.world}}


# ---------------------------------------------------------------- default meshes: DP, EDP, layout


def layout_differences(plan_stages: list[dict], verdict: dict) -> list[str]:
    out = []
    theirs = verdict["stages"]
    if len(theirs) != len(plan_stages):
        return [f"{len(plan_stages)} stages planned, Megatron Lite builds {len(theirs)}"]
    for s, (ours, real) in enumerate(zip(plan_stages, theirs)):
        real_range = [real["layers"][0], real["layers"][-1]] if real["layers"] else []
        if real["layers"] != list(range(real_range[0], real_range[1] + 1)) if real_range else False:
            out.append(f"stage {s}: Megatron Lite's layers are not contiguous: {real['layers']}")
        if ours["layers"] != real_range or ours["mtp"] != real["mtp"]:
            out.append(f"stage {s}: plan layers {ours['layers']} mtp {ours['mtp']}, Megatron Lite {real_range} "
                       f"mtp {real['mtp']}")
    return out


@pytest.fixture(scope="module")
def defaults() -> dict:
    plans = {m: plan([f"model={m}", "mode=plan"] + (["algo=sft"] if m.startswith("deepseek") else []))
             for m in MODELS}
    # the mtp_enable verl_mlite passes (the model config's mtp.enable overwrites impl_cfg's)
    cases = [dict(case(m, p.mesh, ranks=(0, p.mesh.world // 2, p.mesh.world - 1)),
                  mtp_enable=phases.mtp_enabled(p.config, p.entrypoint, p.verl)) for m, p in plans.items()]
    return {m: (p, v) for (m, p), v in zip(plans.items(), oracle(cases))}


@pytest.mark.parametrize("model", MODELS)
def test_default_mesh_dp_edp_and_layout_equal_megatron_lite(defaults, model):
    """init_parallel at the first, a middle and the last rank gives the plan's DP and EDP; the layout function
    gives the plan's stage layout, MTP included."""
    p, v = defaults[model]
    assert v["ok"], v
    assert {(r["dp"], r["edp"]) for r in v["ranks"].values()} == {(p.mesh.dp, p.mesh.edp)}
    assert sorted(int(r) for r in v["ranks"]) == [0, p.mesh.world // 2, p.mesh.world - 1]
    assert [v["ranks"][str(r)]["pp_rank"] for r in (0, p.mesh.world - 1)] == [0, p.mesh.pp - 1]
    assert layout_differences(p.pipeline, v) == []


def test_layout_comparison_names_a_planted_mtp_mistake(defaults):
    """A layout that counts GLM-5's MTP layer (Megatron Lite builds none unless impl_cfg.mtp_enable) differs."""
    p, v = defaults["glm5_1"]
    wrong = [{"layers": [u[1] for u in units if u[0] == "layer"], "mtp": any(u[0] == "mtp" for u in units)}
             for units in stage_layout(p.mesh.pp, p.config.model.arch.layers, 1)]
    wrong = [{"layers": [s["layers"][0], s["layers"][-1]] if s["layers"] else [], "mtp": s["mtp"]} for s in wrong]
    found = layout_differences(wrong, v)
    assert found and any("mtp True" in line for line in found), found


# ---------------------------------------------------------------- random meshes: same accept set


def _log_uniform(rnd: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], uniform in log space: every size from 8 to 1024 GPUs gets its share."""
    return max(lo, min(hi, round(math.exp(rnd.uniform(math.log(lo), math.log(hi + 1))) - 0.5)))


def random_meshes(model: str, n: int) -> list[Mesh]:
    rnd = random.Random(f"mesh-oracle-{model}")
    mc = model_cfg(model)
    layers = mc["arch"]["layers"]
    out = []
    while len(out) < n:
        # TP/ETP mostly from what the model allows, sometimes any of 1/2/4/8 (which the plan and Megatron Lite
        # must then refuse alike)
        tp = rnd.choice(mc["tp_allowed"] if rnd.random() < 0.7 else [1, 2, 4, 8])
        etp = rnd.choice(mc["etp_allowed"] if rnd.random() < 0.7 else [1, 2, 4, 8])
        ep = rnd.choice([1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128])
        cp, pp = rnd.choice([1, 2, 3, 4, 8]), rnd.choice([1, 2, 3, 4, 5, 8, 16, layers + rnd.randint(1, 3)])
        vpp = rnd.choice([1] * 9 + [2])
        gpn = rnd.choice([4, 8])
        unit = math.lcm(tp * cp * pp, etp * ep * pp, gpn)
        if rnd.random() < 0.6 and unit <= 1024:  # a world both decompositions divide, most of the time
            world = unit * _log_uniform(rnd, max(1, -(-8 // unit)), 1024 // unit)
        else:
            world = gpn * _log_uniform(rnd, max(1, 8 // gpn), 1024 // gpn)
        if 8 <= world <= 1024:
            out.append(Mesh(world // gpn, gpn, tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp, cp=cp))
    return out


def plan_accepts(model: str, m: Mesh, drop: str = "") -> tuple[bool, list[str]]:
    mc = model_cfg(model)
    found = mesh_problems(m, Arch.of(mc["arch"]), mc["tp_allowed"], mc["etp_allowed"], model)
    whys = [p.why for p in found if not (drop and drop in p.why)]
    return not whys, whys


def disagreements(model: str, meshes: list[Mesh], verdicts: list[dict], drop: str = "") -> list[str]:
    out = []
    for m, v in zip(meshes, verdicts):
        ours, whys = plan_accepts(model, m, drop)
        if ours == v["ok"]:
            continue
        if not ours and all(any(k in w for k in DELIBERATE) for w in whys):
            continue
        out.append(f"{model} {m.nnodes}x{m.gpus_per_node} tp{m.tp} etp{m.etp} ep{m.ep} cp{m.cp} pp{m.pp} "
                   f"vpp{m.vpp}: plan {'accepts' if ours else 'refuses (' + '; '.join(whys) + ')'}, Megatron Lite "
                   f"{'accepts' if v['ok'] else 'refuses (' + v['error'] + ')'}")
    return out


@pytest.fixture(scope="module")
def random_verdicts() -> dict:
    meshes = {m: random_meshes(m, MESHES_PER_MODEL) for m in MODELS}
    cases = [case(m, mesh) for m in MODELS for mesh in meshes[m]]
    verdicts = iter(oracle(cases))
    return {m: (meshes[m], [next(verdicts) for _ in meshes[m]]) for m in MODELS}


@pytest.mark.parametrize("model", MODELS)
def test_plan_accepts_exactly_what_megatron_lite_accepts(random_verdicts, model):
    """300 random meshes: accepted by the plan's mesh rules exactly when Megatron Lite accepts them; where they
    are built, the DP and EDP agree too."""
    meshes, verdicts = random_verdicts[model]
    assert disagreements(model, meshes, verdicts) == []
    accepted = [(m, v) for m, v in zip(meshes, verdicts) if v["ok"]]
    assert len(accepted) >= 30, f"only {len(accepted)} of {len(meshes)} random meshes valid: the sample is too thin"
    assert all((v["ranks"]["0"]["dp"], v["ranks"]["0"]["edp"]) == (m.dp, m.edp) for m, v in accepted)


def test_a_dropped_mesh_rule_is_named(random_verdicts):
    """With the EP-divides-routed-experts rule dropped from the plan's side, the comparison names a mesh."""
    meshes, verdicts = random_verdicts["glm5_1"]  # 256 experts: EP 3, 6 or 12 cannot divide them
    found = disagreements("glm5_1", meshes, verdicts, drop="routed experts")
    assert found and "plan accepts" in found[0] and "is not divisible by" in found[0], found[:3]

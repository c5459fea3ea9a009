"""Megatron Lite's mesh rules: each fires on a mesh that breaks it, none fires on the presets."""
import pytest

from conftest import MODELS, compose, problems_of
from vrun.estimate.mesh import Mesh, mesh_problems
from vrun.config.schema import Arch

GLM = Arch(layers=78, routed_experts=256, heads=64, kv_heads=64)
KIMI = Arch(layers=61, routed_experts=384, heads=64)
QWEN = Arch(layers=40, routed_experts=256, heads=16, kv_heads=2, gdn_k_heads=16, gdn_v_heads=32)
ANY = [1, 2, 4, 8]


def launcher_formula_ok(m: Mesh) -> bool:
    """The shell launchers' check (wrong: ignores CP, uses TP·EP)."""
    n = m.world
    return n % m.pp == 0 and (n // m.pp) % (m.tp * m.ep) == 0 and (n // m.pp) % (m.etp * m.ep) == 0


def keys(problems):
    return [p.key for p in problems]


@pytest.mark.parametrize("preset,model", [("8gpu", "qwen3_5_35b"), ("128gpu", "deepseek_v4_flash"),
                                          ("256gpu", "glm5_1"), ("256gpu", "kimi_k2_6"),
                                          ("512gpu", "deepseek_v4_pro")])
def test_launcher_presets_pass(preset, model):
    """The launchers' own meshes plan for their models (DeepSeek-V4-Pro's launcher is SFT: under RL its rollout
    replica would not hold the weights)."""
    sft = ["algo=sft"] if model == "deepseek_v4_pro" else []
    assert problems_of([f"model={model}", f"mesh={preset}", "mode=plan"] + sft) == []


def test_launcher_formula_wrongly_rejects_valid_mesh():
    """8 GPUs TP2 EP8 PP1 CP1: the launcher says invalid, Megatron Lite (and the plan) accept it."""
    m = Mesh(1, 8, tp=2, ep=8, cp=1, pp=1)
    assert not launcher_formula_ok(m)
    assert mesh_problems(m, KIMI, ANY, ANY, "kimi_k2_6") == []
    # (8 GPUs cannot hold Kimi's weights: the plan's memory verdicts refuse it, its mesh checks do not)
    found = problems_of(["model=kimi_k2_6", "mesh=8gpu", "mesh.tp=2", "mesh.cp=1", "mode=plan",
                         "verl.actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    assert [x for x in found if not x.startswith("error: memory=") and "alone" not in x] == []


def test_launcher_formula_wrongly_accepts_invalid_mesh():
    """64 GPUs PP2 EP8 CP3: the launcher says valid, init_parallel fails, the plan rejects it."""
    m = Mesh(8, 8, pp=2, ep=8, cp=3)
    assert launcher_formula_ok(m)
    assert "mesh.cp" in keys(mesh_problems(m, GLM, [1], [1], "glm5_1"))
    lines = problems_of(["model=glm5_1", "mesh.nnodes=8", "mesh.pp=2", "mesh.ep=8", "mesh.cp=3", "mode=plan"])
    assert any(line.startswith("error: mesh.cp=3:") and "64" in line and "1·3·2=6" in line for line in lines)


def test_dense_rule_counts_cp():
    """world % (tp·cp·pp) fires with the numbers and the CP values that fit."""
    (p,) = mesh_problems(Mesh(32, 8, pp=8, ep=8, cp=3), GLM, [1], [1], "glm5_1")
    assert p.key == "mesh.cp" and "256" in p.why and "24" in p.why and "[1, 2, 4, 8, 16, 32]" in p.fix


def test_expert_rule():
    """world % (etp·ep·pp) fires when EP·PP does not tile the world."""
    ps = mesh_problems(Mesh(1, 8, ep=16, cp=1), Arch(layers=4, routed_experts=256, heads=8), ANY, ANY, "m")
    assert "mesh.ep" in keys(ps)


def test_vpp_must_be_one():
    """vpp > 1 is NotImplementedError in Megatron Lite."""
    assert "mesh.vpp" in keys(mesh_problems(Mesh(1, 8, ep=8, cp=8, vpp=2), QWEN, ANY, ANY, "qwen"))


def test_ep_divides_experts():
    """EP must divide the routed experts (Kimi has 384: EP 256 fails)."""
    ps = mesh_problems(Mesh(32, 8, ep=256, cp=1), KIMI, ANY, ANY, "kimi_k2_6")
    assert any(p.key == "mesh.ep" and "384" in p.why for p in ps)


def test_tp_not_allowed_for_dsa_models():
    """GLM5 / DS4: TP or ETP > 1 is NotImplementedError."""
    assert keys(mesh_problems(Mesh(1, 8, tp=2, ep=8, cp=1), GLM, [1], [1], "glm5_1")) == ["mesh.tp"]
    assert keys(mesh_problems(Mesh(1, 8, etp=2, ep=4, cp=1), GLM, [1], [1], "glm5_1")) == ["mesh.etp"]


def test_tp_divides_heads_and_kv_heads():
    """Qwen3.5 has 2 KV heads: TP4 fails on them, TP2 passes."""
    ps = mesh_problems(Mesh(1, 8, tp=4, ep=8, cp=2), QWEN, ANY, ANY, "qwen3_5_35b")
    assert any(p.key == "mesh.tp" and "2 KV heads" in p.why for p in ps)
    assert mesh_problems(Mesh(1, 8, tp=2, ep=8, cp=4), QWEN, ANY, ANY, "qwen3_5_35b") == []


def test_deepep_excludes_etp():
    """use_deepep with etp > 1 is rejected."""
    ps = mesh_problems(Mesh(1, 8, etp=2, ep=4, cp=1), KIMI, ANY, ANY, "kimi_k2_6", use_deepep=True)
    assert "mesh.etp" in keys(ps)
    lines = problems_of(["model=kimi_k2_6", "mesh=8gpu", "mesh.etp=2", "mesh.ep=4", "mesh.cp=1",
                         "+engine.impl_cfg.use_deepep=true", "mode=plan"])
    assert any("use_deepep" in line for line in lines)


def test_pp_beyond_layers():
    """More pipeline stages than decoder layers cannot be laid out."""
    assert "mesh.pp" in keys(mesh_problems(Mesh(64, 8, pp=64, ep=8, cp=1), QWEN, ANY, ANY, "qwen3_5_35b"))


def test_ds4_rollout_tp_divides_o_groups():
    """DS4-Flash has 8 o_groups: rollout TP 16 fails, the plan names the knob."""
    lines = problems_of(["model=deepseek_v4_flash", "algo=grpo", "mode=plan",
                         "verl.actor_rollout_ref.rollout.tensor_model_parallel_size=16"])
    assert any("o_groups" in line and line.startswith("error: actor_rollout_ref.rollout.tensor_model_parallel_size=16")
               for line in lines)


def test_trainer_nodes_owned_by_mesh():
    """trainer.nnodes cannot be set apart from the mesh."""
    lines = problems_of(["model=glm5_1", "verl.trainer.nnodes=4", "mode=plan"])
    assert any("verl.trainer.nnodes=4" in line and "mesh.nnodes" in line for line in lines)


@pytest.mark.parametrize("model", MODELS)
def test_default_mesh_passes(model):
    """Each model's default mesh is valid for it."""
    cfg = compose([f"model={model}"])
    m = cfg["model"]
    assert mesh_problems(Mesh.of(cfg["mesh"]), Arch.of(m["arch"]), m["tp_allowed"], m["etp_allowed"], model) == []


def test_mesh_override_wins_over_model_default():
    """model=glm5_1 mesh=128gpu gives 128 GPUs; mesh.pp=4 changes one knob."""
    assert compose(["model=glm5_1", "mesh=128gpu"])["mesh"]["nnodes"] == 16
    assert compose(["model=glm5_1", "mesh.pp=4"])["mesh"] == {**compose(["model=glm5_1"])["mesh"], "pp": 4}

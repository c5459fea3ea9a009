"""The rollout phase of a colocated step: KV bytes by attention type, weights per replica, sequences that fit, the
replica mesh=auto chooses, and the GPU table."""
import pytest

from conftest import MODELS, compose, needs_dapo, plan, problems_of, runner
from vrun import hardware, rollout
from vrun.entrypoints.ppo import ppo_batch_problems
from vrun.mesh import mesh_problems, rollout_problems
from vrun.schema import Arch
from vrun.problems import PlanError

GIB = 1024 ** 3


def arch(model, **kw):
    return {**compose([f"model={model}"])["model"]["arch"], **kw}


def test_kv_mla_is_one_latent_per_layer_not_split_by_tp():
    """Kimi: 61 layers × (512 + 64) × 2 B = 70272 B/token, the same at TP 1 and 8."""
    for tp in (1, 8):
        kv = rollout.kv_bytes(arch("kimi_k2_6"), tp, 2, 3072)
        assert kv.per_token == 61 * 576 * 2 and kv.per_sequence == 0 and not kv.estimate


def test_kv_mla_dsa_adds_the_fp8_indexer_keys():
    """GLM-5: 78 × (576·2 + 128 + 128/128·4) = 78 × 1284 B/token."""
    assert rollout.kv_bytes(arch("glm5_1"), 2, 2, 3072).per_token == 78 * 1284


def test_kv_gdn_hybrid_hand_computed():
    """Qwen3.5 at TP 2: 10 full-attention layers × 2 × (2/2 = 1 KV head) × 256 × 2 B per token; per sequence
    30 GDN layers × (3·(2·16·128 + 32·128)/2 + 32/2·128·128) × 2 B, labelled an estimate."""
    kv = rollout.kv_bytes(arch("qwen3_5_35b"), 2, 2, 3072)
    assert kv.per_token == 10 * 2 * 1 * 256 * 2
    assert kv.per_sequence == 30 * (3 * 8192 / 2 + 16 * 128 * 128) * 2 and kv.estimate


def test_kv_compressed_attention_hand_computed():
    """DeepSeek-V4 layers 0, 4, 128, 4: ratio 4 keeps 512·2/4 + (128 + 4)/4 B/token, ratio 128 keeps 512·2/128;
    every layer keeps a 128-token window of 512·2 B per sequence; labelled an estimate."""
    a = arch("deepseek_v4_flash", layers=4, compress_ratios=[0, 4, 128, 4])
    kv = rollout.kv_bytes(a, 1, 2, 3072)
    assert kv.per_token == 2 * (256 + 33) + 8 and kv.per_sequence == 4 * 128 * 1024 and kv.estimate


def test_estimate_arithmetic():
    """10 B dense + 100 B routed params in bf16, TP 4 · DP 2 on 16 GPUs of 80 GiB at 0.5: weights
    (10/4 + 100/8)·2 B; KV = 40 GiB − weights − 2 GiB; the replica's DP ranks each hold their own sequences."""
    a = arch("kimi_k2_6")
    r = rollout.estimate(a, (10e9, 100e9), world=16, rollout_tp=4, rollout_dp=2, gpu_mem_gib=80, utilization=0.5,
                         seq_len=1000, step_sequences=100)
    assert r.weights == pytest.approx((10e9 / 4 + 100e9 / 8) * 2)
    assert r.kv_cache == pytest.approx(40 * GIB - r.weights - 2 * GIB)
    assert r.fits == 2 * int(r.kv_cache // (1000 * 61 * 576 * 2))
    assert r.replicas == 2 and r.step_share == 50
    fp8 = rollout.estimate(a, (10e9, 100e9), world=16, rollout_tp=4, rollout_dp=2, gpu_mem_gib=80,
                           utilization=0.5, seq_len=1000, step_sequences=100, quantization="fp8")
    assert fp8.weights == pytest.approx(r.weights / 2)


def test_choices_follow_the_rules():
    """DeepSeek-V4-Flash on 3×4: TP within a node dividing its 8 o_groups (1, 2, 4), replicas tiling 12 GPUs
    within a node or whole nodes; every choice passes the plan's rollout check."""
    a = arch("deepseek_v4_flash")
    got = rollout.choices(12, 4, a)
    assert {t for t, _ in got} == {1, 2, 4}
    assert all((t * d) in (1, 2, 4, 12) for t, d in got)
    mesh = __import__("vrun.mesh", fromlist=["Mesh"]).Mesh(3, 4)
    assert all(rollout_problems(mesh, t, Arch.of(a), "deepseek_v4_flash") == [] for t, _ in got)


def test_gpu_table_and_override():
    """cluster.gpu gives the memory; cluster.gpu_mem_gib overrides it; an unknown part is a one-line error."""
    assert hardware.gpu_mem_gib({"gpu": "H200"}) == (141.0, [])
    assert hardware.gpu_mem_gib({"gpu": "b200", "gpu_mem_gib": 170}) == (170.0, [])
    mem, (p,) = hardware.gpu_mem_gib({"gpu": "X1"})
    assert mem is None and p.key == "cluster.gpu" and "H200" in p.fix
    mem, (p,) = hardware.gpu_mem_gib({"gpu": "H100", "gpu_mem_gib": -1})
    assert mem is None and p.key == "cluster.gpu_mem_gib"
    h200 = plan(["model=glm5_1", "mesh=256gpu", "mode=plan", "cluster.gpu=H200"])
    assert h200.memory.gpu_mem == 141 * GIB and h200.memory.rollout_detail.budget == 0.8 * 141 * GIB


def test_unknown_gpu_exits_with_one_line(tmp_path):
    proc = runner("model=glm5_1", "cluster.gpu=X100", "mode=plan", f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[0].startswith("error: cluster.gpu=X100: ")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("algo", ["grpo", "dapo", "sft"])
def test_every_model_and_algo_has_an_estimate(model, algo):
    """Training phase for all; the rollout phase (weights, KV, sequences) for RL; assumptions always."""
    if algo == "dapo":
        needs_dapo()
    e = plan([f"model={model}", f"algo={algo}", "mode=plan"]).memory
    assert e is not None and e.train_peak > 0 and e.assumptions
    assert (e.rollout_detail is not None) == (algo != "sft")


def test_make_run_prints_both_phases(tmp_path):
    """GLM-5.1 GRPO on 256 GPUs: training, rollout phase, KV capacity, params, assumptions; the launcher's
    rollout TP2 cannot hold GLM-5.1's bf16 weights, which the plan says."""
    proc = runner("model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan", f"hydra.run.dir={tmp_path}/r")
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    for want in ("GiB training", "rollout phase: vLLM", "KV cache", "KiB/token per GPU", "sequences per replica",
                 "params  ", "assume  "):
        assert want in out, want
    assert "no estimate" not in out
    assert "less than one 3072-token prompt+response" in out


def test_preflight_refuses_a_rollout_that_holds_no_sequence():
    """A prompt+response that does not fit the KV cache is an error in preflight (a warning in the plan)."""
    from vrun import preflight

    p = plan(["model=glm5_1", "mesh=256gpu", "mode=plan"])
    errors = [x for x in preflight.memory_problems(p) if not x.warning]
    assert errors and errors[0].key == "actor_rollout_ref.rollout.gpu_memory_utilization"


def test_warns_when_the_kv_cache_holds_less_than_a_replicas_share():
    """Qwen3.5 on 8 GPUs, one replica of 8 at 0.1 of the GPU, long responses: a warning with the numbers."""
    p = plan(["model=qwen3_5_35b", "mode=plan", "verl.actor_rollout_ref.rollout.gpu_memory_utilization=0.15",
              "verl.data.max_response_length=16384", "verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu=17408"])
    r = p.memory.rollout_detail
    assert 1 <= r.fits < r.step_share
    assert any("fewer than the" in w.why for w in p.warnings)


@pytest.mark.parametrize("ov", [["model=qwen3_5_35b", "mesh.nnodes=1", "mesh.gpus_per_node=4"],
                                ["model=deepseek_v4_flash", "mesh.nnodes=3", "mesh.gpus_per_node=4"],
                                ["model=deepseek_v4_flash", "algo=dapo", "mesh.nnodes=3", "mesh.gpus_per_node=4"]])
def test_auto_plans_the_rollout_too(ov):
    """The issue's two cases: a mesh and a rollout replica are found (the launcher's TP 8 does not fit 4 GPUs
    per node); every listed alternative, with its rollout TP·DP, plans without an error."""
    if "algo=dapo" in ov:
        needs_dapo()
    p = plan(ov + ["mesh=auto", "mode=plan"])
    r = p.verl["actor_rollout_ref"]["rollout"]
    assert r["tensor_model_parallel_size"] <= 4 and p.memory.rollout_detail is not None
    assert p.search.rollout_tp_choices[0]["tp"] == r["tensor_model_parallel_size"]
    for alt in [p.search.chosen, *p.search.alternatives]:
        knobs = alt["overrides"].split(" rollout ")[0].split()
        extra = [f"verl.actor_rollout_ref.rollout.tensor_model_parallel_size={r['tensor_model_parallel_size']}",
                 f"verl.actor_rollout_ref.rollout.data_parallel_size={r['data_parallel_size']}"]
        assert problems_of([o for o in ov] + knobs + extra + ["mode=plan"]) == [], alt


def test_every_listed_mesh_passes_the_checks():
    """Property: for each model and a few GPU counts, each mesh auto lists passes Megatron Lite's rules and the
    batch checks, and the chosen rollout TP passes the rollout check."""
    for model in MODELS:
        for nodes in (2, 16):
            p = plan([f"model={model}", "mesh=auto", f"mesh.nnodes={nodes}", "mode=plan"])
            m = p.config.model
            rtp = p.verl["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"]
            for alt in [p.search.chosen, *p.search.alternatives]:
                kv = dict(o.split("=") for o in alt["overrides"].split(" rollout ")[0].split())
                mesh = p.mesh.replace(**{k.split(".")[1]: int(v) for k, v in kv.items()})
                a = m.arch
                assert mesh_problems(mesh, a, m.tp_allowed, m.etp_allowed, model) == [], (model, alt)
                assert ppo_batch_problems(p.verl, mesh) == [], (model, alt)
                assert rollout_problems(mesh, rtp, a, model) == [], (model, alt)


def test_no_mesh_names_the_binding_constraint():
    """7 prompts × 5 samples without dynamic batching: verl needs 35 divisible by all 12 GPUs, so no mesh passes;
    the error names the batch key and its fix, not just the GPU count."""
    with pytest.raises(PlanError) as e:
        plan(["model=deepseek_v4_flash", "mesh=auto", "mesh.nnodes=3", "mesh.gpus_per_node=4", "mode=plan",
              "verl.data.train_batch_size=7", "verl.actor_rollout_ref.rollout.n=5",
              "verl.actor_rollout_ref.actor.ppo_mini_batch_size=7", "verl.actor_rollout_ref.actor.use_dynamic_bsz=false"])
    line = e.value.problems[-1].line()
    assert "binding: data.train_batch_size=7" in line and "fix: data.train_batch_size a multiple of" in line


def test_auto_keeps_a_rollout_tp_given_on_the_command_line():
    """verl.actor_rollout_ref.rollout.tensor_model_parallel_size=4 with mesh=auto: only TP 4 replicas."""
    p = plan(["model=qwen3_5_35b", "mesh=auto", "mode=plan",
              "verl.actor_rollout_ref.rollout.tensor_model_parallel_size=4"])
    assert p.verl["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] == 4
    assert {c["tp"] for c in p.search.rollout_tp_choices} == {4}

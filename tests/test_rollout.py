"""The rollout phase of a colocated step: KV bytes by attention type, weights per replica, sequences that fit, the
replica mesh=auto chooses, and the GPU table."""
import pytest

from conftest import MODELS, compose, needs_dapo, plan, problems_of, runner
from vrun.estimate import hardware, rollout
from vrun.entrypoints.ppo import ppo_batch_problems
from vrun.estimate.mesh import mesh_problems, rollout_problems
from vrun.config.schema import Arch
from vrun.core.problems import PlanError

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

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
    (10/4 + 100/8)·2 B; KV = 40 GiB − weights − vLLM's reserve (its terms); the replica's DP ranks each hold their
    own sequences, each sequence in whole KV blocks (MLA: 64 tokens, so 1000 tokens take 1024)."""
    a = arch("kimi_k2_6")
    r = rollout.estimate(a, (10e9, 100e9), world=16, rollout_tp=4, rollout_dp=2, gpu_mem_gib=80, utilization=0.5,
                         seq_len=1000, step_sequences=100)
    assert r.weights == pytest.approx((10e9 / 4 + 100e9 / 8) * 2)
    assert r.reserve == pytest.approx(sum(b for _, b in r.reserve_terms))
    assert r.kv_cache == pytest.approx(40 * GIB - r.weights - r.reserve)
    assert r.fits == 2 * int(r.kv_cache // (1024 * 61 * 576 * 2))
    assert r.fits_band[0] <= r.fits <= r.fits_band[1]
    assert r.replicas == 2 and r.step_share == 50
    fp8 = rollout.estimate(a, (10e9, 100e9), world=16, rollout_tp=4, rollout_dp=2, gpu_mem_gib=80,
                           utilization=0.5, seq_len=1000, step_sequences=100, quantization="fp8")
    assert fp8.weights == pytest.approx(r.weights / 2, rel=1e-3)   # fp8 with its block scales


def test_the_reserve_is_vllms_accounting():
    """vLLM 0.24.0 takes from its budget, before the KV cache, the profile run's activations for
    max_num_batched_tokens tokens, the dummy sampler's sort over min(max_num_seqs, tokens) requests × the vocabulary
    (24 B each), CUDA graphs for min(2·max_num_seqs, 512) tokens (none when eager) and non-torch buffers; every
    term grows with what sets it."""
    a = arch("kimi_k2_6")
    base = rollout.reserve(a, tp=8, dp=1, ep=1)
    assert base["sampler"] == pytest.approx(256 * a["vocab"] * 24)
    assert base["cuda_graphs"] == pytest.approx(base["activations"] * 512 / 8192)
    assert base["non_torch"] == rollout.NON_TORCH
    more = rollout.reserve(a, tp=8, dp=1, ep=1, max_num_batched_tokens=16384, max_num_seqs=1024)
    assert more["activations"] == pytest.approx(2 * base["activations"])
    assert more["sampler"] == pytest.approx(4 * base["sampler"])
    assert rollout.reserve(a, tp=8, dp=1, ep=1, enforce_eager=True)["cuda_graphs"] == 0
    # whole experts on each rank with expert parallelism: a wider FFN per routed copy than split over TP·DP
    assert rollout.reserve(a, tp=8, dp=8, ep=64)["activations"] > rollout.reserve(a, tp=8, dp=8, ep=1)["activations"]


def test_released_formats_and_config_json():
    """DeepSeek-V4's released FP8 + FP4 checkpoint: 1 B dense and 0.53 B per expert param; a config.json's
    quantization_config / expert_dtype wins over the model group."""
    a = arch("deepseek_v4_flash")
    f = rollout.Formats("fp8", "fp4")
    r = rollout.estimate(a, (8e9, 100e9), world=8, rollout_tp=8, gpu_mem_gib=80, utilization=0.6, seq_len=1000,
                         step_sequences=8, formats=f)
    assert r.weights == pytest.approx(8e9 / 8 * (1 + 4 / 128 ** 2) + 100e9 / 8 * (0.5 + 1 / 32))
    assert rollout.formats_from_config({"quantization_config": {"quant_method": "fp8"}, "expert_dtype": "fp4"}) == \
        rollout.Formats("fp8", "fp4", "checkpoint config.json quantization_config")
    assert rollout.formats_from_config({"quantization_config": {"quant_method": "mxfp4"}}).experts == "fp4"
    assert rollout.formats_from_config({"torch_dtype": "bfloat16"}) is None


def test_expert_ffn_width_divides_tp_dp_without_expert_parallelism():
    """vLLM flattens TP across DP for MoE layers without EP: the expert FFN width must divide TP·DP; with EP the
    routed experts must."""
    a = dict(arch("glm5_1"), expert_ffn_hidden=96)          # 96 = 2^5·3: 64 GPUs cannot split it
    assert all(96 % (t * d) == 0 for t, d in rollout.choices(256, 8, a))
    assert (8, 8) not in rollout.choices(256, 8, a) and (8, 8) in rollout.choices(256, 8, a, expert_parallel=True)


def test_choices_follow_the_rules():
    """DeepSeek-V4-Flash on 3×4: TP within a node dividing its 8 o_groups (1, 2, 4), replicas tiling 12 GPUs
    within a node or whole nodes; every choice passes the plan's rollout check."""
    a = arch("deepseek_v4_flash")
    got = rollout.choices(12, 4, a)
    assert {t for t, _ in got} == {1, 2, 4}
    assert all((t * d) in (1, 2, 4, 12) for t, d in got)
    mesh = __import__("vrun.estimate.mesh", fromlist=["Mesh"]).Mesh(3, 4)
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
    # DeepSeek-V4-Pro under RL: the deepseek launcher's rollout TP8 cannot hold 1.6T parameters (refused, with the
    # replica that fits) and its training estimate is over 80 GiB (refused unless allowed)
    extra = ["verl.actor_rollout_ref.rollout.tensor_model_parallel_size=2",
             "+verl.actor_rollout_ref.rollout.data_parallel_size=16", "run.allow_memory_overrun=true"] \
        if model == "deepseek_v4_pro" and algo != "sft" else []
    e = plan([f"model={model}", f"algo={algo}", "mode=plan"] + extra).memory
    assert e is not None and e.train_peak > 0 and e.assumptions
    assert (e.rollout_detail is not None) == (algo != "sft")


def test_make_run_prints_both_phases(tmp_path):
    """GLM-5.1 GRPO on 256 GPUs (`make run`): training, rollout phase, KV capacity, params, assumptions; both
    phases fit, and nothing says otherwise."""
    proc = runner("model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan", f"hydra.run.dir={tmp_path}/r")
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    for want in ("GiB training", "rollout phase: vLLM", "KV cache", "KiB/token per GPU", "sequences per replica",
                 "params  ", "assume  "):
        assert want in out, want
    assert "no estimate" not in out
    assert "(fits, " in out and "not fit" not in out.lower() and "warning: actor_rollout_ref.rollout" not in out
    r = plan(["model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan"]).memory
    assert r.fits and r.rollout_detail.holds_share and r.train_peak <= r.gpu_mem


def test_the_launchers_rollout_tp2_is_refused_with_a_replica_that_fits():
    """GLM-5.1 with the launcher's rollout TP2: one line naming the replica's size and the smallest that fits (as
    overrides); that fix plans, and fits."""
    from conftest import problems_of

    tp2 = ["model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan",
           "verl.actor_rollout_ref.rollout.tensor_model_parallel_size=2",
           "verl.actor_rollout_ref.rollout.data_parallel_size=1", "verl.actor_rollout_ref.rollout.expert_parallel_size=1"]
    (line,) = problems_of(tp2)
    assert "rollout replica TP2·DP1 (2 GPUs)" in line and "weights alone are 692.8 GiB" in line
    assert "fits" not in line.split("; fix: ")[0] and "not fit" not in line
    fix = line.split("; fix: ")[1].split(" (")[0].split()
    fixed = plan(tp2 + fix).memory
    assert fixed.fits and fixed.rollout_detail.holds_share

def test_preflight_refuses_a_rollout_that_holds_no_sequence():
    """A prompt+response that does not fit the KV cache (by the estimate) is refused at plan time unless
    run.allow_memory_overrun; allowed, it is a warning in the plan and in preflight."""
    from conftest import problems_of
    from vrun.launch import preflight

    ov = ["model=glm5_1", "mesh=256gpu", "mode=plan", "verl.actor_rollout_ref.rollout.gpu_memory_utilization=0.34"]
    (line,) = problems_of(ov)
    assert "less than one 3072-token prompt+response" in line and "run.allow_memory_overrun=true" in line
    p = plan(ov + ["run.allow_memory_overrun=true"])
    assert any("less than one" in w.why for w in p.warnings)
    found = preflight.memory_problems(p)
    assert found and all(x.warning for x in found)
    assert found[0].key == "actor_rollout_ref.rollout.tensor_model_parallel_size" and "less than one" in found[0].why
    assert "even at the reserve's low end (0–0 sequences at once as the reserve runs 0.5–2× its estimate)" in line


def test_a_kv_cache_inside_its_band_of_one_sequence_plans_with_a_warning():
    """The reserve beside vLLM's weights is approximated (×0.5–2): where one prompt+response fits at the reserve's
    low end but not at its high end, the plan is made with a warning naming the band (as the training step's
    memory inside its band), whether the estimate itself holds one or not; refused only where none fits at all."""
    from conftest import problems_of
    from vrun.launch import preflight

    base = ["model=glm5_1", "mesh=256gpu", "mode=plan"]
    for u, held in (("0.36", "it holds none by the estimate"), ("0.37", "it holds 8 at once by the estimate")):
        p = plan(base + [f"verl.actor_rollout_ref.rollout.gpu_memory_utilization={u}"])
        (w,) = [w for w in p.warnings if "prompt+response" in w.why]
        r = p.memory.rollout_detail
        assert r.fits_band[0] == 0 < r.fits_band[1], r.fits_band
        assert w.key == "actor_rollout_ref.rollout.tensor_model_parallel_size" and w.warning
        assert "the KV cache may not hold one 3072-token prompt+response" in w.why and held in w.why, w.why
        assert f"0–{r.fits_band[1]} sequences at once as the reserve runs 0.5–2× its estimate" in w.why, w.why
        assert w.fix.endswith(" to hold one at the band's end"), w.fix
        # what a launch checks (preflight: local train, SLURM's login, a Ray cluster's) keeps it a warning
        found = preflight.memory_problems(p)
        assert [x.why for x in found] == [w.why] and all(x.warning for x in found), found
    assert problems_of(base + ["verl.actor_rollout_ref.rollout.gpu_memory_utilization=0.345"])


def test_warns_when_the_kv_cache_holds_less_than_a_replicas_share():
    """Qwen3.5 on 8 GPUs, one replica of 8 at 0.1 of the GPU, long responses: a warning with the numbers."""
    p = plan(["model=qwen3_5_35b", "mode=plan", "verl.actor_rollout_ref.rollout.gpu_memory_utilization=0.15",
              "verl.data.max_response_length=16384", "verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu=17408"])
    r = p.memory.rollout_detail
    assert 1 <= r.fits < r.step_share
    assert any("fewer than the" in w.why for w in p.warnings)


# DeepSeek-V4-Flash's shards, grads and optimizer alone exceed 80 GiB on 12 GPUs: 6 nodes of 4 here
@pytest.mark.parametrize("ov", [["model=qwen3_5_35b", "mesh.nnodes=1", "mesh.gpus_per_node=4"],
                                ["model=deepseek_v4_flash", "mesh.nnodes=6", "mesh.gpus_per_node=4"],
                                ["model=deepseek_v4_flash", "algo=dapo", "mesh.nnodes=6", "mesh.gpus_per_node=4"]])
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
        # the overrides are pasteable as they are: mesh knobs and the rollout replica's verl keys; an alternative
        # listed as not fitting plans with a warning when the GPU lies inside its band, else is refused for memory
        # alone
        found = problems_of([o for o in ov] + alt["overrides"].split() + ["mode=plan"])
        if alt["fits"] or alt["band_gib"][0] <= p.memory.gpu_mem / 2 ** 30:
            assert found == [], alt
        else:
            assert found and all(line.startswith("error: memory=") for line in found), (alt, found)


def test_every_listed_mesh_passes_the_checks():
    """Property: for each model and a few GPU counts, each mesh auto lists passes Megatron Lite's rules and the
    batch checks, and the chosen rollout TP passes the rollout check."""
    from vrun.core.problems import PlanError

    planned = 0
    for model in MODELS:
        for nodes in (2, 16):
            try:  # the mesh and batch checks are the subject here, not the memory estimate
                p = plan([f"model={model}", "mesh=auto", f"mesh.nnodes={nodes}", "mode=plan",
                          "run.allow_memory_overrun=true"])
            except PlanError as e:  # only a model that cannot be held at all on these GPUs is refused
                assert all("alone" in x.why for x in e.problems), [x.line() for x in e.problems]
                continue
            planned += 1
            m = p.config.model
            rtp = p.verl["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"]
            for alt in [p.search.chosen, *p.search.alternatives]:
                kv = dict(o.split("=") for o in alt["overrides"].split() if o.startswith("mesh."))
                mesh = p.mesh.replace(**{k.split(".")[1]: int(v) for k, v in kv.items()})
                a = m.arch
                assert mesh_problems(mesh, a, m.tp_allowed, m.etp_allowed, model) == [], (model, alt)
                assert ppo_batch_problems(p.verl, mesh) == [], (model, alt)
                assert rollout_problems(mesh, rtp, a, model) == [], (model, alt)
    assert planned >= 6


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


def test_equal_sized_replicas_go_to_the_larger_kv_margin():
    """Among replicas of the same size that hold the step's share, the one holding more sequences at once ranks
    first (and the ranking's names are one list)."""
    a = arch("glm5_1")
    kw = dict(world=256, gpus_per_node=8, gpu_mem_gib=80, utilization=0.8, seq_len=3072, step_sequences=512)
    opts = rollout.choose(a, (19e9, 725e9), **kw)
    best = opts[0]
    same = [r for r in opts if r.tp * r.dp == best.tp * best.dp and r.holds_share]
    assert best.fits == max(r.fits for r in same) and len(same) > 1
    assert best.tp > min(r.tp for r in same)     # the KV margin, not the smaller TP, decides
    assert rollout.RANKING[3] == "larger KV margin"

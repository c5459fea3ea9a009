"""The memory estimate's arithmetic on fixed inputs, and its monotonic properties."""
import itertools

import pytest

from conftest import params_from_arch
from vrun.estimate.memory import GIB, Params, estimate, stage_layout
from vrun.estimate.mesh import Mesh

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

# 4 decoder layers, 1 MTP layer: dense 10 M/layer, experts 100 M/layer, embedding and output 50 M each
P = Params(embedding=50_000_000, output=50_000_000, dense_per_layer=(10_000_000,) * 4,
           expert_per_layer=(100_000_000,) * 4, mtp_dense=10_000_000, mtp_expert=100_000_000, mtp_layers=1)
BASE = dict(optimizer="dist_opt", hidden=1024, vocab=32000, top_k=2, tokens_per_gpu=4096, recompute=True,
            param_offload=False, grad_offload=False, optimizer_offload=False, offload_fraction=0.0,
            gpu_mem_gib=80.0)


def test_stage_layout_splits_units_contiguously():
    """[emb, 4 layers, 1 MTP, loss] = 7 units over PP2: 4 + 3, earlier stage takes the remainder."""
    stages = stage_layout(2, 4, 1)
    assert [len(s) for s in stages] == [4, 3]
    assert stages[0][0] == ("emb",) and stages[-1][-1] == ("loss",) and stages[1][1] == ("mtp", 0)


def test_dist_opt_hand_computed():
    """PP1 TP1 EP2 DP4 (8 GPUs): bytes written out by hand."""
    m = Mesh(1, 8, ep=2, cp=1)  # dense DP 8, EDP 4
    e = estimate(P, m, **BASE)
    dense = 50e6 + 50e6 + 4 * 10e6 + 10e6          # 150 M
    expert = 5 * 100e6 / 2                          # 250 M per EP rank
    assert e.weights == pytest.approx(2 * (dense + expert))
    assert e.grads == pytest.approx(4 * (dense + expert))
    assert e.optimizer == pytest.approx(12 * (dense / 8 + expert / 4))
    # full recompute: 1 in-flight micro-batch × 5 layers × 4096 tokens × 1024 × 2 B stored; without a per-layer
    # count (no layer_shapes) one layer's working set by the rule of thumb, held instead of the logits or beside
    assert e.activations == pytest.approx(5 * 4096 * 1024 * 2)
    assert e.layer == pytest.approx(4096 * 1024 * (34 + 8))
    assert e.logits == pytest.approx(4096 * 32000 * (2 + 4))   # bf16 logits and their fp32 copy in the loss
    assert e.transient == 0 and e.optimizer_host == 0
    assert e.peak == pytest.approx(e.weights + e.grads + e.optimizer + e.activations + max(e.layer, e.logits))


def test_fsdp2_shards_weights_and_grads():
    """fsdp2: fp32 shards and grads over DP (dense) and EDP (experts); the transient at the step's peak: the biggest
    layer unsharded twice in bf16 (in backward + prefetched) and the root's embedding and output head in bf16."""
    m = Mesh(1, 8, ep=2, cp=1)
    e = estimate(P, m, **{**BASE, "optimizer": "fsdp2"})
    sharded = 150e6 / 8 + 250e6 / 4
    assert e.weights == pytest.approx(4 * sharded)
    assert e.grads == pytest.approx(4 * sharded)
    assert e.transient == pytest.approx(2 * 2 * (10e6 + 100e6 / 2) + 2 * (50e6 + 50e6))
    assert e.optimizer == pytest.approx(12 * sharded) and e.optimizer_host == 0


def test_fsdp2_deepseek_v4_keeps_bf16_shards():
    """DeepSeek-V4's protocol passes use_fp32_shards=False: 2 B shards and grads, the same 12 B of Adam."""
    m = Mesh(1, 8, ep=2, cp=1)
    e = estimate(P, m, **{**BASE, "optimizer": "fsdp2", "family": "deepseek_v4"})
    sharded = 150e6 / 8 + 250e6 / 4
    assert e.weights == pytest.approx(2 * sharded) and e.grads == pytest.approx(2 * sharded)
    assert e.optimizer == pytest.approx(12 * sharded)


def test_fsdp2_any_offload_fraction_puts_adam_on_the_host():
    """fsdp2's AdamW updates on the host whenever offload_fraction > 0: all its states there, none on the GPU."""
    m = Mesh(1, 8, ep=2, cp=1)
    e = estimate(P, m, **{**BASE, "optimizer": "fsdp2", "offload_fraction": 0.25})
    assert e.optimizer == 0 and e.optimizer_host == pytest.approx(12 * (150e6 / 8 + 250e6 / 4))


def test_1f1b_keeps_pp_minus_s_micro_batches_on_stage_s():
    """PP4, no recompute: stage s stores (4 − s) micro-batches of its layers' activations."""
    m = Mesh(1, 8, pp=4, ep=2, cp=1)
    e = estimate(P, m, **{**BASE, "recompute": False})
    per_layer = 4096 * 1024 * (34 + 8)
    for st in e.stages:
        assert st.activations == pytest.approx((4 - st.stage) * st.layers * per_layer)
        assert st.layer == 0.0      # no recompute: the rule of thumb adds nothing for the backward


def test_busiest_stage_breaks_rollout_ties_by_training_peak():
    """With everything offloaded the rollout ties every stage: the stage shown is the one with the highest
    training peak (not the first), and plan.json lists every stage."""
    kw = {**BASE, "optimizer": "fsdp2", "rollout_fraction": 0.9, "param_offload": True, "grad_offload": True,
          "optimizer_offload": True}
    e = estimate(P, Mesh(1, 8, pp=2, ep=2, cp=1), **kw)
    assert len({st.peak for st in e.stages}) == 1
    assert e.stage == max(e.stages, key=lambda st: st.train_peak).stage
    summary = e.summary()
    assert summary["busiest_stage"] == e.stage and len(summary["stages"]) == 2
    assert set(summary["stages"][0]) >= {"params_gib", "grads_gib", "optimizer_gib", "optimizer_host_gib",
                                         "activations_gib", "transient_gib", "peak_gib"}


def test_rollout_phase_counts_residents():
    """Colocated rollout: 0.5 of 80 GiB plus what the actor leaves on the GPU."""
    e = estimate(P, Mesh(1, 8, ep=2, cp=1), **{**BASE, "rollout_fraction": 0.5, "param_offload": True,
                                                "grad_offload": True})
    assert e.rollout == pytest.approx(40 * GIB) and e.rollout_residents == pytest.approx(e.optimizer)


def test_offload_fraction_scales_optimizer():
    """offload_fraction 0.75 keeps a quarter of the optimizer states on the GPU; optimizer_offload keeps none."""
    m = Mesh(1, 8, ep=2, cp=1)
    full = estimate(P, m, **BASE).optimizer
    assert estimate(P, m, **{**BASE, "offload_fraction": 0.75}).optimizer == pytest.approx(full / 4)
    assert estimate(P, m, **{**BASE, "optimizer_offload": True}).optimizer == 0


MESHES = [m for m in (Mesh(n, 8, pp=pp, ep=ep, cp=1) for n, pp, ep in itertools.product([1, 2, 4], [1, 2, 4], [1, 2, 4, 8]))
          if m.world % m.dense == 0 and m.world % m.expert == 0]


@pytest.mark.parametrize("optimizer", ["dist_opt", "fsdp2"])
def test_more_pp_or_ep_never_raises_param_memory(optimizer):
    """Per-rank weights + grads + optimizer never grow with PP or EP (the extra stages/ranks on extra GPUs,
    same data parallelism)."""
    def states(m):
        e = estimate(P, m, **{**BASE, "optimizer": optimizer})
        return e.weights + e.grads + e.optimizer
    for m in MESHES:
        for bigger in (m.replace(pp=m.pp * 2, nnodes=m.nnodes * 2), m.replace(ep=m.ep * 2, nnodes=m.nnodes * 2)):
            if bigger.world % bigger.expert == 0 and bigger.pp <= 6:
                assert states(bigger) <= states(m) + 1, (m, bigger)


@pytest.mark.parametrize("flag", ["param_offload", "grad_offload", "optimizer_offload"])
def test_offload_never_raises_gpu_memory(flag):
    """Turning an offload on never raises the peak."""
    for m in MESHES:
        kw = {**BASE, "rollout_fraction": 0.6}
        assert estimate(P, m, **{**kw, flag: True}).peak <= estimate(P, m, **kw).peak


def test_recompute_never_raises_activations():
    """Full recompute stores less than keeping every activation."""
    for m in MESHES:
        assert estimate(P, m, **BASE).activations <= estimate(P, m, **{**BASE, "recompute": False}).activations


def test_params_from_arch_needs_the_ffn_width():
    """Without a checkpoint or arch.expert_ffn_hidden no estimate is made, and the reason says why."""
    p, why = params_from_arch({"hidden": 64, "layers": 2, "routed_experts": 4, "heads": 4, "vocab": 100})
    assert p is None and "expert_ffn_hidden" in why


def test_overrun_is_refused_at_plan_time_unless_allowed():
    """Shards, grads and optimizer alone over the GPU (fsdp2, counted as the real build does): an error, no knob.
    The band above the GPU even at its low end: refused in one line with the band, the deciding terms, the largest
    token budget that fits and run.allow_memory_overrun=true; allowed, the plan warns and preflight warns. The GPU
    inside the band: planned with a warning naming the margin."""
    from conftest import plan, problems_of
    from vrun.launch import preflight

    (certain,) = problems_of(["model=kimi_k2_6", "mesh=8gpu", "mesh.cp=1", "mode=plan", "cluster.gpu_mem_gib=40"])
    assert "alone exceed the 40 GiB" in certain and "allow_memory_overrun" not in certain
    # a smaller token budget does not shrink the states; mesh=auto is offered only where the mesh was given
    assert certain.endswith("fix: a larger PP·EP mesh or more offload, or mesh=auto"), certain
    searched = problems_of(["model=glm5_1", "mesh=auto", "mesh.nnodes=4", "algo=grpo", "mode=plan",
                            "cluster.gpu_mem_gib=20", "run.allow_memory_overrun=true"])
    states = [x for x in searched if "alone exceed" in x]
    assert len(states) == 1 and states[0].endswith("fix: a larger PP·EP mesh or more offload"), searched
    ov = ["model=kimi_k2_6", "mode=plan", "cluster.gpu_mem_gib=55"]
    (line,) = problems_of(ov)
    assert "exceeds the 55 GiB per GPU" in line and "even at its band's low end (band " in line
    assert "activations" in line and "(measured, ×0.8–1.25)" in line
    assert "fix: verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu=" in line
    assert "run.allow_memory_overrun=true" in line
    p = plan(ov + ["run.allow_memory_overrun=true"])
    assert not p.memory.may_fit and any(w.key == "memory" for w in p.warnings)
    found = preflight.memory_problems(p)
    assert found and all(x.warning for x in found)
    inside = plan(["model=kimi_k2_6", "mode=plan", "cluster.gpu_mem_gib=70"])
    assert inside.memory.may_fit and not inside.memory.fits
    (warn,) = [w for w in inside.warnings if w.key == "memory"]
    assert "lies inside the estimate's band" in warn.why and "may run out of memory by up to" in warn.why
    assert "to fit the whole band" in warn.fix and "allow_memory_overrun" not in warn.fix
    assert all(x.warning for x in preflight.memory_problems(inside))


def test_the_token_fix_fits_and_the_next_budget_does_not():
    """The refusal's token budget is the largest multiple of 1024 whose band the GPU holds: planned with it, the
    plan fits; 1024 more does not."""
    import re

    from conftest import plan, problems_of

    (line,) = problems_of(["model=kimi_k2_6", "mode=plan", "cluster.gpu_mem_gib=55"])
    tokens = int(re.search(r"ppo_max_token_len_per_gpu=(\d+)", line).group(1))
    key = "verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    ok = plan(["model=kimi_k2_6", "mode=plan", "cluster.gpu_mem_gib=55", f"{key}={tokens}"])
    assert ok.memory.fits and not [w for w in ok.warnings if w.key == "memory"]
    over = plan(["model=kimi_k2_6", "mode=plan", "cluster.gpu_mem_gib=55", f"{key}={tokens + 1024}",
                 "run.allow_memory_overrun=true"])
    assert not over.memory.fits


def test_the_mesh_fix_is_a_mesh_of_the_same_gpus_that_fits():
    """Beside the token budget, the refusal names the mesh of the same GPUs (with the configured rollout replica)
    that mesh=auto's memory ranking puts first, when its band fits; pasted, it plans below the band."""
    import re

    from conftest import plan, problems_of

    (line,) = problems_of(["model=kimi_k2_6", "optimizer=dist_opt", "mode=plan"])
    mesh = re.search(r"fix: (mesh\.tp=\S+ mesh\.pp=\S+ mesh\.ep=\S+ mesh\.cp=\S+ mesh\.etp=\S+ mesh\.vpp=\S+) \(band",
                     line).group(1)
    ok = plan(["model=kimi_k2_6", "optimizer=dist_opt", "mode=plan"] + mesh.split())
    assert ok.memory.fits and not [w for w in ok.warnings if w.key == "memory"]


def test_estimate_depends_on_world_tp_pp_ep_etp_and_cp_only():
    """mesh search memoises on (world, TP, PP, EP·ETP, CP): the EP/ETP split does not change the estimate; CP does
    where an attention gathers the CP group's sequence (Kimi-K2's MLA: value head 128, query head 192)."""
    from vrun.estimate import activations

    a = estimate(P, Mesh(2, 8, pp=2, ep=4, etp=1, cp=2), **BASE)
    b = estimate(P, Mesh(2, 8, pp=2, ep=2, etp=2, cp=2), **BASE)
    assert a.peak == b.peak and a.weights == b.weights and a.optimizer == b.optimizer
    mla = dict(attention="mla", layers=4, hidden=1024, heads=8, q_lora_rank=256, kv_lora_rank=128,
               qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, routed_experts=8, experts_per_token=2,
               expert_ffn_hidden=256, shared_experts=1)
    shapes = (activations.shape(mla, 1), activations.shape(mla, 2))
    on = {**BASE, "layer_shapes": shapes}
    cp2, cp4 = (estimate(P, Mesh(2, 8, pp=2, ep=2, cp=c), **on) for c in (2, 4))
    a, b = cp2.stages[0], cp4.stages[0]
    assert a.params == b.params and b.layer > a.layer    # the gathered sequence grows with CP


def test_plan_json_has_every_stage_and_the_table_names_the_busiest():
    """GLM-5.1 on 256 GPUs (everything offloaded, the rollout ties every stage): plan.json's memory.stages has the
    8 stages with their parts and bands, memory.busiest_stage is stage 1 (the highest training peak: 7 micro-batches
    in flight over 10 layers), and the table says so."""
    from conftest import plan
    from vrun.planning.report import plan_json, table

    p = plan(["model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan"])
    mem = plan_json(p)["memory"]
    assert len(mem["stages"]) == 8 and mem["busiest_stage"] == 1
    for s in mem["stages"]:
        assert s["params_gib"] > 0 and s["optimizer_gib"] == 0 and s["optimizer_host_gib"] > s["params_gib"]
        assert s["peak_gib"] >= s["params_gib"] + s["grads_gib"] + s["activations_gib"] + s["transient_gib"] \
            + max(s["layer_backward_gib"], s["logits_gib"]) - 0.1
        assert s["band_gib"][0] <= s["peak_gib"] <= s["band_gib"][1]
    assert mem["stages"][7]["logits_gib"] > 0 and mem["stages"][0]["logits_gib"] == 0
    assert mem["band_gib"] == pytest.approx([max(s["band_gib"][0] for s in mem["stages"]),
                                             max(s["band_gib"][1] for s in mem["stages"])], abs=0.06)
    assert {mem["terms"][t]["known"] for t in ("params", "grads", "optimizer")} == {"exact"}
    assert {mem["terms"][t]["known"] for t in ("activations", "logits", "transient")} == {"measured"}
    assert "memory  per GPU, busiest stage 1 of 8 (10 layers)" in table(p)


def test_mesh_auto_plans_a_mesh_whose_band_holds_the_gpu_at_its_low_end():
    """Qwen3.5-35B on 8 GPUs of 36 GiB: no mesh's band fits below the GPU, and the one with the lowest high end is
    above it even at its low end; mesh=auto plans the first whose low end the GPU holds (with a warning), as a
    plan given that mesh does, instead of refusing."""
    from conftest import plan

    p = plan(["model=qwen3_5_35b", "mesh=auto", "cluster.gpu_mem_gib=36", "mode=plan"])
    assert p.memory.may_fit and not p.memory.fits
    assert "low end" in p.search.chosen_by and any(w.key == "memory" for w in p.warnings)


def test_a_token_budget_is_per_gpu_and_the_micro_batch_is_the_cp_groups():
    """verl_mlite hands verl sp_size = CP: a micro-batch holds budget·CP tokens, so a budget of a CP-th of the
    longest sequence is legal; one under it is refused with the least that is, as a pasteable override."""
    from conftest import plan, problems_of

    long = ["model=glm5_1", "verl.data.max_response_length=32768", "mode=plan"]     # 33792 tokens, CP 8
    key = "verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    assert plan(long + [f"{key}=4224"]).memory is not None
    (line,) = problems_of(long + [f"{key}=4000"])
    assert "times CP 8 smaller than one full sequence" in line and f"fix: {key}=4224 or more" in line


def test_without_dynamic_batch_size_a_rank_holds_a_cp_th_of_the_micro_batch():
    """No dynamic batch size: the micro-batch (micro-batch × sequence tokens) is the CP group's and each rank packs a
    CP-th of every sequence, so a CP-8 plan's activations are those of micro-batch × sequence / 8 tokens per rank —
    not CP times that (which refused plans that fit)."""
    from conftest import plan
    from vrun.estimate import memory
    from vrun.planning import plan as planning
    from vrun.planning.phases import memory_inputs

    fixed = ["model=kimi_k2_6", "mode=plan", "verl.actor_rollout_ref.actor.use_dynamic_bsz=false",
             "verl.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]
    p = plan(fixed)
    inputs = memory_inputs(p.config, p.entrypoint, p.verl)
    assert p.mesh.cp == 8 and inputs["cp_group_tokens"] and inputs["tokens_per_gpu"] == 8 * inputs["seq_len"]
    params = planning.with_built_mtp(planning.model_params(p.config, p.entrypoint, None, [], p.verl)[0], p.config,
                                     p.entrypoint, p.verl)
    per_rank = dict(inputs, tokens_per_gpu=inputs["seq_len"], cp_group_tokens=False)
    st, one = p.memory.stages[p.memory.stage], memory.estimate(params, p.mesh, **per_rank).stages[p.memory.stage]
    assert st.activations == pytest.approx(one.activations) and st.logits == pytest.approx(one.logits)
    # counted as if every rank held the whole micro-batch: 8 times the logits
    whole = memory.estimate(params, p.mesh, **dict(inputs, cp_group_tokens=False)).stages[p.memory.stage]
    assert whole.logits == pytest.approx(8 * st.logits)
    # a dynamic budget is per rank already
    dyn = plan(["model=kimi_k2_6", "mode=plan"])
    assert not memory_inputs(dyn.config, dyn.entrypoint, dyn.verl)["cp_group_tokens"]


def test_rank_tokens_divides_only_the_cp_groups_micro_batch():
    from vrun.estimate.memory import rank_tokens

    assert rank_tokens(8 * 3072, 8, True) == 3072 and rank_tokens(10240, 8, False) == 10240
    assert rank_tokens(4096, 1, True) == 4096


def test_where_the_rollout_sets_the_bands_high_end_its_terms_decide_it():
    """Qwen3.5-35B under dist_opt without offload, vLLM at 0.52 of 80 GiB: the training step peaks near 42 GiB, the
    rollout phase at vLLM's 41.6 GiB + the actor's 36.2 GiB left beside it (read, ×1–1.1): the GPU lies inside the
    band because of the rollout phase, and the warning names vLLM's share and the residents, not the training
    terms."""
    from conftest import plan

    p = plan(["model=qwen3_5_35b", "optimizer=dist_opt", "verl.actor_rollout_ref.actor.engine.param_offload=false",
              "verl.actor_rollout_ref.actor.engine.optimizer_offload=false", "mode=plan",
              "verl.actor_rollout_ref.rollout.gpu_memory_utilization=0.52"])
    e = p.memory
    assert e.may_fit and not e.fits and e.train_peak < e.rollout + e.rollout_residents
    assert [t for t, _, _ in e.deciding()] == ["rollout", "rollout residents"]
    (warn,) = [w for w in p.warnings if w.key == "memory"]
    assert "the terms that decide it: rollout 41.6 GiB (vLLM's share" in warn.why
    assert "activations" not in warn.why and "logits" not in warn.why
    # where the training step sets it, its terms decide as before
    train = plan(["model=kimi_k2_6", "mode=plan", "cluster.gpu_mem_gib=70"]).memory
    assert train.deciding()[0][0] == "activations"

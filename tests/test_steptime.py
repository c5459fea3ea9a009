"""The step-time estimate and the cost in the plan (vrun/estimate/steptime.py, vrun/planning/steptime_plan.py), held to published
GRPO step times (tests/support/published_steps.py) with one fixed set of efficiencies."""
import json
import math

import pytest

from conftest import plan, problems_of
from support import published_steps as pub
from vrun.estimate import hardware, memory, params, rollout, steptime
from vrun.estimate.mesh import Mesh
from vrun.planning import steptime_plan


@pytest.fixture(autouse=True)
def state_dir(own_state_dir):
    return own_state_dir


def case_workload(name):
    """A published case's shapes as the plan would build them: counts from the facts, the memory and rollout
    estimates of this project, the case's layout."""
    c = pub.CASES[name]
    arch, (tp, cp, ep, pp) = c.arch, c.train
    count, why = params.count(arch)
    assert count is not None, why
    routed = sum(x.routed for x in count.layers)
    dense = count.total - routed
    mem = hardware.PARTS[c.part].mem_gib
    mesh = Mesh(nnodes=c.gpus // 8, gpus_per_node=8, tp=tp, cp=cp, ep=ep, pp=pp)
    est = memory.estimate(params.to_memory_params(count, mtp=False, vision=False), mesh, optimizer="dist_opt",
                          hidden=arch["hidden"], vocab=arch["vocab"], top_k=arch["experts_per_token"],
                          tokens_per_gpu=c.max_seq, recompute=c.recompute, param_offload=True, grad_offload=True,
                          optimizer_offload=True, offload_fraction=1.0, gpu_mem_gib=mem)
    r = rollout.estimate(arch, (dense, routed), world=c.gpus, rollout_tp=c.gen_tp, gpu_mem_gib=mem,
                         utilization=c.utilization, seq_len=c.max_seq, step_sequences=c.samples)
    attn, cap = steptime.attention_flops_per_key(arch)
    response_mean = c.mean_response if c.mean_response is not None else c.avg_seq - pub.PROMPT_MEAN
    response_max = c.max_seq - (c.max_prompt if c.max_prompt is not None else pub.PROMPT_MEAN)
    return steptime.Workload(
        world=c.gpus, gpus_per_node=8, active_params=count.active, samples=c.samples, prompt_mean=pub.PROMPT_MEAN,
        response_mean=response_mean, response_max=response_max, pp=pp,
        micro_batches=max(1, c.train_gbs // mesh.dp), recompute=c.recompute, reference=c.reference,
        rollout_tp=c.gen_tp, rollout_dense=dense, rollout_routed=routed,
        experts=arch["routed_experts"], top_k=arch["experts_per_token"], layers=arch["layers"],
        hidden=arch["hidden"], moe_layers=steptime_plan.moe_layers(arch), tp=tp, cp=cp, ep=ep,
        kv_per_token=r.kv.per_token,
        kv_per_sequence=r.kv.per_sequence, kv_fits=r.fits, attn_flops_per_key=attn, attn_keys_cap=cap,
        param_bytes=est.weights, grad_bytes=est.grads, optimizer_bytes=est.optimizer, param_offload=True,
        optimizer_offload=True)


def predictions():
    return {name: (steptime.estimate(case_workload(name), hardware.PARTS[c.part]), c.step_s)
            for name, c in pub.CASES.items()}


def test_published_cases_within_half_to_twice():
    """With the one fixed set of efficiencies (the decode MBU as measured at the rollout's TP), NCCL's latency
    model for the all-reduces of a rollout replica wider than a node, the training mesh's collective bytes, the
    refit as verl and NeMo RL do it (the whole bf16 model through every rank at REFIT_RATE) and NeMo RL's reference
    pass, all six published step times lie within 0.5×–2× of the estimate's middle (tests/support/
    published_steps.py has the table and what each addition did)."""
    preds = predictions()
    ratios = {n: st.central / t for n, (st, t) in preds.items()}
    table = {n: (round(st.low), round(st.central), round(st.high), t, round(ratios[n], 2))
             for n, (st, t) in preds.items()}
    assert len(preds) == 6, table
    for name, r in ratios.items():
        assert 0.5 <= r <= 2.0, table


def test_the_refit_moves_the_whole_model_through_every_rank():
    """The refit is the whole bf16 model at the measured rate, whatever the rollout's shard: NeMo RL's DeepSeek-V3
    (1.34 TB, TP32 rollout, a 42 GB shard) takes 1.34 TB / rate, not its shard's network time; never less than the
    ideal reshard's floor; and its rate and source are in the plan's factors."""
    w = case_workload("deepseek_v3_256xh100")
    h100 = hardware.PARTS["H100"]
    st = steptime.estimate(w, h100)
    whole = (w.rollout_dense + w.rollout_routed) * 2.0
    assert 1.3e12 < whole < 1.4e12
    r = steptime.REFIT_RATE
    assert st.phases["sync"].low == pytest.approx(whole / r.high)
    assert st.phases["sync"].high == pytest.approx(whole / r.low)
    assert st.phases["sync"].middle == pytest.approx(whole / math.sqrt(r.low * r.high))
    floor = steptime.sync_s(w, h100, 0.7, 1e30)
    assert 0 < floor < whole / r.high and steptime.sync_s(w, h100, 0.7, 1.0) == pytest.approx(whole)
    assert st.summary()["factors"]["refit_rate"]["source"].startswith("bf16 bytes of the whole model")
    assert 0 < r.low < r.high


def test_nccl_latency_model_of_one_all_reduce():
    """NCCL's own latency model (tuning.cc, LL protocol): within a node the ring, 6.6 + 2(n−1)·0.6 µs; across 4
    nodes of 8 the tree, 6.8 + 2·(7·0.6 + 2·5.0) µs; the bytes over NVLink or the node's network on top."""
    h100 = hardware.PARTS["H100"]
    assert steptime.allreduce_s(1, 8, 1e6, h100, 1.0) == 0.0
    assert steptime.allreduce_s(4, 8, 0.0, h100, 1.0) == pytest.approx(10.2e-6)
    assert steptime.allreduce_s(32, 8, 0.0, h100, 1.0) == pytest.approx(35.2e-6)
    one_mb = steptime.allreduce_s(32, 8, 1e6, h100, 1.0) - steptime.allreduce_s(32, 8, 0.0, h100, 1.0)
    assert one_mb == pytest.approx(2 * 31 / 32 * 1e6 / h100.network)
    assert "tuning.cc" in hardware.NCCL_LATENCY_SOURCE and len(hardware.NCCL_LATENCY_SOURCE.split("@ ")[1][:40]) == 40


def test_cases_are_pinned_to_their_document():
    """Each case names the document version it came from; the factors are the module's one set."""
    assert pub.SOURCE["commit"] == "06beed91bac98a2c39a19435f6bbbbe71aa45720"
    assert pub.SOURCE["path"] == "docs/about/performance-summary.md"
    for c in pub.CASES.values():
        assert len(c.source["commit"]) == 40 and c.source["path"] and c.part in hardware.PARTS
    for f in steptime.FACTORS.values():
        assert 0 < f.low < f.high <= 1 and f.source


def test_every_gpu_part_has_its_figures_and_source():
    for name, p in hardware.PARTS.items():
        assert p.bf16_flops > 1e14 and p.hbm > 1e12 and p.nvlink > 0 and p.network > 0 and p.pcie > 0, name
        assert p.fp8_flops is None or p.fp8_flops >= p.bf16_flops, name
        assert p.source, name
        assert hardware.GPU_MEM_GIB[name] == p.mem_gib
    assert hardware.part("h100") is hardware.PARTS["H100"] and hardware.part("nope") is None


def test_decode_is_memory_bound_until_the_batch_is_large():
    """The roofline: one sequence reads the weights (bandwidth bound); a batch far past the ridge is compute bound."""
    w = case_workload("qwen3_30b_a3b_32xh100")
    h100 = hardware.PARTS["H100"]
    one = steptime.decode_step_s(w, h100, 1, 1000, 0.5, 0.3)
    big = steptime.decode_step_s(w, h100, 100_000, 1, 0.5, 0.3)
    flops_bound = 2 * w.active_params * 100_000 / w.rollout_tp / (h100.bf16_flops * 0.3)
    assert big == pytest.approx(flops_bound)
    assert one < big and one > (w.rollout_dense / w.rollout_tp) * 2 / h100.hbm
    # TP4 within a node: its all-reduces are in the measured MBU (DECODE_MBU_AT_TP), nothing on top
    assert steptime.decode_step_s(w, h100, 1, 1000, 0.5, 0.3, 0.7) == one
    # TP16 across two nodes: with the network efficiency given, 2 all-reduces per layer come on top
    wide = case_workload("qwen3_235b_a22b_128xh100")
    alone = steptime.decode_step_s(wide, h100, 1, 1000, 0.5, 0.3)
    with_ar = steptime.decode_step_s(wide, h100, 1, 1000, 0.5, 0.3, 0.7)
    assert with_ar - alone == pytest.approx(2 * 94 * steptime.allreduce_s(16, 8, 4096 * 2.0, h100, 0.7))


def test_decode_mbu_is_the_figure_measured_at_the_rollouts_tp():
    """The source's points at TP2, 4, 8; log-linear between them; TP1 at TP2's; past 8 at TP8's; inside the band."""
    band = steptime.FACTORS["decode_mbu"]
    at = {tp: steptime.decode_mbu(tp, band) for tp in (1, 2, 3, 4, 8, 16, 32)}
    assert (at[1], at[2], at[4], at[8], at[16], at[32]) == (0.60, 0.60, 0.40, 0.25, 0.25, 0.25)
    assert at[3] == pytest.approx(0.60 * (0.40 / 0.60) ** (math.log2(3) - 1))
    assert (band.low, band.high) == (min(steptime.DECODE_MBU_AT_TP.values()), max(steptime.DECODE_MBU_AT_TP.values()))
    narrow = steptime.Factor(0.3, 0.5, "a narrower band")
    assert (steptime.decode_mbu(1, narrow), steptime.decode_mbu(8, narrow)) == (0.5, 0.3)


def test_the_longest_response_bounds_the_rollout():
    st = steptime.estimate(case_workload("deepseek_v3_256xh100"), hardware.PARTS["H100"])
    assert st.rollout_at_max.low > st.rollout_at_mean.low
    assert st.phases["rollout"].high == st.rollout_at_max.high
    assert st.low < st.central < st.high


def test_recompute_and_a_kl_term_cost_more():
    import dataclasses

    w = dataclasses.replace(case_workload("qwen3_30b_a3b_32xh100"), recompute=False, reference=False)
    h100 = hardware.PARTS["H100"]
    base = steptime.estimate(w, h100)
    more = steptime.estimate(dataclasses.replace(w, recompute=True, reference=True), h100)
    assert more.phases["train"].low == pytest.approx(base.phases["train"].low * 8 / 6, rel=1e-6)
    assert more.phases["log_prob"].low == pytest.approx(base.phases["log_prob"].low * 2, rel=1e-6)


# ---------------------------------------------------------------- in the plan

def test_make_run_plan_has_a_step_range_and_gpu_hours(tmp_path):
    p = plan(["model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan"], str(tmp_path / "r"))
    assert p.time is not None and 0 < p.time.low < p.time.high
    from vrun.planning import report

    line = [x for x in report.table(p).splitlines() if x.startswith("step    ")]
    assert len(line) == 1 and "≈" in line[0] and "rollout" in line[0] and "GPU-hours" in line[0], line
    j = report.plan_json(p)
    assert j["time"]["estimate"] and set(j["time"]["phases"]) >= {"rollout", "log_prob", "train", "sync"}
    assert j["time"]["factors"]["train_mfu"]["source"]
    assert j["time"]["kind"] == {"model": "glm5_1", "gpu": "H100", "engine": "vllm", "algo": "grpo"}
    assert j["cost"]["steps"] == 100 and j["cost"]["steps_from"].startswith("per 100 steps")
    assert j["cost"]["gpu_hours_low"] == pytest.approx(p.time.low * 100 * 256 / 3600, rel=1e-3)


def test_sft_plan_times_training_only(tmp_path):
    p = plan(["model=deepseek_v4_flash", "algo=sft", "mode=plan"], str(tmp_path / "r"))
    assert p.time is not None and set(p.time.phases) <= {"train", "offload"} and "train" in p.time.phases


def test_cost_from_total_training_steps_and_the_price(tmp_path):
    p = plan(["model=qwen3_5_35b", "algo=grpo", "mode=plan", "verl.trainer.total_training_steps=500",
              "cluster.gpu_hour_price=2.5"], str(tmp_path / "r"))
    c = p.cost
    assert c["steps"] == 500 and c["steps_from"] == "trainer.total_training_steps"
    assert c["price_low"] == pytest.approx(c["gpu_hours_low"] * 2.5, rel=1e-2)


def test_cost_from_the_data_files_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    f = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [f"q{i}" for i in range(1000)]}), str(f))
    p = plan(["model=qwen3_5_35b", "algo=grpo", "mode=plan", f"verl.data.train_files={f}",
              "verl.trainer.total_epochs=2"], str(tmp_path / "r"))
    tbs = p.verl["data"]["train_batch_size"]
    assert p.cost["steps"] == (1000 // tbs) * 2 and "1,000 rows" in p.cost["steps_from"]


def test_a_negative_price_is_one_line():
    lines = problems_of(["model=qwen3_5_35b", "mode=plan", "cluster.gpu_hour_price=-1"])
    assert len(lines) == 1 and lines[0].startswith("error: cluster.gpu_hour_price=-1.0"), lines


def test_an_unknown_gpu_part_has_no_estimate_and_says_so(tmp_path):
    p = plan(["model=qwen3_5_35b", "mode=plan", "cluster.gpu=X9", "cluster.gpu_mem_gib=80"], str(tmp_path / "r"))
    from vrun.planning import report

    assert p.time is None and "cluster.gpu=X9" in p.time_note
    assert report.plan_json(p)["time"] == {"unavailable": p.time_note}
    assert any(x.startswith("step    no estimate") for x in report.table(p).splitlines())


def test_predicted_step_is_the_middle(tmp_path):
    from vrun.planning import steptime_plan

    p = plan(["model=qwen3_5_35b", "mode=plan"], str(tmp_path / "r"))
    s = steptime_plan.predicted_step_s(p)
    assert s == pytest.approx(p.time.central) and p.time.low < s < p.time.high
    assert math.isfinite(json.loads(json.dumps(p.time.summary()))["step_middle_s"])

"""The step-time estimate and the cost of a plan: vrun/estimate/steptime.py's Workload read from what the plan knows
(mesh, batch, lengths, token budget, parameter counts, the memory and rollout estimates, the GPU part), the
calibration from recorded runs applied (vrun/planning/calibration.py), and GPU-hours for the configured steps.

predicted_step_s(plan) is the one figure a ranking of meshes by time can use (the middle of the estimate)."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

from vrun.estimate import hardware, steptime
from vrun.core.dotted import get
from vrun.estimate.steptime import StepTime, Workload
from vrun.entrypoints import ROLLOUT
from vrun.core import fs


def workload(config, entrypoint, verl: dict, mesh, counts, est, arch: dict) -> Optional[Workload]:
    """config: the typed run config; counts: vrun.estimate.params.ParamCounts; est: vrun.estimate.memory.Estimate (or None)."""
    from vrun.estimate import params as counting
    from vrun.planning.phases import memory_inputs

    facts, _ = counting.count(arch)
    active = (counts.active if counts is not None and counts.active else None) or (facts.active if facts else None)
    if not active:
        return None
    inputs = memory_inputs(config, entrypoint, verl)
    tokens, budget, cp_group = batch_tokens(entrypoint, verl)
    common = dict(world=mesh.world, gpus_per_node=mesh.gpus_per_node, active_params=float(active), pp=mesh.pp,
                  vpp=mesh.vpp, tp=mesh.tp, cp=mesh.cp, ep=mesh.ep, etp=mesh.etp,
                  layers=int(arch.get("layers") or 0), hidden=int(arch.get("hidden") or 0),
                  moe_layers=moe_layers(arch), top_k=int(arch.get("experts_per_token") or 0), recompute=inputs["recompute"], param_offload=inputs["param_offload"],
                  optimizer_offload=inputs["optimizer_offload"],
                  param_bytes=est.weights if est is not None else 0.0,
                  grad_bytes=est.grads if est is not None else 0.0,
                  optimizer_bytes=est.optimizer if est is not None else 0.0)
    attn, cap = steptime.attention_flops_per_key(arch)
    # verl's refit: the offloaded training weights to the GPU for the export and back (steptime.REFIT_HOST)
    common.update(attn_flops_per_key=attn, attn_keys_cap=cap, tensors=steptime.tensor_count(arch), refit_host="weights")
    micro = micro_batches(tokens / max(mesh.dp, 1), group_budget(budget, mesh.cp, cp_group))
    batch = entrypoint.step_batch(verl)  # the record's: samples, lengths, whether a rollout generates them
    step_tokens = batch["samples"] * (batch["prompt_mean"] + batch["response_mean"])
    common.update(mini_batches=max(1, round(step_tokens / tokens)) if tokens > 0 else 1)
    # the model's dense and routed-expert parameters (what vLLM loads, no MTP): the refit's bytes, the optimizer's
    # DP traffic, and whether the MFU is a mixture of experts' (SFT too)
    model = counts.rollout if counts is not None else (0, 0)
    common.update(rollout_dense=float(model[0]), rollout_routed=float(model[1]),
                  experts=int(arch.get("routed_experts") or 0))
    if batch["rollout"]:
        # what vLLM holds, from the rollout estimate
        r = est.rollout_detail if est is not None else None
        common.update(rollout_weight_bytes=float(r.weight_bytes) if r is not None else 2.0,
                      kv_per_token=r.kv.per_token if r is not None else 0.0,
                      kv_per_sequence=r.kv.per_sequence if r else 0.0, kv_fits=r.fits if r is not None else None)
    return Workload(micro_batches=micro, **batch, **common)


def moe_layers(arch: dict) -> int:
    """Decoder layers with routed experts (the first dense_layers have none; one expert is a dense MLP)."""
    if (arch.get("routed_experts") or 0) <= 1:
        return 0
    return max(int(arch.get("layers") or 0) - int(arch.get("dense_layers") or 0), 0)


def batch_tokens(entrypoint, verl: dict) -> tuple[float, float, bool]:
    """(tokens of one mini-batch at the mean lengths, the token budget of a micro-batch, whether that budget is the
    CP group's): the micro-batches per DP rank follow from them and the mesh (_micro). A dynamic batch's budget is
    per GPU (the CP group's micro-batch holds CP times it); without dynamic batch size the micro-batch (micro-batch
    size × the sequence) is the CP group's already (vrun.estimate.memory.rank_tokens)."""
    return (entrypoint.mini_batch_tokens(verl), float(entrypoint.token_inputs(verl)["tokens_per_gpu"] or 0),
            entrypoint.token_budget_key(verl) is None)


def group_budget(budget: float, cp: int, cp_group: bool) -> float:
    """The tokens one micro-batch of a CP group holds."""
    return budget if cp_group else budget * cp


def mesh_timer(config, entrypoint, verl: dict, mesh, counts, replica=None, rollout_tp_dp=None):
    """For mesh=auto: (a function (mesh, memory estimate) -> StepTime, "") when a step time can be estimated, else
    (None, why). The workload is built once from the plan's inputs; per mesh only its pipeline, micro-batches and
    per-GPU bytes change. replica: the rollout replica chosen beside the mesh (vrun.estimate.rollout's
    RolloutEstimate; the KV fit and weight bytes from it), else rollout_tp_dp (TP, DP) alone."""
    import dataclasses

    part = hardware.part(config.cluster.gpu)
    if part is None:
        return None, f"cluster.gpu={config.cluster.gpu}: no peak FLOP/s or bandwidth known for it"
    base = workload(config, entrypoint, verl, mesh, counts, None, config.model.arch.facts())
    if base is None:
        return None, "no active parameter count (the model group's facts are incomplete)"
    if replica is not None:
        base = dataclasses.replace(base, rollout_tp=replica.tp, rollout_dp=replica.dp,
                                   rollout_weight_bytes=float(replica.weight_bytes), kv_per_token=replica.kv.per_token,
                                   kv_per_sequence=replica.kv.per_sequence, kv_fits=replica.fits)
    elif rollout_tp_dp is not None and rollout_tp_dp[0] is not None:
        base = dataclasses.replace(base, rollout_tp=int(rollout_tp_dp[0]), rollout_dp=int(rollout_tp_dp[1] or 1))
    tokens, budget, cp_group = batch_tokens(entrypoint, verl)
    from vrun.planning import calibration

    recorded = calibration.entries(kind(config, verl))
    ratios = [e["measured_s"] / e["predicted_s"] for e in recorded]
    how = f"calibrated from {len(recorded)} run{'s' if len(recorded) > 1 else ''}"

    first: list = []
    seen: dict = {}
    offload = base.param_offload or base.optimizer_offload

    def shape(m, est) -> tuple:
        """The estimate without the mesh's collectives, once per pipeline / micro-batch / offload shape and whether
        expert parallelism splits the experts (the MoE balance, steptime.routed_share)."""
        micro = micro_batches(tokens / max(m.dp, 1), group_budget(budget, m.cp, cp_group))
        k = (m.pp, m.vpp, micro, m.ep > 1) + ((est.weights, est.grads, est.optimizer) if offload and est is not None
                                              else ())
        if k not in seen:
            w = steptime.on_mesh(base, m, micro, est)
            st = steptime.estimate(w, part, same_rollout=first[0] if first else None, collectives=False)
            first[:] = first or [st]
            scaled = steptime.calibrated(st, ratios, how) if ratios and st.model_middle > 0 else st
            central = scaled.central
            scale = central / st.model_middle if st.model_middle > 0 else 1.0
            # what one second of the mesh's collectives (per pass, and the optimizer's per step) adds to the middle
            per_pass, sync = steptime.collectives_middle_s(w, (1.0, 0.0)), steptime.collectives_middle_s(w, (0.0, 1.0))
            seen[k] = (w, st, central, scale * per_pass, scale * sync)
        return seen[k]

    comm: dict = {}

    def seconds(m, w) -> tuple:
        """The mesh's collectives at efficiency 1 (steptime.collective_seconds), once per TP, PP, EP, ETP."""
        k = (m.tp, m.pp, m.ep, m.etp)
        if k not in comm:
            comm[k] = steptime.collective_seconds(w, part, m)
        return comm[k]

    def timed(m, est) -> StepTime:
        w, st = shape(m, est)[:2]
        st = steptime.with_collectives(st, w, part, m, seconds=seconds(m, w))
        return steptime.calibrated(st, ratios, how) if ratios and st.model_middle > 0 else st

    def bound(m, est) -> float:
        """timed(m, est).central without building a StepTime, a hair under (float rounding must not lift it above):
        mesh=auto's search times exactly only the meshes that can still rank among the first."""
        w, _, central, per_pass, per_sync = shape(m, est)
        one_pass, sync = seconds(m, w)
        return (central + per_pass * one_pass + per_sync * sync) * (1 - 1e-9)

    timed.bound = bound
    return timed, ""


def micro_batches(tokens_per_rank: float, budget: float) -> int:
    return max(1, math.ceil(tokens_per_rank / budget)) if budget > 0 else 1


def estimate(config, entrypoint, verl: dict, mesh, counts, est) -> tuple[Optional[StepTime], str]:
    """The plan's step time (calibrated when recorded runs of its kind exist), or None with the reason."""
    part = hardware.part(config.cluster.gpu)
    if part is None:
        return None, f"cluster.gpu={config.cluster.gpu}: no peak FLOP/s or bandwidth known for it"
    w = workload(config, entrypoint, verl, mesh, counts, est, config.model.arch.facts())
    if w is None:
        return None, "no active parameter count (the model group's facts are incomplete)"
    st = steptime.estimate(w, part)
    from vrun.planning import calibration

    return calibration.apply(st, kind(config, verl)), ""


def kind(config, verl: dict) -> dict:
    """What a calibration is kept per: the model, the GPU part, the rollout engine (none in a tree without a
    rollout: SFT's), the algorithm."""
    engine = get(verl, f"{ROLLOUT}.name")
    return {"model": config.model.name, "gpu": str(config.cluster.gpu), "engine": str(engine or "none"),
            "algo": str(config.algo.name)}


def predicted_step_s(plan) -> Optional[float]:
    """The plan's predicted step time in seconds (the estimate's middle; calibrated when it is): for ranking."""
    return plan.time.central if getattr(plan, "time", None) is not None else None


def steps(verl: dict) -> tuple[Optional[int], str]:
    """The run's optimizer steps and where the figure comes from: trainer.total_training_steps, else the train
    file's rows (parquet metadata, when readable) · epochs / batch, else None (the cost is given per 100 steps)."""
    total = get(verl, "trainer.total_training_steps")
    if isinstance(total, int) and total > 0:
        return total, "trainer.total_training_steps"
    files = get(verl, "data.train_files")
    files = [files] if isinstance(files, str) else list(files) if isinstance(files, (list, tuple)) else []
    tbs = get(verl, "data.train_batch_size")
    epochs = get(verl, "trainer.total_epochs")
    epochs = epochs if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs >= 1 else 1
    if not files or not isinstance(tbs, int) or tbs < 1:
        return None, "per 100 steps (no trainer.total_training_steps and no train file to count)"
    rows = 0
    for f in files:
        n = parquet_rows(str(f))
        if n is None:
            return None, f"per 100 steps (no trainer.total_training_steps; {f} not readable here)"
        rows += n
    return max(rows // tbs, 1) * int(epochs), f"{rows:,} rows of data.train_files / {tbs} × {epochs} epoch(s)"


def parquet_rows(path: str) -> Optional[int]:
    """The row count from a parquet file's footer (no data read), or None."""
    p = Path(os.path.expanduser(path))  # pathlib's expanduser raises on ~nosuchuser
    if not fs.is_file(p):
        return None
    try:
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(str(p)).metadata.num_rows)
    except Exception:  # noqa: BLE001 - an unreadable or foreign file: the cost falls back to per 100 steps
        return None


def cost(st: StepTime, gpus: int, verl: dict, price: Optional[float]) -> dict:
    n, source = steps(verl)
    count = n if n is not None else 100
    lo, hi = steptime.gpu_hours(st, count, gpus)
    out = {"estimate": True, "steps": count, "steps_from": source, "gpus": gpus,
           "gpu_hours_low": round(lo, 1), "gpu_hours_high": round(hi, 1),
           "wall_hours_low": round(st.low * count / 3600, 2), "wall_hours_high": round(st.high * count / 3600, 2)}
    if price is not None:
        out.update(gpu_hour_price=price, price_low=round(lo * price, 2), price_high=round(hi * price, 2))
    return out


def time_line(st: StepTime, c: dict) -> str:
    """The plan table's one line."""
    parts = ", ".join(f"{name} {_range(st.phase(name))}" for name in st.phases)
    per = f"{c['steps']:,} steps ({c['steps_from']})" if not c["steps_from"].startswith("per 100") else "per 100 steps"
    money = f" ≈ {c['price_low']:,.0f}–{c['price_high']:,.0f} at {c['gpu_hour_price']:g}/GPU-hour" \
        if "gpu_hour_price" in c else ""
    how = f"; {st.calibration}" if st.calibration else ""
    return (f"step    ≈ {_num(st.low)}–{_num(st.high)} s ({parts}){how}; {per}: "
            f"{_num(c['gpu_hours_low'])}–{_num(c['gpu_hours_high'])} GPU-hours{money} (estimate)")


def _range(p) -> str:
    return f"{_num(p.low)}–{_num(p.high)}"


def _num(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.0f}"
    return f"{x:.1f}" if x >= 1 else f"{x:.2g}"

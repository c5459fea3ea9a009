"""The two phases of a step put together from the run and verl configs: what the engine builds (MTP, the
vision tower), the rollout's inputs, the rollout estimate beside the training estimate, and the one-line
assumptions every estimate prints. Pure functions of their inputs."""
from __future__ import annotations

import dataclasses
from typing import Optional

from vrun import mlite, rollout
from vrun.dotted import get
from vrun.entrypoints import ROLLOUT, Entrypoint
from vrun.schema import RunConfig


def engine(entrypoint: Entrypoint, verl: dict) -> dict:
    return get(verl, entrypoint.engine, {}) or {}


def impl_cfg(entrypoint: Entrypoint, verl: dict) -> dict:
    """The impl_cfg the engine passes to Megatron Lite: verl_mlite's engine (engine/mlite_engine.py
    `_build_impl_cfg`) overwrites mtp_enable with the model config's `mtp.enable` whenever verl's model config has an
    `mtp` block (both supported verl versions do; its default is false)."""
    out = dict(get(engine(entrypoint, verl), "impl_cfg") or {})
    mtp = get(verl, f"{entrypoint.model}.mtp")
    if isinstance(mtp, dict):
        out["mtp_enable"] = bool(mtp.get("enable", False))
    return out


def mtp_enabled(config: RunConfig, entrypoint: Entrypoint, verl: dict) -> bool:
    v = impl_cfg(entrypoint, verl).get("mtp_enable")
    if v is None:  # ImplConfig's own default for the model
        v = mlite.interface().impl_cfg_mtp_enable_default.get(config.model.mlite_name, False)
    return bool(v)


def vision_mounted(entrypoint: Entrypoint, verl: dict) -> bool:
    return bool(get(engine(entrypoint, verl), "impl_cfg.mount_vision_model", False))


def rollout_inputs(entrypoint: Entrypoint, verl: dict, gpu_mem_gib: float) -> Optional[dict]:
    if not entrypoint.has_rollout:
        return None
    r = get(verl, ROLLOUT, {}) or {}
    seq = int((get(verl, "data.max_prompt_length") or 0) + (get(verl, "data.max_response_length") or 0))
    return dict(gpu_mem_gib=gpu_mem_gib, utilization=float(r.get("gpu_memory_utilization") or 0.0),
                seq_len=seq, step_sequences=int((get(verl, "data.train_batch_size") or 0) * (r.get("n") or 1)),
                dtype=str(r.get("dtype") or "bfloat16"), quantization=r.get("quantization"),
                kv_cache_dtype=get(r, "engine_kwargs.vllm.kv_cache_dtype"))


def rollout_for(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh, rparams: tuple,
                gpu_mem_gib: float) -> Optional[rollout.RolloutEstimate]:
    inputs = rollout_inputs(entrypoint, verl, gpu_mem_gib)
    if inputs is None or rollout.kv_missing(config.model.arch.facts()):
        return None
    t = get(verl, f"{ROLLOUT}.tensor_model_parallel_size")
    d = get(verl, f"{ROLLOUT}.data_parallel_size") or 1
    if not isinstance(t, int) or t < 1 or not isinstance(d, int) or d < 1 or mesh.world % (t * d):
        return None
    return rollout.estimate(config.model.arch.facts(), rparams, world=mesh.world, rollout_tp=t, rollout_dp=d, **inputs)


def assumptions(inputs: dict, r: Optional[rollout.RolloutEstimate]) -> str:
    off = [n for n, on in (("params+grads", inputs["param_offload"]), ("optimizer", inputs["optimizer_offload"]))
           if on]
    if not inputs["optimizer_offload"] and inputs["offload_fraction"]:
        off.append(f"{inputs['offload_fraction']:.0%} of optimizer")
    parts = [f"bf16 weights, fp32 grads, Adam {inputs['optimizer']}",
             f"offloaded: {', '.join(off) or 'nothing'}",
             f"recompute {'full' if inputs['recompute'] else 'none'}",
             "approximated: activations (34+4k)·h B/token/layer, no sequence imbalance"]
    if r is not None:
        parts.append(f"rollout {'fp8' if r.weight_bytes == 1 else 'bf16'} weights, 2 GiB vLLM reserve (estimate)")
        if r.kv.estimate:
            parts.append(f"KV: {r.kv.formula}")
    return "; ".join(parts)


def attach(est, config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh, rparams: tuple, inputs: dict):
    """The training estimate with its rollout phase and its assumptions."""
    r = rollout_for(config, entrypoint, verl, mesh, rparams, inputs["gpu_mem_gib"])
    return dataclasses.replace(est, rollout_detail=r, assumptions=assumptions(inputs, r))


def rollout_problems(r: Optional[rollout.RolloutEstimate], key: str = f"{ROLLOUT}.gpu_memory_utilization",
                     tp_key: str = f"{ROLLOUT}.tensor_model_parallel_size") -> list:
    """A rollout that cannot hold one prompt+response is an error (preflight refuses it); one that cannot hold
    a replica's share of the step at once is a warning (vLLM queues the rest)."""
    from vrun.problems import Problem

    if r is None:
        return []
    g = lambda x: f"{x / rollout.GIB:.1f}"  # noqa: E731
    if not r.holds_one:
        return [Problem(key, r.utilization,
                        f"vLLM's {g(r.budget)} GiB per GPU minus weights {g(r.weights)} GiB (TP{r.tp}) and the "
                        f"{g(r.reserve)} GiB reserve leaves {g(r.kv_cache)} GiB of KV cache, less than one "
                        f"{r.seq_len}-token prompt+response ({g(r.per_sequence)} GiB)",
                        f"a larger replica ({tp_key} / actor_rollout_ref.rollout.data_parallel_size), a higher "
                        "gpu_memory_utilization, fp8 rollout, or mesh=auto",
                        warning=True)]
    if not r.holds_share:
        return [Problem(tp_key, r.tp, f"the KV cache holds {r.fits} sequences per replica at once, fewer than the "
                        f"{r.step_share} of the step each of {r.replicas} replicas generates (vLLM queues the rest)",
                        f"a larger {tp_key} or gpu_memory_utilization", warning=True)]
    return []

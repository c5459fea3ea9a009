"""The two phases of a step put together from the run and verl configs: what the engine builds (MTP, the
vision tower), the rollout's inputs, the rollout estimate beside the training estimate, and the one-line
assumptions every estimate prints. Pure functions of their inputs."""
from __future__ import annotations

import dataclasses
from typing import Optional

from vrun.estimate import memory, rollout
from vrun.compose import mlite
from vrun.core.dotted import get
from vrun.entrypoints import ROLLOUT, Entrypoint
from vrun.config.schema import RunConfig
from vrun.core.problems import PlanError


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
    """The rollout estimate's inputs: the record's (None: no rollout phase) on a GPU of gpu_mem_gib."""
    inputs = entrypoint.rollout_inputs(verl)
    return None if inputs is None else dict(gpu_mem_gib=gpu_mem_gib, **inputs)


def weight_formats(config: RunConfig, model_path: Optional[str] = None) -> rollout.Formats:
    """The formats vLLM loads the weights in: the checkpoint's config.json when it declares them, else the model
    group's record of the released checkpoint (model.weights)."""
    found = rollout.checkpoint_formats(model_path)
    if found is not None:
        return found
    w = config.model.weights
    return rollout.Formats(w.dense, w.experts, f"model.weights ({w.source})" if w.source else "model.weights")


def rollout_ep(verl: dict) -> int:
    e = get(verl, rollout.ROLLOUT_EP) or 1
    return e if isinstance(e, int) and e > 0 else 1


def rollout_for(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh, rparams: tuple,
                gpu_mem_gib: float, model_path: Optional[str] = None) -> Optional[rollout.RolloutEstimate]:
    inputs = rollout_inputs(entrypoint, verl, gpu_mem_gib)
    if inputs is None or rollout.kv_missing(config.model.arch.facts()):
        return None
    t = get(verl, rollout.ROLLOUT_TP)
    d = get(verl, rollout.ROLLOUT_DP) or 1
    if not isinstance(t, int) or t < 1 or not isinstance(d, int) or d < 1 or mesh.world % (t * d):
        return None
    return rollout.estimate(config.model.arch.facts(), rparams, world=mesh.world, rollout_tp=t, rollout_dp=d,
                            formats=weight_formats(config, model_path), rollout_ep=rollout_ep(verl), **inputs)


def activation_words(shapes: Optional[tuple]) -> str:
    """How the activations are known: counted per layer kind and measured, counted and not measured, or the rule
    of thumb."""
    if not shapes:
        return "activations approximated: (34+4k)·h B/token/layer (no per-layer count for this architecture)"
    s = shapes[0]
    return f"activations counted per {s.kind} layer (vrun/estimate/activations.py), " + \
        ("measured on Megatron Lite's step" if s.measured else "approximated: this architecture's step not measured")


def assumptions(inputs: dict, r: Optional[rollout.RolloutEstimate]) -> str:
    off = [n for n, on in (("params+grads", inputs["param_offload"]), ("optimizer", inputs["optimizer_offload"]))
           if on]
    if not inputs["optimizer_offload"] and inputs["offload_fraction"]:
        off.append(f"{inputs['offload_fraction']:.0%} of optimizer")
    if inputs["optimizer"] == "fsdp2":
        b = "fp32" if memory.fsdp2_shard_bytes(inputs.get("family")) == 4 else "bf16"
        held = f"{b} FSDP2 shards and grads, Adam fsdp2 (fp32, on the host when any offload_fraction)"
    else:
        held = f"bf16 weights, fp32 grads, Adam {inputs['optimizer']}"
    parts = [held,
             f"offloaded: {', '.join(off) or 'nothing'}",
             f"recompute {'full' if inputs['recompute'] else 'none'}",
             activation_words(inputs.get("layer_shapes")), "no sequence imbalance"]
    if r is not None:
        parts.append(f"rollout {r.formats.label()} weights ({r.formats.source}), 2 GiB vLLM reserve (estimate)")
        if r.kv.estimate:
            parts.append(f"KV: {r.kv.formula}")
    return "; ".join(parts)


def attach(est, config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh, rparams: tuple, inputs: dict,
           model_path: Optional[str] = None):
    """The training estimate with its rollout phase and its assumptions."""
    r = rollout_for(config, entrypoint, verl, mesh, rparams, inputs["gpu_mem_gib"], model_path)
    return dataclasses.replace(est, rollout_detail=r, assumptions=assumptions(inputs, r))


def rollout_fix(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh, rparams: tuple, gpu_mem_gib: float,
                model_path: Optional[str] = None) -> Optional[rollout.RolloutEstimate]:
    """The smallest rollout replica (TP·DP) that holds the weights and the replica's share of the step (else one
    sequence), among those vLLM and the model allow on this cluster; None when none holds a sequence."""
    inputs = rollout_inputs(entrypoint, verl, gpu_mem_gib)
    if inputs is None:
        return None
    return rollout.smallest_fit(config.model.arch.facts(), rparams, world=mesh.world,
                                gpus_per_node=mesh.gpus_per_node, formats=weight_formats(config, model_path),
                                rollout_ep=rollout_ep(verl), **inputs)


def rollout_problems(r: Optional[rollout.RolloutEstimate], key: str = f"{ROLLOUT}.gpu_memory_utilization",
                     tp_key: str = rollout.ROLLOUT_TP,
                     fix: Optional[rollout.RolloutEstimate] = None, allow_overrun: bool = False,
                     share: bool = True) -> list:
    """A replica whose weights alone exceed vLLM's share of the GPU is an error (certain: weights are counted, not
    estimated). One that cannot hold a single prompt+response even at the low end of the reserve's band (its terms
    are approximated, ×0.5–2) is refused too, unless run.allow_memory_overrun (then a warning); one whose band's
    high end leaves no room for one is a warning (inside the band, as the training step's verdict). One that cannot
    hold a replica's share of the step at once is a warning (vLLM queues the rest). The fix names the smallest
    replica that fits, as overrides. share=False leaves the share's warning out (preflight repeats only what could
    stop vLLM from starting)."""
    from vrun.core.problems import Problem

    if r is None:
        return []
    g = lambda x: f"{x / rollout.GIB:.1f}"  # noqa: E731
    size = f"rollout replica TP{r.tp}·DP{r.dp} ({r.tp * r.dp} GPUs)"
    if fix is not None and (fix.tp, fix.dp) != (r.tp, r.dp):
        fits = f"{fix.fits} of {fix.step_share} sequences at once" if fix.holds_share else \
            f"{fix.fits} sequences at once, fewer than the step's {fix.step_share}"
        cure = f"{rollout.overrides(fix)} (weights {g(fix.weights)} GiB per GPU, {fits})"
    else:
        cure = f"more GPUs, a higher {key.rsplit('.', 1)[-1]} or fp8 rollout (actor_rollout_ref.rollout.quantization=fp8)"
    if r.weights > r.budget:
        return [Problem(tp_key, r.tp, f"{size}: vLLM's weights alone are {g(r.weights)} GiB per GPU "
                        f"({r.formats.label()}), over its {g(r.budget)} GiB (gpu_memory_utilization {r.utilization:g})",
                        cure)]
    worst, best = r.fits_band
    band = (f"{worst}–{best} sequences at once as the reserve runs {rollout.RESERVE_BAND[0]:g}–"
            f"{rollout.RESERVE_BAND[1]:g}× its estimate")
    if best < 1:
        return [Problem(tp_key, r.tp, f"{size}: vLLM's {g(r.budget)} GiB per GPU minus weights {g(r.weights)} GiB "
                        f"and the {g(r.reserve)} GiB reserve (estimate) leaves {g(r.kv_cache)} GiB of KV cache, less "
                        f"than one {r.seq_len}-token prompt+response ({g(r.per_sequence)} GiB), even at the "
                        f"reserve's low end ({band})",
                        cure + ("" if allow_overrun else "; or run.allow_memory_overrun=true to plan anyway"),
                        warning=allow_overrun)]
    out = []
    if worst < 1:
        # inside the band, as the training step's memory verdict: planned, with the margin said (vLLM refuses to
        # start an engine whose KV cache cannot hold one max_model_len sequence)
        held = f"{r.fits} at once" if r.holds_one else "none"
        out.append(Problem(tp_key, r.tp, f"{size}: the KV cache may not hold one {r.seq_len}-token prompt+response "
                           f"({g(r.per_sequence)} GiB): it holds {held} by the estimate, {band}; vLLM does not start "
                           "without room for one", cure + " to hold one at the band's end", warning=True))
    if share and r.holds_one and not r.holds_share:
        out.append(Problem(tp_key, r.tp, f"{size}: the KV cache holds {r.fits} sequences per replica at once, fewer "
                           f"than the {r.step_share} of the step each of {r.replicas} replicas generates (vLLM queues "
                           "the rest)", cure, warning=True))
    return out


def memory_inputs(config: RunConfig, entrypoint: Entrypoint, verl: dict) -> dict:
    """What the estimate reads from the run and verl configs (everything but the mesh)."""
    eng = get(verl, entrypoint.engine, {})
    optim = get(verl, entrypoint.optim, {})
    recompute = get(eng, "impl_cfg.recompute")
    arch = config.model.arch
    return dict(
        optimizer=get(eng, "impl_cfg.optimizer"), hidden=arch.hidden, vocab=arch.vocab or 0,
        top_k=arch.experts_per_token or 0,
        recompute=bool(recompute) and recompute not in ("none", ["none"]),
        # Megatron Lite offloads gradients exactly when it offloads parameters (grad_offload is read by nothing)
        param_offload=bool(eng.get("param_offload")), grad_offload=bool(eng.get("param_offload")),
        optimizer_offload=bool(eng.get("optimizer_offload")),
        offload_fraction=float(get(optim, "override_optimizer_config.offload_fraction") or 0.0),
        gpu_mem_gib=gpu_mem(config), residual_streams=int(arch.hc_mult or 1), family=config.model.mlite_name,
        cross_entropy_fusion=bool(eng.get("cross_entropy_fusion") or get(eng, "impl_cfg.cross_entropy_fusion")),
        layer_shapes=layer_shapes(arch), **entrypoint.token_inputs(verl),
        # no dynamic batch size: tokens_per_gpu is the micro-batch × sequence the CP group shares (memory.rank_tokens)
        cp_group_tokens=entrypoint.token_budget_key(verl) is None)


def layer_shapes(arch) -> Optional[tuple]:
    """What a decoder layer keeps, at CP 1 and with the sequence gathered (vrun.estimate.activations), or None."""
    from vrun.estimate import activations

    facts = arch.facts()
    shapes = (activations.shape(facts, 1), activations.shape(facts, 2))
    return None if None in shapes else shapes


def gpu_mem(config: RunConfig) -> float:
    from vrun.estimate import hardware

    mem, problems = hardware.gpu_mem_gib({"gpu": config.cluster.gpu, "gpu_mem_gib": config.cluster.gpu_mem_gib})
    if problems:
        raise PlanError(problems)
    return mem

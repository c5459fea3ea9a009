"""The plan's memory verdict: the estimate per phase, the rollout's and the training step's verdicts against the
GPU, and the fix a verdict names (a smaller token budget, or a mesh of the same GPUs that fits); the mesh rules the
fix searches under (`rules_of`).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

from vrun.config.schema import RunConfig
from vrun.core.dotted import get
from vrun.core.problems import Problem
from vrun.entrypoints import Entrypoint
from vrun.estimate import memory, rollout
from vrun.estimate.memory import GIB, Estimate
from vrun.estimate.mesh import Mesh, Rules
from vrun.planning import phases
from vrun.planning.param_counts import rollout_params

if TYPE_CHECKING:
    from vrun.estimate.params import ParamCounts


def rules_of(config: RunConfig, entrypoint: Entrypoint, verl: dict) -> Rules:
    """The mesh rules for the model and the engine as verl will run it (use_deepep from the resolved tree)."""
    m = config.model
    return Rules(model=m.name, arch=m.arch, tp_allowed=tuple(m.tp_allowed), etp_allowed=tuple(m.etp_allowed),
                 use_deepep=bool(get(verl, f"{entrypoint.engine}.impl_cfg.use_deepep", False)))


def memory_estimate(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh: Mesh, params,
                    counts: Optional[ParamCounts] = None, model_path: Optional[str] = None) -> Estimate:
    inputs = phases.memory_inputs(config, entrypoint, verl)
    est = memory.estimate(params, mesh, **inputs)
    return phases.attach(est, config, entrypoint, verl, mesh, rollout_params(params, counts), inputs, model_path)


def inputs_optimizer(config: RunConfig, entrypoint: Entrypoint, verl: dict):
    return get(get(verl, entrypoint.engine, {}), "impl_cfg.optimizer")


def memory_problems(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh: Mesh, params,
                    counts: Optional[ParamCounts], model_path: Optional[str], est: Estimate) -> list:
    """The memory verdicts: the rollout replica's (vrun.planning.phases.rollout_problems) and the training step's. A stage
    whose parameters, gradients and optimizer states alone exceed the GPU cannot run: an error. A peak estimate
    over the GPU is refused too unless run.allow_memory_overrun (then a warning)."""
    allow = bool(config.run.allow_memory_overrun)
    out = []
    r = est.rollout_detail
    if r is not None and not r.holds_share:
        fix = phases.rollout_fix(config, entrypoint, verl, mesh, rollout_params(params, counts), est.gpu_mem / GIB,
                                 model_path)
        out += phases.rollout_problems(r, fix=fix, allow_overrun=allow)
    states = max(s.params + s.grads + s.optimizer for s in est.stages) if est.stages else 0.0
    where = f"(cluster.gpu {config.cluster.gpu} / cluster.gpu_mem_gib)"
    cure = memory_cure(config)
    # certain only where the real build checks the count (fsdp2: tests/test_memory_oracle.py); dist_opt's is a formula
    if states > est.gpu_mem and inputs_optimizer(config, entrypoint, verl) == "fsdp2":
        out.append(Problem("memory", f"{states / GIB:.1f}GiB", f"the parameter shards, gradients and optimizer "
                           f"states alone exceed the {est.gpu_mem / GIB:g} GiB per GPU {where} on a pipeline "
                           "stage", memory_cure(config, tokens=False)))
    elif est.rollout + est.rollout_residents > est.gpu_mem:
        u = est.rollout / est.gpu_mem
        room = max(est.gpu_mem - est.rollout_residents, 0) / est.gpu_mem
        out.append(Problem(f"{rollout.ROLLOUT}.gpu_memory_utilization", round(u, 3), f"vLLM's "
                           f"{est.rollout / GIB:.1f} GiB and the actor's {est.rollout_residents / GIB:.1f} GiB left on "
                           f"the GPU (estimate) exceed its {est.gpu_mem / GIB:g} GiB {where} by "
                           f"{(est.rollout + est.rollout_residents - est.gpu_mem) / GIB:.1f} GiB",
                           f"gpu_memory_utilization at most {math.floor(room * 100) / 100:g}, or offload the actor "
                           "(engine.param_offload / engine.optimizer_offload)"
                           + ("" if allow else "; or run.allow_memory_overrun=true to plan anyway"), warning=allow))
    elif not est.fits:
        out.append(band_problem(config, entrypoint, verl, mesh, params, est, where, cure, allow))
    return out


def memory_cure(config: RunConfig, tokens: bool = True) -> str:
    """What shrinks a stage's memory, in general words (a verdict's fallback fix): a larger PP·EP mesh, more offload,
    a smaller token budget (not for the states alone, which it does not shrink), mesh=auto only where the mesh was
    given (under mesh=auto it was searched already)."""
    base = "a larger PP·EP mesh, more offload, a smaller token budget" if tokens else \
        "a larger PP·EP mesh or more offload"
    return base + ("" if config.mesh.search else ", or mesh=auto")


def band_problem(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh: Mesh, params, est: Estimate, where: str,
                 cure: str, allow: bool) -> Problem:
    """The GPU below the estimate's band (refused unless run.allow_memory_overrun), or inside it (a warning): the
    band, the margin, the terms that decide it, and a change that puts the band's high end under the GPU."""
    gib, gpu = GIB, est.gpu_mem / GIB
    decide = ", ".join(f"{t} {v:.1f} GiB ({k.how}, ×{k.factors[0]:g}–{k.factors[1]:g})" for t, v, k in est.deciding())
    band = f"band {est.low / gib:.1f}–{est.high / gib:.1f} GiB"
    stage = f"busiest stage {est.stage}: {est.layers_on_stage} layers" if len(est.stages) > 1 else \
        f"{est.layers_on_stage} layers"
    inputs = phases.memory_inputs(config, entrypoint, verl) if params is not None else None
    fixes = [f for f in (token_fix(config, entrypoint, verl, mesh, params, inputs),
                         mesh_fix(config, entrypoint, verl, mesh, params, inputs)) if f]
    fix = " or ".join(fixes) if fixes else cure
    if not est.may_fit:
        return Problem("memory", f"{est.peak / gib:.1f}GiB", f"the estimate exceeds the {gpu:g} GiB per GPU {where} "
                       f"even at its band's low end ({band}, {stage}; the terms that decide it: {decide})",
                       fix + ("" if allow else "; or run.allow_memory_overrun=true to plan anyway"), warning=allow)
    over = " — the estimate itself is over the GPU" if est.peak > est.gpu_mem else ""
    return Problem("memory", f"{est.peak / gib:.1f}GiB", f"the {gpu:g} GiB per GPU {where} lies inside the estimate's "
                   f"{band} (estimate {est.peak / gib:.1f} GiB{over}, {stage}): it may run out of memory by up to "
                   f"{(est.high - est.gpu_mem) / gib:.1f} GiB; the terms that decide it: {decide}",
                   f"{fix} to fit the whole band", warning=True)


def token_fix(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh: Mesh, params,
              inputs: Optional[dict]) -> Optional[str]:
    """The largest per-GPU token budget (a multiple of 1024, at least one whole sequence over the CP group) whose
    band fits the GPU,
    as an override; None when the budget is not a token count (no dynamic batch size) or none fits."""
    key = entrypoint.token_budget_key(verl)
    if key is None or params is None:
        return None
    step = 1024
    least = -(-max(int(inputs["seq_len"] or 0), 1) // mesh.cp)     # one sequence over the CP group's budget
    lo, hi = -(-least // step), int(inputs["tokens_per_gpu"]) // step    # in steps; the band grows with tokens
    best = None
    while lo <= hi:     # the largest multiple of `step` whose band fits (bisection: budgets may be huge)
        mid = (lo + hi) // 2
        e = memory.estimate(params, mesh, **dict(inputs, tokens_per_gpu=mid * step))
        if e.fits:
            best, lo = (mid * step, e), mid + 1
        else:
            hi = mid - 1
    if best is None:
        return None
    tokens, e = best
    return f"verl.{key}={tokens} (band {e.low / GIB:.1f}–{e.high / GIB:.1f} GiB)"


def mesh_fix(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh: Mesh, params,
             inputs: Optional[dict]) -> Optional[str]:
    """The mesh of the same GPUs, with the configured rollout replica, that mesh=auto's memory ranking puts first,
    when its band fits the GPU; as overrides with its band. None when none does."""
    from vrun.estimate import meshes, search

    if params is None:
        return None
    tps = [(get(verl, rollout.ROLLOUT_TP) or 1, get(verl, rollout.ROLLOUT_DP) or 1)] \
        if entrypoint.rollout_inputs(verl) is not None else None
    valid = meshes.valid_meshes(rules_of(config, entrypoint, verl), mesh.nnodes, mesh.gpus_per_node, verl,
                                entrypoint, tps)
    found = search.rank(valid, lambda m: memory.estimate(params, m, **inputs),
                        cp_matters=memory.cp_matters(inputs["layer_shapes"], inputs["cp_group_tokens"]))
    if not found or not found[0].fits or found[0].mesh == mesh:
        return None
    e = found[0].estimate
    return f"{found[0].mesh.overrides()} (band {e.low / GIB:.1f}–{e.high / GIB:.1f} GiB)"

"""mesh=auto: every valid training mesh of the GPUs ranked by the memory estimate and the predicted step time, the
rollout replica chosen beside it, and — when no mesh fits — the fewest nodes on which one does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from vrun.config.schema import RunConfig
from vrun.core.dotted import get
from vrun.core.problems import PlanError, Problem
from vrun.entrypoints import Entrypoint
from vrun.estimate import memory, rollout
from vrun.estimate.memory import GIB
from vrun.estimate.mesh import Mesh, Rules
from vrun.planning import phases
from vrun.planning.param_counts import rollout_params

if TYPE_CHECKING:
    from vrun.estimate.params import ParamCounts
    from vrun.estimate.search import MeshSearch


def nothing_fits(config: RunConfig, entrypoint: Entrypoint, rules: Rules, mesh: Mesh, verl: dict, params,
                 inputs: dict, best, best_overrides: str, tps) -> Problem:
    """mesh=auto when no mesh of the GPUs fits by the estimate: the lowest-peak mesh, and the fewest nodes (doubling)
    on which the search finds a mesh that fits."""
    from vrun.estimate import meshes, search

    gpn = mesh.gpus_per_node
    fix = "more GPUs (mesh.nnodes), more offload, or a smaller token budget"
    n = mesh.nnodes
    for _ in range(6):
        n *= 2
        world = n * gpn
        tp_opts = rollout.choices(world, gpn, config.model.arch.facts(), phases.rollout_ep(verl) > 1) \
            if tps is not None else None
        found = search.rank(meshes.valid_meshes(rules, n, gpn, verl, entrypoint, tp_opts),
                            lambda m: memory.estimate(params, m, **inputs))
        if found and found[0].fits:
            fix = f"mesh.nnodes={n} ({world} GPUs: {found[0].mesh.overrides()} peaks at " \
                  f"{found[0].estimate.peak / GIB:.1f} GiB)"
            break
    return Problem("mesh", "auto", f"no mesh of {mesh.nnodes}×{gpn}={mesh.world} GPUs fits {config.model.name} in "
                   f"{best.estimate.gpu_mem / GIB:g} GiB per GPU by the estimate; the lowest band is "
                   f"{best.estimate.low / GIB:.1f}–{best.estimate.high / GIB:.1f} GiB with {best_overrides}", fix)


def auto_mesh(config: RunConfig, entrypoint: Entrypoint, rules: Rules, mesh: Mesh, verl: dict, params, note: str,
              counts: Optional[ParamCounts], problems: list) -> tuple[Mesh, Optional[tuple], MeshSearch]:
    """mesh=auto: every valid training mesh ranked by the estimate — among those that fit, the lower predicted step
    time first (vrun.planning.steptime_plan.mesh_timer, with the rollout replica chosen beside the mesh) — and the
    rollout TP chosen beside it (a second, small choice: within a node, tiling the GPUs, within the model's rules,
    ranked by KV fit). Returns the mesh, the rollout (TP, DP) to set (None: keep the configured one) and what the
    plan records about the search (with the ranking entry that chose the mesh)."""
    import time

    from vrun.estimate import meshes, search
    from vrun.planning import steptime_plan

    model, arch = config.model, config.model.arch.facts()
    rollout_on = entrypoint.rollout_inputs(verl) is not None  # a rollout phase: its TP is chosen beside the mesh
    t = time.perf_counter()
    world, gpn = mesh.world, mesh.gpus_per_node
    pinned = get(config.verl, rollout.ROLLOUT_TP)
    tps = None
    ep_on = phases.rollout_ep(verl) > 1
    if rollout_on:
        tps = rollout.choices(world, gpn, arch, ep_on)
        if pinned is not None:
            tps = [x for x in tps if x[0] == pinned]
    valid = meshes.valid_meshes(rules, mesh.nnodes, gpn, verl, entrypoint, tps)
    inputs = phases.memory_inputs(config, entrypoint, verl) if params is not None else None
    ropts = []
    # the rollout replica depends on the GPUs, not on the training mesh: chosen first, the step times use it
    if rollout_on and valid and params is not None and not rollout.kv_missing(arch):
        rin = phases.rollout_inputs(entrypoint, verl, inputs["gpu_mem_gib"])
        configured = (get(verl, rollout.ROLLOUT_TP), get(verl, rollout.ROLLOUT_DP))
        ropts = rollout.choose(arch, rollout_params(params, counts), world=world, gpus_per_node=gpn,
                               configured=configured, allowed=tps, formats=phases.weight_formats(config),
                               rollout_ep=2 if ep_on else 1, **rin)
    rtp, rdp = (ropts[0].tp, ropts[0].dp) if ropts else (tps[0] if tps else (None, None))
    timer, time_note = (None, note) if params is None else steptime_plan.mesh_timer(
        config, entrypoint, verl, mesh, counts, ropts[0] if ropts else None, (rtp, rdp) if rollout_on else None)
    if params is not None:
        ranked = search.rank(valid, lambda m: memory.estimate(params, m, **inputs), timer,
                             cp_matters=memory.cp_matters(inputs["layer_shapes"], inputs["cp_group_tokens"]))
    else:
        ranked = search.rank(valid)
    seconds = time.perf_counter() - t
    if not ranked:
        why = search.binding_constraint(rules, mesh.nnodes, gpn, verl, entrypoint, tps)
        raise PlanError(problems + [Problem("mesh", "auto", f"no mesh of {mesh.nnodes}×{gpn} GPUs "
                                            f"passes the plan's checks for {model.name}"
                                            + (f"; binding: {why.key}={why.value}: {why.why}" if why else ""),
                                            why.fix if why else "change mesh.nnodes / mesh.gpus_per_node or the "
                                            "batch sizes")])
    moved = False
    if ranked and ranked[0].estimate is not None and not ranked[0].fits and not ranked[0].estimate.may_fit:
        # ranked by the band's high end: a mesh with a wider band may still hold the GPU at its low end
        within = next((c for c in ranked if c.estimate is not None and c.estimate.may_fit), None)
        if within is not None and within is not ranked[0]:
            ranked = [within] + [c for c in ranked if c is not within]
            moved = True
    choice = (rtp, rdp, (rtp * rdp if rtp * rdp > 1 else 1) if ep_on else None) \
        if rollout_on and pinned is None and rtp is not None else None
    rsuffix = (rollout.overrides(ropts[0]) if ropts else f"verl.{rollout.ROLLOUT_TP}={rtp} "
               f"verl.{rollout.ROLLOUT_DP}={rdp}") if rollout_on and rtp is not None else ""
    top = [{"overrides": " ".join(x for x in (c.mesh.overrides(), rsuffix) if x), "dp": c.mesh.dp,
            "edp": c.mesh.edp, "rollout_tp": rtp,
            "peak_gib": round(c.estimate.peak / GIB, 1) if c.estimate is not None else None, "fits": c.fits,
            "band_gib": [round(c.estimate.low / GIB, 1), round(c.estimate.high / GIB, 1)]
            if c.estimate is not None else None,
            **search.candidate_row(c)}
           for c in ranked[:6]]
    # the best mesh's band above the GPU even at its low end: no mesh of these GPUs can be planned (within the band:
    # it plans, and the memory verdict warns)
    if ranked[0].estimate is not None and not ranked[0].estimate.may_fit and not config.run.allow_memory_overrun:
        raise PlanError(problems + [nothing_fits(config, entrypoint, rules, mesh, verl, params, inputs, ranked[0],
                                                 top[0]["overrides"], tps)])
    rollout_rank = [{"tp": r.tp, "dp": r.dp, "replicas": r.replicas, "sequences_fit": r.fits,
                     "step_sequences_per_replica": r.step_share, "overrides": rollout.overrides(r)}
                    for r in ropts[:4]]
    entry, why = search.decision(ranked, time_note)
    if moved:
        entry, why = None, "no mesh's band fits below the GPU: the first by the band's high end whose low end it holds"
    return ranked[0].mesh, choice, search.MeshSearch(
        valid_meshes=len(valid), search_ms=round(seconds * 1000, 1), chosen=top[0], alternatives=tuple(top[1:]),
        rollout_tp_choices=tuple(rollout_rank), memory="estimated" if params is not None else note,
        chosen_by=why, time="estimated" if timer is not None else time_note, decided_by=entry)

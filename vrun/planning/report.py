"""A plan, reported: the table printed before anything runs, plan.json and verl_config.yaml in the run dir,
and the one line per point a sweep prints. Reads the plan only."""
from __future__ import annotations

import sys
from pathlib import Path

from vrun.rundir import records as rundir
from vrun.rundir.record import (FORMAT, PLAN, MeshRecord, MliteRecord, ModelRecord, PlanRecord,
                                TorchrunRecord)
from vrun.compose import verl_tree
from vrun.estimate.memory import GIB
from vrun.planning.plan import Plan


def record(plan: Plan, **fields) -> PlanRecord:
    """The plan as plan.json holds it (vrun.rundir.record), with `fields` (e.g. slurm, node_checks) set."""
    import dataclasses

    c, m = plan.config, plan.mesh
    r = PlanRecord(
        format=FORMAT, run_id=rundir.run_id(plan.run_dir), mode=str(c.mode), cluster=str(c.cluster.name),
        entrypoint=plan.entrypoint.launches, launcher=plan.entrypoint.name.value, argv=list(plan.argv),
        env=dict(plan.env), env_unset=list(plan.env_unset), pass_env=plan.pass_env,
        mesh=MeshRecord(**m.summary()), run_dir=plan.run_dir,
        model=ModelRecord(c.model.name, plan.model_path, plan.model_path_source), algo=c.algo.name,
        optimizer=c.optimizer.name.value, verl_config=f"{plan.run_dir}/verl_config.yaml",
        verl_config_name=plan.request.config_name, verl_groups=list(plan.request.groups),
        verl_overrides=[o.cli() for o in plan.request.overrides],
        mlite=MliteRecord(plan.mlite.kind, plan.mlite.location), stack=plan.stack, batch=plan.batch,
        memory=plan.memory.summary() if plan.memory is not None else {"unavailable": plan.memory_note},
        pipeline=plan.pipeline, time=time_json(plan),
        cost=plan.cost if plan.cost is not None else {"unavailable": plan.time_note},
        warnings=[w.line() for w in plan.warnings], cluster_group=dataclasses.asdict(c.cluster),
        torchrun=TorchrunRecord(sys.executable, list(c.run.sft_entry), m.gpus_per_node),
        mesh_search=plan.search.summary() if plan.search is not None else None,
        checkpoint=plan.checkpoint.summary() if plan.checkpoint is not None else None,
        params=plan.params.summary() if plan.params is not None else None,
        watch=watch(plan), resume_mesh_change=bool(c.run.resume_mesh_change),
    )
    return dataclasses.replace(r, **fields)


def _stacks_here() -> str:
    from vrun.core import ptrace
    from vrun.planning import watch as watching

    return watching.stacks_line(ptrace.py_spy() is not None, ptrace.scope(), ptrace.has_cap_sys_ptrace())


def watch(plan: Plan):
    """How the job will be watched (vrun.planning.watch)."""
    from vrun.planning import watch as watching

    high = plan.time.high if plan.time is not None else None
    total = plan.params.total if plan.params is not None else None
    return watching.policy(plan.config.run, high, total, plan.mesh.nnodes, _stacks_here(),
                           str(plan.config.cluster.name), *phase_inputs(plan))


def phase_inputs(plan: Plan) -> tuple:
    """The plan's phase bands {phase: (low_s, high_s)} and its save estimate, for each phase's bound; none for a
    trainer under torchrun (SFT): its phases are no Ray actor methods the watchdog could see."""
    from vrun.estimate import timelimit

    if plan.entrypoint.name.value == "sft":
        return {}, None
    bands = {n: (plan.time.phase(n).low, plan.time.phase(n).high) for n in plan.time.phases} if plan.time else {}
    save = timelimit.save_seconds(timelimit.training_state_bytes(plan.memory), plan.mesh.gpus_per_node) \
        if plan.memory is not None else None
    return bands, save


def plan_json(plan: Plan, **fields) -> dict:
    """plan.json's content as JSON values (the record's; tests and the picture read sections of it)."""
    import dataclasses

    return dataclasses.asdict(record(plan, **fields))


def time_json(plan: Plan) -> dict:
    from vrun.planning import steptime_plan

    if plan.time is None:
        return {"unavailable": plan.time_note}
    return {**plan.time.summary(), "kind": steptime_plan.kind(plan.config, plan.verl)}


def write(plan: Plan, **fields) -> None:
    """<run dir>/verl_config.yaml and plan.json (its record, with `fields` set: e.g. the SLURM submission), through
    the one writer (vrun.core.writer): masked, never through a link; verl_config.yaml verbatim or refused."""
    from vrun.checks import paths as check_paths
    from vrun.core import writer
    from vrun.core.problems import PlanError, Problem

    d = Path(plan.run_dir)
    text = plan.verl_text
    if getattr(plan.config.run, "resume", False):
        found = check_paths.same_plan(plan.run_dir, text)
        if found:
            raise PlanError(found)
    d.mkdir(parents=True, exist_ok=True)
    try:
        writer.write_text(d / "verl_config.yaml", text, root=d, verbatim=True)
        writer.write_text(d / PLAN, record(plan, **fields).to_json(), root=d)
    except writer.SecretRefused as e:
        raise PlanError([Problem("verl", "<hidden>", f"{e}: verl must run what the plan says, so it is not "
                                 "rewritten", "remove the secret from the config; pass it by name in pass_env")])
    except OSError as e:
        raise PlanError([Problem("hydra.run.dir", plan.run_dir, str(e), "a plain directory of your own, without "
                                 "links")])
    rundir.index_add(plan.run_dir)
    verl_tree.keep_composed()  # once a plan was written: a refused plan leaves nothing in the state dir


def table(plan: Plan) -> str:
    m, c = plan.mesh, plan.config
    rows = [
        f"run     {c.model.name} · {c.algo.name} · optimizer {c.optimizer.name} · cluster "
        f"{c.cluster.name} · mode {c.mode}",
        f"GPUs    {m.world} = {m.nnodes} node(s) × {m.gpus_per_node}",
        f"dense   TP{m.tp} · CP{m.cp} · PP{m.pp} · DP{m.dp} = {m.world}",
        f"expert  ETP{m.etp} · EP{m.ep} · PP{m.pp} · EDP{m.edp} = {m.world}   (vpp {m.vpp})",
    ]
    rows += plan.entrypoint.batch_rows(plan.batch)
    rows += plan.entrypoint.recipe_rows(plan.verl, c.algo)
    rows += memory_rows(plan)
    rows += time_rows(plan)
    rows += [
        f"model   {plan.model_path or '(unset)'}  [{plan.model_path_source}]",
        f"entry   {plan.entrypoint.launches}",
        f"verl    {plan.request.config_name} + {len(plan.request.overrides)} overrides; verl_mlite from "
        f"{plan.mlite.kind}",
        f"run dir {plan.run_dir}",
    ]
    rows += [w.line() for w in plan.warnings]
    return "\n".join(rows)


def one_line(idx: int, overrides, plan: Plan) -> str:
    from vrun.config.overrides import shown_override

    m = plan.mesh
    return (f"point {idx} [{' '.join(shown_override(o) for o in overrides)}]: {m.world} GPUs TP{m.tp} CP{m.cp} PP{m.pp} DP{m.dp} "
            f"EP{m.ep} ETP{m.etp} EDP{m.edp} → {plan.run_dir}")


def time_rows(plan: Plan) -> list[str]:
    from vrun.planning import recorder, steptime_plan, watch as watching

    rows = [f"step    no estimate: {plan.time_note}"] if plan.time is None else \
        [steptime_plan.time_line(plan.time, plan.cost)]
    rows.append(watching.line(watch(plan)))
    rows.append(recorder.line(recorder.support(), str(plan.config.cluster.name)))
    return rows + list(plan.deadline_rows)


def memory_rows(plan: Plan) -> list[str]:
    rows = []
    if plan.search is not None:
        rows.extend(plan.search.rows())
    if plan.checkpoint is not None:
        t = plan.checkpoint.totals
        b = lambda n: f"{n:,}"  # noqa: E731  (exact logical parameter counts)
        rows.append(f"params  checkpoint: {b(t['total'])} = dense {b(t['dense'])} + routed experts "
                    f"{b(t['routed_expert'])} + MTP {b(t['mtp'])} + vision {b(t['vision'])}"
                    f"{'' if plan.checkpoint.complete else ' (incomplete: unknown layouts)'}")
    e = plan.memory
    if e is None:
        rows.append(f"memory  no estimate: {plan.memory_note}")
        return rows
    g = lambda x: f"{x / GIB:.1f}"  # noqa: E731
    which = f"busiest stage {e.stage} of {len(e.stages)}" if len(e.stages) > 1 else f"stage {e.stage}"
    rows.append(f"memory  per GPU, {which} ({e.layers_on_stage} layers): params {g(e.weights)} + grads "
                f"{g(e.grads)} + optimizer {g(e.optimizer)} (host {g(e.optimizer_host)}) + activations "
                f"{g(e.activations)} + max(layer in backward {g(e.layer)}, logits {g(e.logits)}) + transient "
                f"{g(e.transient)} = {g(e.train_peak)} GiB training")
    r = e.rollout_detail
    if r is not None:
        parts = " + ".join(f"{t.replace('_', ' ')} {g(b)}" for t, b in r.reserve_terms)
        rows.append(f"        rollout phase: vLLM {g(r.budget)} GiB (its own cap: gpu_memory_utilization × GPU) = "
                    f"weights {g(r.weights)} (TP{r.tp}·DP{r.dp}) + reserve {g(r.reserve)} ({parts}; approximated "
                    f"×0.5–2) + KV cache {g(r.kv_cache)}; actor residents {g(e.rollout_residents)} GiB beside it")
        per_tok = f"{r.kv.per_token / 1024:.1f} KiB/token" + \
            (f" + {r.kv.per_sequence / 2 ** 20:.1f} MiB/sequence" if r.kv.per_sequence else "")
        rows.append(f"        KV      {per_tok} per GPU ({r.kv.formula}); {r.fits} (band {r.fits_band[0]}–"
                    f"{r.fits_band[1]}) of the step's {r.step_share} sequences per replica fit at once ({r.seq_len} "
                    "tokens each)")
    if r is not None and not r.holds_one:
        verdict = f"(the rollout does NOT fit: see the warning; band {g(e.low)}–{g(e.high)} GiB)"
    else:
        verdict = f"({e.verdict()})"
    rows.append(f"        peak {g(e.peak)} of {g(e.gpu_mem)} GiB per GPU {verdict}"
                f" = max(training {g(e.train_peak)}, rollout {g(e.rollout)} + residents {g(e.rollout_residents)})")
    known = {}
    for term, k in e.known.items():
        known.setdefault((k.how, k.factors), []).append(term)
    rows.append("        terms   " + "; ".join(f"{', '.join(ts)} {how} (×{lo:g}–{hi:g})"
                                              for (how, (lo, hi)), ts in known.items()))
    if plan.params is not None:
        pc = plan.params
        active = f", active {pc.active / 1e9:.1f}B" if pc.active else ""
        mtp = f" ({(pc.total - pc.mtp) / 1e9:.1f}B without the {pc.mtp / 1e9:.1f}B MTP)" if pc.mtp else ""
        rows.append(f"params  {pc.total / 1e9:.1f}B total{mtp}{active} [{pc.source}]"
                    + (f"; not sourced: {', '.join(pc.estimates)}" if pc.estimates else ""))
    if e.assumptions:
        rows.append(f"assume  {e.assumptions}")
    return rows

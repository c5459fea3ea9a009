"""A plan: everything a run will do, computed and checked before anything starts.

make_plan() is the one place that turns the typed run config into the mesh, the verl config, the command and
the environment; train mode executes exactly that plan. In order: the mesh (built and validated once), the
entrypoint's record, verl's tree (composed, overridden and resolved once), the parameter counts, mesh=auto's
search, the checks, the memory estimate. Its parts, each a module of its own (their names importable from here): the
model path (vrun.planning.model_path), the parameters counted (param_counts), the memory verdict and its fixes
(memory_verdict), mesh=auto's search (auto_mesh). Reporting it (table, plan.json) is vrun.planning.report. No
torch, ray or verl imports here.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from vrun import entrypoints
from vrun.checks import values as check_values, plan_checks as checks
from vrun.estimate import memory, rollout
from vrun.compose import mlite, stack, translate, verl_tree, verl_values
from vrun.core.dotted import get
from vrun.entrypoints import Entrypoint
from vrun.estimate.memory import Estimate
from vrun.estimate.mesh import Mesh
from vrun.core.problems import PlanError, Problem
from vrun.config.schema import RunConfig
from vrun.core.writer import is_secret_name
from vrun.core import fs
from vrun.planning.auto_mesh import auto_mesh, nothing_fits  # noqa: F401 - mesh=auto; importable from here
from vrun.planning.memory_verdict import (  # noqa: F401 - the memory verdict; importable from here
    band_problem, inputs_optimizer, memory_cure, memory_estimate, memory_problems, mesh_fix, rules_of, token_fix)
from vrun.planning.model_path import normalise_path, resolve_model_path  # noqa: F401 - importable from here
from vrun.planning.param_counts import (  # noqa: F401 - the parameters counted; importable from here
    model_params, pipeline_stages, rollout_params, with_built_mtp)

if TYPE_CHECKING:
    from vrun.estimate.checkpoint import CheckpointSummary
    from vrun.estimate.params import ParamCounts
    from vrun.estimate.search import MeshSearch

# unset when CUDA_VISIBLE_DEVICES is set (Ray refuses both); the SLURM node job decides it again on the node
UNSET_WITH_CUDA = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
# first on the run's PYTHONPATH: every process of the run can dump its own stack on a stall where py-spy may not
# attach (vrun/launch/stackhook/sitecustomize.py, read by vrun.launch.stacks); it imports the next sitecustomize
STACK_HOOK = PROJECT_ROOT / "vrun" / "launch" / "stackhook"
# a larger world is a typo; refusing it up front keeps every answer (and the mesh suggestions) about a second (the
# run dir's readers hold a plan.json to it too)
from vrun.rundir.files import MAX_WORLD  # noqa: E402


@dataclass
class Plan:
    config: RunConfig                        # the typed run config (with mesh=auto's choice in config.mesh)
    entrypoint: Entrypoint                   # the entrypoint's record: PPO on Ray or SFT under torchrun
    mesh: Mesh
    run_dir: str
    verl: dict                               # verl's resolved tree, written as <run dir>/verl_config.yaml
    request: translate.VerlRequest
    argv: list
    env: dict
    env_unset: list
    model_path: Optional[str]
    model_path_source: str
    mlite: mlite.MliteSource
    warnings: list = field(default_factory=list)
    memory: Optional[Estimate] = None        # None when no estimate can be made (memory_note says why)
    memory_note: str = ""
    search: Optional[MeshSearch] = None      # mesh=auto: what was searched and the top alternatives
    checkpoint: Optional[CheckpointSummary] = None  # parameter counts read from the checkpoint
    params: Optional[ParamCounts] = None     # total, active, source, ... and the per-stage split
    pipeline: list = field(default_factory=list)  # per stage: decoder layers [first, last], embedding/MTP/loss
    stack: dict = field(default_factory=dict)     # the verl and verl_mlite it was composed against (vrun.compose.stack)
    time: Optional[object] = None            # vrun.estimate.steptime.StepTime (None: time_note says why)
    time_note: str = ""
    cost: Optional[dict] = None              # GPU-hours for the configured steps (vrun.planning.steptime_plan.cost)
    deadline_rows: list = field(default_factory=list)  # SLURM: whether verl saves before the time limit

    @functools.cached_property
    def verl_text(self) -> str:
        """verl's tree as <run dir>/verl_config.yaml holds it (rendered once; a sweep renders it where it plans)."""
        from vrun.core import yaml_text

        return yaml_text.dump(self.verl)

    @property
    def pass_env(self) -> list:
        return list(self.config.pass_env)

    @property
    def batch(self) -> dict:
        return self.entrypoint.batch_summary(self.verl, self.mesh)


def run_env(config: RunConfig, environ: dict) -> tuple[dict, list, list[Problem]]:
    """Variables the run sets (in the environment Ray/torchrun start from, and in Ray's runtime env)."""
    env: dict[str, str] = {}
    problems = []
    for src in (config.env, config.model.env):
        for k, v in src.items():
            if is_secret_name(str(k)):
                problems.append(Problem(f"env.{k}", "<hidden>", "a secret's value would be written into the plan "
                                        "and the verl config", f"export {k} and add it to pass_env instead"))
                continue
            env[k] = str(v)
    # the stack hook, Megatron Lite's paths (its sitecustomize must run in every worker: the hook imports it), then
    # this project (vrun.launch.entry)
    paths = [str(STACK_HOOK)] + mlite.mlite_paths(environ) + [str(PROJECT_ROOT)]
    env["PYTHONPATH"] = ":".join(paths + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))
    unset = list(UNSET_WITH_CUDA) if environ.get("CUDA_VISIBLE_DEVICES") else []
    return env, unset, problems


def make_plan(config: RunConfig, run_dir: str, *, single_model: bool = True, environ: Optional[dict] = None,
              python: Optional[str] = None, run_dir_key: str = "hydra.run.dir", typed: tuple = ()) -> Plan:
    """config: the typed run config (vrun.config.schema.typed); run_dir_key: the key that set the run dir (a sweep
    point's is hydra.sweep.dir); typed: the overrides typed on the command line. Raises PlanError with every
    error found."""
    environ = dict(os.environ if environ is None else environ)
    run_dir = str(Path(run_dir).absolute())
    problems: list[Problem] = []
    path, path_from, p = resolve_model_path(config.model, environ, single_model)
    problems += p
    env, unset, p = run_env(config, environ)
    problems += p + check_values.run_config(config) + price_problems(config)
    try:
        mesh = Mesh.of(config.mesh)
    except PlanError as e:
        raise PlanError(problems + e.problems)
    if mesh.world > MAX_WORLD:
        raise PlanError(problems + [Problem("mesh.nnodes", mesh.nnodes, f"{mesh.nnodes}×{mesh.gpus_per_node} = "
                                            f"{mesh.world:,} GPUs is beyond any cluster (at most {MAX_WORLD:,})",
                                            "mesh.nnodes=<the nodes you have>")])
    ep = entrypoints.of(config)
    problems += ep.run_dir_problems(run_dir, run_dir_key) + ep.typed_problems(list(typed))
    placeholder = path if path else f"<unset: {config.model.path_env}>"
    req = translate.build(config, ep, mesh, run_dir, env, placeholder)
    tree = verl_tree.base_tree(req.config_name, req.groups)
    problems += req.problems + verl_tree.apply(tree, req.overrides)
    if [x for x in problems if not x.warning]:
        raise PlanError(problems)
    resolved = verl_tree.resolve(tree)
    problems += check_values.verl(resolved, ep, verl_tree.base_view(req.config_name, req.groups)) + \
        verl_values.problems(resolved)
    if [x for x in problems if not x.warning]:
        raise PlanError(problems)
    rules = rules_of(config, ep, resolved)
    params, params_note, ckpt, counts = model_params(config, ep, path, problems, resolved)
    params = with_built_mtp(params, config, ep, resolved)
    search = None
    if config.mesh.search:
        mesh, rollout_choice, search = auto_mesh(config, ep, rules, mesh, resolved, params, params_note, counts,
                                                 problems)
        # only the mesh's keys (and the rollout TP·DP chosen beside it) change: set them in the tree already
        # built and resolve it again
        config = dataclasses.replace(config, mesh=dataclasses.replace(config.mesh, **{
            f.name: getattr(mesh, f.name) for f in dataclasses.fields(Mesh)}))
        req = req.with_mesh(ep, mesh, rollout_choice)
        verl_tree.apply(tree, translate.mesh_overrides(ep, mesh, rollout_choice))
        resolved = verl_tree.resolve(tree)
    found = checks.check_all(config, ep, resolved, mesh, rules)
    problems += found
    if [x for x in problems if not x.warning]:
        hints = []
        if any(x.key.startswith("mesh.") and not x.warning for x in found):
            from vrun.estimate import meshes

            hints = meshes.hints(rules, mesh, resolved, ep)
        raise PlanError(problems, hints=hints)
    argv = ep.command(config, run_dir, mesh, python or sys.executable)
    source = mlite.find_source()
    warnings = [x for x in problems if x.warning]
    if source.kind == "record":
        warnings.append(Problem("verl_mlite", None, "not importable: planned against the project's record of "
                                f"its config (Megatron-LM {mlite.record()['megatron_lm_commit'][:8]})",
                                "export MLITE_ROOT=/path/to/Megatron-LM for preflight and train", warning=True))
    est = memory_estimate(config, ep, resolved, mesh, params, counts, path) if params is not None else None
    if est is not None:
        found = memory_problems(config, ep, resolved, mesh, params, counts, path, est)
        if [x for x in found if not x.warning]:
            raise PlanError(problems + found)
        warnings += found
        missing = rollout.kv_missing(config.model.arch.facts()) if ep.rollout_inputs(resolved) is not None else []
        if missing:
            warnings.append(Problem(f"model.arch.{missing[0]}", None, f"the rollout's KV cache formula for "
                                    f"{config.model.arch.attention} attention needs {', '.join(missing)}: no rollout "
                                    "estimate", f"set model.arch.{missing[0]} (the checkpoint's config.json has it)",
                                    warning=True))
        counts = dataclasses.replace(counts, per_stage=tuple(memory.stage_split(params, mesh)))
    from vrun.planning import steptime_plan

    st, st_note = steptime_plan.estimate(config, ep, resolved, mesh, counts, est)
    cost = steptime_plan.cost(st, mesh.world, resolved, config.cluster.gpu_hour_price) \
        if st is not None else None
    found, deadline_rows, redundant = deadline_problems(config, resolved, st, counts, mesh, est)
    if [x for x in found if not x.warning]:
        raise PlanError(problems + [x for x in found if not x.warning])
    warnings += found
    if redundant is not None:  # verl counts 60 s for a save: the seconds this save takes beyond that
        extra = [verl_tree.Override("trainer.esi_redundant_time", redundant, "set")]
        req = dataclasses.replace(req, overrides=list(req.overrides) + extra)
        verl_tree.apply(tree, extra)
        resolved = verl_tree.resolve(tree)
    return Plan(config=config, entrypoint=ep, mesh=mesh, run_dir=run_dir, verl=resolved, request=req, argv=argv,
                env=env, env_unset=unset, model_path=path, model_path_source=path_from, mlite=source,
                warnings=warnings, memory=est, memory_note=params_note, search=search, checkpoint=ckpt, params=counts,
                pipeline=pipeline_stages(config, ep, resolved, mesh, params), stack=stack.current(), time=st,
                time_note=st_note, cost=cost, deadline_rows=deadline_rows)


def deadline_problems(config: RunConfig, resolved: dict, st, counts, mesh, est) -> tuple[list, list, Optional[int]]:
    """cluster=slurm, ray, kuberay: whether this run's verl trainer saves before the deadline the job gives it
    (vrun.estimate.timelimit: only RayPPOTrainer, trainer.use_v1=false, asks; nothing saves without
    trainer.save_freq > 0), and whether the time limit holds the model load, the steps before the first save and
    that save. Returns (warnings, the plan table's `deadline` rows, the trainer.esi_redundant_time to write: the
    save's seconds beyond the 60 verl counts, where this trainer saves before the deadline and the user set none)."""
    values = check_values
    cluster = str(config.cluster.name)
    if cluster not in ("slurm", "ray", "kuberay"):
        given = get(resolved, "trainer.esi_redundant_time", 0)
        return ([Problem(values.ESI_KEY, given, "verl's pre-deadline save, which only a job with a deadline gives it "
                         f"(MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP: SLURM's, a Ray job's, KubeRay's): on "
                         f"cluster={cluster} read by nothing", f"drop {values.ESI_KEY}, or cluster=slurm",
                         warning=True)] if given else []), [], None
    from vrun.estimate import timelimit
    from vrun.planning import watch

    root = verl_values.verl_root()
    callers = timelimit.esi_callers(lambda rel: fs.read_small(root / rel) if root else None)
    save_freq = get(resolved, "trainer.save_freq")
    sup = timelimit.support(str(config.algo.entrypoint), bool(get(resolved, "trainer.use_v1", False)), save_freq,
                            config.run.task_runner, callers)
    out = []
    if sup.saves is False:
        key = "trainer.save_freq" if "save_freq" in sup.why else "trainer.use_v1"
        fix = ("verl.trainer.save_freq=<steps between saves>" if key == "trainer.save_freq" else
               "verl.trainer.use_v1=false (RayPPOTrainer saves before the deadline), or a trainer.save_freq whose "
               "saves land well inside cluster.time_min")
        out.append(Problem(f"verl.{key}", get(resolved, key), sup.why, fix, warning=True))
    save = timelimit.save_seconds(timelimit.training_state_bytes(est), mesh.gpus_per_node) if est is not None \
        else timelimit.VERL_SAVE_S
    given = get(resolved, "trainer.esi_redundant_time", 0)
    redundant = timelimit.redundant_time(save) if sup.saves and est is not None and not given else None
    lines = timelimit.plan_lines(sup, config.cluster.signal_delay_s, stack.verl_version(),
                                 redundant if redundant is not None else (given or None), cluster)
    if given and sup.saves:
        out += values.esi_problems(given, config.cluster.time_min, config.cluster.signal_delay_s,
                                   (st.low, st.high) if st is not None else None, save, timelimit.redundant_time(save))
    if st is None:
        return out, lines, redundant
    w = watch.policy(config.run, st.high, counts.total if counts is not None else None, mesh.nnodes)
    p = timelimit.time_limit_problem(config.cluster.time_min, config.cluster.signal_delay_s,
                                     w.first_step_s - w.stall_after_s, st.high, save,
                                     timelimit.first_save_steps(save_freq, bool(sup.saves)), cluster)
    return out + ([p] if p else []), lines, redundant


def price_problems(config: RunConfig) -> list[Problem]:
    price = config.cluster.gpu_hour_price
    if price is None or (0 <= price < 1e9):
        return []
    return [Problem("cluster.gpu_hour_price", price, "must be a non-negative price per GPU-hour",
                    "cluster.gpu_hour_price=2.5, or leave it unset")]



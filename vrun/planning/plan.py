"""A plan: everything a run will do, computed and checked before anything starts.

make_plan() is the one place that turns the typed run config into the mesh, the verl config, the command and
the environment; train mode executes exactly that plan. In order: the mesh (built and validated once), the
entrypoint's record, verl's tree (composed, overridden and resolved once), the parameter counts, mesh=auto's
search, the checks, the memory estimate. Reporting it (table, plan.json) is vrun.planning.report. No torch, ray or
verl imports here.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from vrun import entrypoints
from vrun.checks import values as check_values, plan_checks as checks
from vrun.estimate import memory, rollout
from vrun.compose import mlite, stack, translate, verl_tree, verl_values
from vrun.planning import phases
from vrun.core.dotted import get
from vrun.entrypoints import Entrypoint
from vrun.estimate.memory import GIB, Estimate
from vrun.estimate.mesh import Mesh, Rules
from vrun.core.problems import PlanError, Problem
from vrun.config.schema import RunConfig
from vrun.core.writer import is_secret_name
from vrun.core import fs

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


def resolve_model_path(model, environ: dict, single_model: bool) -> tuple[Optional[str], str, list[Problem]]:
    """model: the config's model group (vrun.config.schema.Model). The path as verl can take it (normalise_path)."""
    path, source, problems = _model_path(model, environ, single_model)
    if path is None:
        return path, source, problems
    key = "model.path" if source == "model.path" else (source if source != "default" else "model.default_path")
    path, p = normalise_path(path, key, environ)
    return path, source, problems + p


def normalise_path(path: str, key: str, environ: dict) -> tuple[Optional[str], list[Problem]]:
    """verl asserts on a trailing '/' (copy_to_local), does not expand '~', and the job runs in the run dir (a
    relative path would point there): normalised, and said so; a path that does not exist is a warning."""
    out = []
    given = path
    if path.startswith("~"):
        home = environ.get("HOME") or os.path.expanduser("~")
        path = home + path[1:] if path == "~" or path.startswith("~/") else path
    hub_id = not path.startswith((".", "/", "~")) and path.count("/") == 1 and not os.path.exists(path)
    if hub_id:  # org/name: the workers resolve it on the Hugging Face hub (preflight says so)
        return path, out
    if not os.path.isabs(path):
        path = os.path.abspath(path)
    if len(path) > 1 and path.endswith("/"):
        path = path.rstrip("/") or "/"
    if len(path) > 4096 or any(len(part) > 255 for part in path.split("/")):
        return None, [Problem(key, given[:80] + ("..." if len(given) > 80 else ""), "longer than a path can be",
                              f"{key}=/path/to/checkpoint")]
    if path != given:
        out.append(Problem(key, given, f"taken as {path} (verl needs an absolute path without a trailing '/'; "
                           "the job runs in the run dir)", f"{key}={path}", warning=True))
    if not os.path.exists(path):
        out.append(Problem(key, path, "does not exist on this machine (preflight checks it where the job runs)",
                           f"{key}=<an existing checkpoint directory>", warning=True))
    return path, out


def _model_path(model, environ: dict, single_model: bool) -> tuple[Optional[str], str, list[Problem]]:
    if model.path:
        return model.path, "model.path", []
    env_name = model.path_env
    if is_secret_name(str(env_name)):
        return None, "unset", [Problem("model.path_env", env_name, "names a secret variable: its value would become "
                                       "the model path, written into the plan and printed",
                                       "model.path_env=<the variable holding the checkpoint path>")]
    if environ.get(env_name):
        return environ[env_name], env_name, []
    if environ.get("MODEL_PATH"):
        if single_model:
            return environ["MODEL_PATH"], "MODEL_PATH", []
        return None, "MODEL_PATH", [Problem("MODEL_PATH", environ["MODEL_PATH"],
                                            "this sweep plans several models; MODEL_PATH would put every one on one "
                                            "checkpoint", f"set {env_name} (and each model's own variable)")]
    if model.default_path:
        return model.default_path, "default", []
    return None, "unset", [Problem(env_name, None, f"no checkpoint path for {model.name}",
                                   f"export {env_name}=/path/to/checkpoint or model.path=...", warning=True)]


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


def rules_of(config: RunConfig, entrypoint: Entrypoint, verl: dict) -> Rules:
    """The mesh rules for the model and the engine as verl will run it (use_deepep from the resolved tree)."""
    m = config.model
    return Rules(model=m.name, arch=m.arch, tp_allowed=tuple(m.tp_allowed), etp_allowed=tuple(m.etp_allowed),
                 use_deepep=bool(get(verl, f"{entrypoint.engine}.impl_cfg.use_deepep", False)))


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


def model_params(config: RunConfig, entrypoint: Entrypoint, path: Optional[str], problems: list,
                 verl: dict) -> tuple:
    """Parameter counts: the checkpoint's when it is on disk, else the model group's facts (vrun/estimate/params.py).
    Returns (memory units, why none, checkpoint summary, the counts the plan reports)."""
    from vrun.estimate import params as counting

    m = config.model
    arch = m.arch.facts()
    facts_count, _ = counting.count(arch)
    if path and fs.is_dir(os.path.expanduser(path)):
        from vrun.estimate import checkpoint

        try:
            facts = checkpoint.read_checkpoint(os.path.expanduser(path))
        except (OSError, ValueError) as e:
            if getattr(e, "fix", None):  # the checkpoint's facts disagree: refused, never sized from them
                raise PlanError(problems + [Problem(m.path_env, path, str(e), e.fix)]) from None
            facts = None
            problems.append(Problem(m.path_env, path, f"checkpoint headers unreadable ({e})",
                                    "check the checkpoint files", warning=True))
        if facts is not None and facts.shards == 0:  # a config.json alone: never a count of 0 parameters
            problems.append(Problem(m.path_env, path, "no safetensors weights beside config.json; the parameter "
                                    "counts come from the model group's facts", "point at the checkpoint's "
                                    "directory with its *.safetensors weights", warning=True))
            facts = None
        if facts is not None:
            for line in checkpoint.cross_check(facts, arch):
                problems.append(Problem("model.arch", m.name, line, "the checkpoint is the truth: "
                                        "fix conf/model or point at the right checkpoint", warning=True))
            p = checkpoint.params_from_checkpoint(facts, arch)
            summary = checkpoint.checkpoint_summary(facts)
            if not facts.complete:
                problems.append(Problem("checkpoint", path, f"unknown tensor layouts: {facts.unknown[:3]}",
                                        "the counts exclude them", warning=True))
            t = facts.totals
            counts = counting.ParamCounts(
                total=t["total"], active=None, source=p.source,
                rollout=(int(t["total"] - t.get("mtp", 0) - t["routed_expert"]), int(t["routed_expert"])),
                facts_total=facts_count.total if facts_count is not None else None)
            if facts_count is not None:
                off = facts_count.total / max(t["total"], 1) - 1
                if abs(off) > 0.05:
                    problems.append(Problem("model.arch", m.name, f"the facts count "
                                            f"{facts_count.total / 1e9:.1f}B parameters, the checkpoint "
                                            f"{t['total'] / 1e9:.1f}B ({off:+.0%})", "the checkpoint is the "
                                            "truth: fix conf/model", warning=True))
            return p, "", summary, counts
    if facts_count is None:
        _, note = counting.count(arch)
        return None, note, None, None
    p = counting.to_memory_params(facts_count, mtp=phases.mtp_enabled(config, entrypoint, verl),
                                  vision=phases.vision_mounted(entrypoint, verl))
    return p, "", None, counting.ParamCounts.of_facts(facts_count, mtp_built=p.mtp_layers > 0)


def pipeline_stages(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh: Mesh, params) -> list[dict]:
    """Megatron Lite's auto layout of this run: per pipeline stage, its decoder layers and what else it holds."""
    from vrun.estimate import memory

    m = config.model
    layers = len(params.dense_per_layer) if params is not None else m.arch.layers
    mtp = params.mtp_layers if params is not None else mlite.mtp_layers_built(
        m.mlite_name, phases.impl_cfg(entrypoint, verl), m.arch.mtp_layers or 0)
    out = []
    for units in memory.stage_layout(mesh.pp, layers, mtp):
        idx = [u[1] for u in units if u[0] == "layer"]
        out.append({"layers": [idx[0], idx[-1]] if idx else [], "embedding": ("emb",) in units,
                    "mtp": any(u[0] == "mtp" for u in units), "loss": ("loss",) in units})
    return out


def with_built_mtp(params, config: RunConfig, entrypoint: Entrypoint, verl: dict):
    """The parameter counts with the MTP layers the engine will build (the pipeline layout places those)."""
    if params is None:
        return None
    m = config.model
    built = mlite.mtp_layers_built(m.mlite_name, phases.impl_cfg(entrypoint, verl),
                                   params.mtp_layers or m.arch.mtp_layers or 0)
    return dataclasses.replace(params, mtp_layers=built)


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
                        cp_matters=memory.cp_matters(inputs["layer_shapes"]))
    if not found or not found[0].fits or found[0].mesh == mesh:
        return None
    e = found[0].estimate
    return f"{found[0].mesh.overrides()} (band {e.low / GIB:.1f}–{e.high / GIB:.1f} GiB)"


def rollout_params(params, counts: Optional[ParamCounts]) -> tuple:
    """(dense, routed experts) that vLLM loads: the counts' when known, else the units' without MTP."""
    if counts is not None:
        return counts.rollout
    routed = sum(params.expert_per_layer)
    return (params.total - params.mtp_dense - params.mtp_expert - routed, routed)


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
                             cp_matters=memory.cp_matters(inputs["layer_shapes"]))
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

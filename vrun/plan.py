"""A plan: everything a run will do, computed and checked before anything starts.

make_plan() is the one place that turns the typed run config into the mesh, the verl config, the command and
the environment; train mode executes exactly that plan. In order: the mesh (built and validated once), the
entrypoint's record, verl's tree (composed, overridden and resolved once), the parameter counts, mesh=auto's
search, the checks, the memory estimate. Reporting it (table, plan.json) is vrun.report. No torch, ray or
verl imports here.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vrun import checks, entrypoints, mlite, translate, verl_tree
from vrun.dotted import get
from vrun.entrypoints import Entrypoint
from vrun.memory import GIB, Estimate
from vrun.mesh import Mesh, Rules
from vrun.problems import SECRETISH, PlanError, Problem
from vrun.schema import RunConfig

# unset when CUDA_VISIBLE_DEVICES is set (Ray refuses both); the SLURM node job decides it again on the node
UNSET_WITH_CUDA = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


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
    search: Optional[dict] = None            # mesh=auto: what was searched and the top alternatives
    checkpoint: Optional[dict] = None        # parameter counts read from the checkpoint

    @property
    def pass_env(self) -> list:
        return list(self.config.pass_env)

    @property
    def batch(self) -> dict:
        return self.entrypoint.batch_summary(self.verl, self.mesh)


def resolve_model_path(model, environ: dict, single_model: bool) -> tuple[Optional[str], str, list[Problem]]:
    """model: the config's model group (vrun.schema.Model)."""
    if model.path:
        return model.path, "model.path", []
    env_name = model.path_env
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
            if SECRETISH.search(k):
                problems.append(Problem(f"env.{k}", "<hidden>", "a secret's value would be written into the plan "
                                        "and the verl config", f"export {k} and add it to pass_env instead"))
                continue
            env[k] = str(v)
    # Megatron Lite's paths (its sitecustomize must run in every worker), then this project (vrun.entry)
    paths = mlite.mlite_paths(environ) + [str(PROJECT_ROOT)]
    env["PYTHONPATH"] = ":".join(paths + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))
    unset = list(UNSET_WITH_CUDA) if environ.get("CUDA_VISIBLE_DEVICES") else []
    return env, unset, problems


def rules_of(config: RunConfig, entrypoint: Entrypoint, verl: dict) -> Rules:
    """The mesh rules for the model and the engine as verl will run it (use_deepep from the resolved tree)."""
    m = config.model
    return Rules(model=m.name, arch=m.arch, tp_allowed=tuple(m.tp_allowed), etp_allowed=tuple(m.etp_allowed),
                 use_deepep=bool(get(verl, f"{entrypoint.engine}.impl_cfg.use_deepep", False)))


def make_plan(config: RunConfig, run_dir: str, *, single_model: bool = True, environ: Optional[dict] = None,
              python: Optional[str] = None) -> Plan:
    """config: the typed run config (vrun.schema.typed). Raises PlanError with every error found."""
    environ = dict(os.environ if environ is None else environ)
    run_dir = str(Path(run_dir).absolute())
    problems: list[Problem] = []
    path, path_from, p = resolve_model_path(config.model, environ, single_model)
    problems += p
    env, unset, p = run_env(config, environ)
    problems += p
    try:
        mesh = Mesh.of(config.mesh)
    except PlanError as e:
        raise PlanError(problems + e.problems)
    ep = entrypoints.of(config)
    placeholder = path if path else f"<unset: {config.model.path_env}>"
    req = translate.build(config, ep, mesh, run_dir, env, placeholder)
    tree = verl_tree.base_tree(req.config_name, req.groups)
    problems += req.problems + verl_tree.apply(tree, req.overrides)
    if [x for x in problems if not x.warning]:
        raise PlanError(problems)
    resolved = verl_tree.resolve(tree)
    rules = rules_of(config, ep, resolved)
    params, params_note, ckpt = model_params(config, path, problems)
    search = None
    if config.mesh.search:
        from vrun import search as searching

        estimate = None
        if params is not None:
            from vrun import memory

            inputs = memory_inputs(config, ep, resolved)
            estimate = lambda m: memory.estimate(params, m, **inputs)  # noqa: E731
        best, search = searching.auto(rules, mesh.nnodes, mesh.gpus_per_node, resolved, ep, estimate, params_note)
        if best is None:
            raise PlanError(problems + [Problem("mesh", "auto", f"no mesh of {mesh.nnodes}×{mesh.gpus_per_node} "
                                                f"GPUs passes the plan's checks for {config.model.name}",
                                                "change mesh.nnodes / mesh.gpus_per_node or the batch sizes")])
        # only the mesh's own keys change: set them in the tree already built and resolve it again
        mesh = best
        config = dataclasses.replace(config, mesh=dataclasses.replace(config.mesh, **{
            f.name: getattr(best, f.name) for f in dataclasses.fields(Mesh)}))
        req = req.with_mesh(ep, mesh)
        verl_tree.apply(tree, translate.mesh_overrides(ep, mesh))
        resolved = verl_tree.resolve(tree)
    found = checks.check_all(config, ep, resolved, mesh, rules)
    problems += found
    if [x for x in problems if not x.warning]:
        hints = []
        if any(x.key.startswith("mesh.") and not x.warning for x in found):
            from vrun import search as searching

            hints = searching.hints(rules, mesh, resolved, ep)
        raise PlanError(problems, hints=hints)
    argv = ep.command(config, run_dir, mesh, python or sys.executable)
    source = mlite.find_source()
    warnings = [x for x in problems if x.warning]
    if source.kind == "record":
        warnings.append(Problem("verl_mlite", None, "not importable: planned against the project's record of "
                                f"its config (Megatron-LM {mlite.record()['megatron_lm_commit'][:8]})",
                                "export MLITE_ROOT=/path/to/Megatron-LM for preflight and train", warning=True))
    est = memory_estimate(config, ep, resolved, mesh, params) if params is not None else None
    if est is not None and not est.fits:
        warnings.append(Problem("memory", f"{est.peak / GIB:.1f}GiB", f"the estimate exceeds the "
                                f"{config.cluster.gpu_mem_gib} GiB per GPU of cluster.gpu_mem_gib "
                                f"(stage {est.stage}: {est.layers_on_stage} layers)",
                                "a larger PP·EP mesh, more offload, a smaller token budget, or mesh=auto",
                                warning=True))
    return Plan(config=config, entrypoint=ep, mesh=mesh, run_dir=run_dir, verl=resolved, request=req, argv=argv,
                env=env, env_unset=unset, model_path=path, model_path_source=path_from, mlite=source,
                warnings=warnings, memory=est, memory_note=params_note, search=search, checkpoint=ckpt)


def model_params(config: RunConfig, path: Optional[str], problems: list) -> tuple:
    """Parameter counts: the checkpoint's when it is on disk, else the model group's facts."""
    from vrun import memory

    arch = dataclasses.asdict(config.model.arch)
    if path and Path(os.path.expanduser(path)).is_dir():
        from vrun import checkpoint

        try:
            facts = checkpoint.read_checkpoint(os.path.expanduser(path))
        except (OSError, ValueError) as e:
            facts = None
            problems.append(Problem(config.model.path_env, path, f"checkpoint headers unreadable ({e})",
                                    "check the checkpoint files", warning=True))
        if facts is not None:
            for line in checkpoint.cross_check(facts, arch):
                problems.append(Problem("model.arch", config.model.name, line, "the checkpoint is the truth: "
                                        "fix conf/model or point at the right checkpoint", warning=True))
            p = checkpoint.params_from_checkpoint(facts, arch)
            summary = checkpoint.checkpoint_summary(facts)
            if not facts.complete:
                problems.append(Problem("checkpoint", path, f"unknown tensor layouts: {facts.unknown[:3]}",
                                        "the counts exclude them", warning=True))
            return p, "", summary
    p, note = memory.params_from_arch(arch)
    return p, note, None


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
        gpu_mem_gib=float(config.cluster.gpu_mem_gib),
        cross_entropy_fusion=bool(eng.get("cross_entropy_fusion") or get(eng, "impl_cfg.cross_entropy_fusion")),
        **entrypoint.token_inputs(verl))


def memory_estimate(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh: Mesh, params) -> Estimate:
    from vrun import memory

    return memory.estimate(params, mesh, **memory_inputs(config, entrypoint, verl))

"""Checks that need the target environment: paths, packages, GPUs, and verl's own validation.

Runs in preflight and before train. The Megatron Lite runtime requirements (the real verl_mlite, a verl it
can run on, vLLM, the model's extra modules) are errors when verl's own task runner or SFT trainer will
build Megatron Lite workers, and warnings when the config names a task runner of its own.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
from pathlib import Path

from vrun.core import dotted
from vrun.compose import mlite, stack, verl_tree
from vrun.planning.plan import Plan, memory_cure
from vrun.core.units import GIB
from vrun.core.problems import PlanError, Problem
from vrun.config.schema import ClusterName
from vrun.core import fs

# MegatronLiteEngineConfig's own fields (verl_mlite/engine/config.py at the recorded commit)
RECORD_ENGINE_FIELDS = ("strategy", "custom_backend_module", "model_name", "impl", "tp", "etp", "ep", "pp", "vpp",
                        "cp", "attention_backend_override", "router_aux_loss_coef", "cross_entropy_fusion",
                        "export_dtype", "resync_format", "resync_config", "router_replay_mode", "load_hf_weights",
                        "impl_cfg")


def require(plan: Plan) -> None:
    problems = collect(plan)
    for p in problems:
        if p.warning:
            print(p.line(), flush=True)
    if any(not p.warning for p in problems):
        raise PlanError(problems)


def collect(plan: Plan, gpus: int | None = None) -> list[Problem]:
    own_runtime = plan.entrypoint.builds_mlite_workers(plan.config)
    out = model_path_problems(plan) + data_problems(plan)
    runtime = runtime_problems(plan)
    out += runtime if own_runtime else [Problem(p.key, p.value, p.why + " (a custom task runner is configured: "
                                                "it must not need this)", p.fix, warning=True) for p in runtime]
    out += gpu_problems(plan, gpus)
    out += node_check_problems(plan, counted=any(p.key in ("mesh.gpus_per_node", "cluster.ray.num_gpus") for p in out))
    out += memory_problems(plan)
    out += stack.mismatch(plan.stack)
    if own_runtime and not [p for p in runtime if not p.warning]:
        out += verl_validation(plan)
    return out


# what a Hugging Face checkpoint directory holds its weights in
WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt")


def model_path_problems(plan: Plan) -> list[Problem]:
    env = plan.config.model.path_env
    path = plan.model_path
    if not path:
        return [Problem(env, None, f"no checkpoint path for {plan.config.model.name}",
                        f"export {env}=/path/to/checkpoint or model.path=...")]
    p = Path(os.path.expanduser(path))
    if fs.is_dir(p):
        if not fs.is_file(p / "config.json"):
            return [Problem(env, path, "the directory has no config.json (not a Hugging Face checkpoint)",
                            "point it at the checkpoint directory")]
        weights = [f for pattern in WEIGHTS for f in p.glob(pattern)]
        if not weights and plan.entrypoint.builds_mlite_workers(plan.config):
            return [Problem(env, path, "config.json but no weights (*.safetensors, *.bin or their index): the "
                            "workers would fail loading the model", "point it at a complete checkpoint directory")]
        return []
    # a path (absolute, home, relative under an existing folder) that is missing is an error; anything
    # else is taken as a Hugging Face id ("org/name") that the workers resolve
    if path.startswith(("/", "~", ".")) or ("/" in path and fs.exists(p.parent)):
        return [Problem(env, path, "no such directory", "point it at the checkpoint directory")]
    return [Problem(env, path, "not a local directory: the workers will resolve it as a Hugging Face id",
                    "download the checkpoint and point at it if the nodes are offline", warning=True)]


def data_files(verl: dict) -> list[tuple[str, str]]:
    """The files the run reads its data from, as (verl key, path): the local ones (a URL is the reader's)."""
    out = []
    for key in ("data.train_files", "data.val_files"):
        v = dotted.get(verl, key)
        out += [(key, f) for f in ([v] if isinstance(v, str) else list(v or [])) if "://" not in f]
    return out


def data_problems(plan: Plan) -> list[Problem]:
    return [Problem(key, f, why, f"prepare the data (verl's examples/data_preprocess) or set verl.{key}=...")
            for key, f in data_files(plan.verl) for why in [fs.missing(os.path.expanduser(f))] if why]


def runtime_problems(plan: Plan) -> list[Problem]:
    out = []
    if plan.mlite.kind != "verl_mlite":
        out.append(Problem("MLITE_ROOT", os.environ.get("MLITE_ROOT"),
                           "verl_mlite is not importable: preflight and train need the real Megatron Lite glue",
                           "export MLITE_ROOT=/path/to/Megatron-LM (branch dev) or put "
                           "experimental/lite/examples/verl on PYTHONPATH"))
    missing = verl_compat(plan)
    if missing:
        out.append(Problem("verl", stack.verl_version() or "?", f"the installed verl's EngineConfig lacks {sorted(missing)}, which "
                           "verl_mlite's engine config sets: building MegatronLiteEngineConfig would fail with "
                           "an unexpected keyword argument",
                           f"install verl from source at commit {mlite.record()['required_verl']} "
                           "(verl_mlite's REQUIRED_VERL.txt)"))
    needed = list(plan.config.model.requires) + plan.entrypoint.runtime_modules(plan.verl)
    for mod in needed:
        if importlib.util.find_spec(mod) is None:
            out.append(Problem("python module", mod, "not importable here, and the run imports it",
                               f"pip install the package that provides '{mod}'"))
    return out


def verl_compat(plan: Plan) -> set[str]:
    """Engine keys the resolved config sets that neither verl's EngineConfig nor verl_mlite's declare."""
    eng = dotted.get(plan.verl, plan.entrypoint.engine, {})
    verl_fields = dataclass_fields(_verl_file("workers/config/engine.py"), "EngineConfig")
    if plan.mlite.kind == "verl_mlite":
        mlite_fields = dataclass_fields(Path(plan.mlite.location) / "engine" / "config.py", "MegatronLiteEngineConfig")
    else:
        mlite_fields = set(RECORD_ENGINE_FIELDS)
    return {k for k in eng if not k.startswith("_")} - verl_fields - mlite_fields


def _verl_file(rel: str) -> Path:
    return verl_tree.verl_config_dir().parent.parent / rel


@functools.lru_cache(maxsize=16)
def dataclass_fields(path: Path, cls: str) -> set[str]:
    """Annotated fields of `cls` and of its bases defined in the same file (read, not imported)."""
    tree = ast.parse(Path(path).read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out: set[str] = set()
    todo = [cls]
    while todo:
        node = classes.get(todo.pop())
        if node is None:
            continue
        out |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
        todo += [b.id for b in node.bases if isinstance(b, ast.Name)]
    return out


def memory_problems(plan: Plan) -> list[Problem]:
    from vrun.planning import phases

    e = plan.memory
    if e is None:
        return []
    allow = plan.config.run.allow_memory_overrun
    out = []
    # the rollout may not hold one prompt+response: vLLM would not start (the plan's verdict by the reserve's band:
    # refused unless allowed where none fits even at its low end, a warning where one fits over part of it)
    r = e.rollout_detail
    if r is not None and r.fits_band[0] < 1:
        out += phases.rollout_problems(r, allow_overrun=allow, share=False)
    if e.fits:
        return out
    gib = GIB
    # inside the band: a warning; above its low end: refused unless run.allow_memory_overrun
    return out + [Problem("memory", f"{e.peak / gib:.1f}GiB", f"the per-GPU estimate (stage {e.stage}) against "
                    f"{e.gpu_mem / gib:g} GiB per GPU (cluster.gpu / cluster.gpu_mem_gib): {e.verdict()}",
                    memory_cure(plan.config) + ("" if allow or e.may_fit else "; or run.allow_memory_overrun=true"),
                    warning=allow or e.may_fit)]


def gpu_problems(plan: Plan, gpus: int | None = None) -> list[Problem]:
    m = plan.mesh
    if plan.config.cluster.name != ClusterName.local:
        return []
    out = []
    if m.nnodes > 1:
        out.append(Problem("mesh.nnodes", m.nnodes, f"cluster=local is this one machine; the mesh needs {m.nnodes} "
                           f"nodes × {m.gpus_per_node} GPUs", "cluster=slurm (or a mesh of one node)"))
    declared = plan.config.cluster.ray.num_gpus
    have = gpus if gpus is not None else (declared if declared is not None else visible_gpus())
    if have < m.gpus_per_node:
        out.append(Problem("mesh.gpus_per_node", m.gpus_per_node, f"this machine has {have} visible GPU(s)",
                           f"mesh.gpus_per_node={have}" if have else "run on a GPU machine or use cluster=slurm"))
    elif declared is not None and os.environ.get("CUDA_VISIBLE_DEVICES") and \
            len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")) < declared:
        out.append(Problem("cluster.ray.num_gpus", declared, "Ray refuses to start a raylet with more GPUs than "
                           f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']} lists",
                           f"cluster.ray.num_gpus={len(os.environ['CUDA_VISIBLE_DEVICES'].split(','))}"))
    elif declared is not None:
        out.append(Problem("cluster.ray.num_gpus", declared, "GPUs declared to Ray, not detected", "leave it unset on "
                           "GPU machines", warning=True))
    return out


def node_check_problems(plan: Plan, counted: bool = False) -> list[Problem]:
    """cluster=local (this machine is the target): what a SLURM job's nodes check before Ray starts
    (vrun.launch.nodecheck) — the GPUs' count, model and leftover processes, the run dir and checkpoint dir
    writable. counted: gpu_problems already refused the count (said once)."""
    if plan.config.cluster.name != ClusterName.local:
        return []
    from vrun.launch import nodecheck

    return [Problem("node check", f"{f.check} on {f.host}", f.numbers, f.fix)
            for f in nodecheck.here(nodecheck.need_for(plan)) if not (counted and f.check == "gpus")]


def visible_gpus() -> int:
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1"):
        return 0
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def verl_validation(plan: Plan) -> list[Problem]:
    """verl's own job-start validation on the exact config (needs the real verl_mlite)."""
    try:
        plan.entrypoint.validate(plan.verl)
    except Exception as e:  # noqa: BLE001 - verl raises AssertionError, ValueError, TypeError, ImportError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return [Problem("verl.validate_config", type(e).__name__, first, "fix the key it names")]
    return []

"""The run config → the request to verl: which tree, which group choices, which values.

Order of the values (later wins): the shared `engine` and `optim` blocks, the entrypoint's `recipe`, the
keys the project owns (mesh, model path, names, run directory, optimizer, env), then the `verl.`
pass-through. Owned keys cannot be set through the pass-through: each has one knob.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from vrun import dotted, mlite, verl_tree
from vrun.mesh import Mesh
from vrun.problems import Problem
from vrun.verl_tree import Override

# where the engine / optimizer / model / trainer live in each entrypoint's tree
PREFIX = {
    "ppo": {"engine": "actor_rollout_ref.actor.engine", "optim": "actor_rollout_ref.actor.optim",
            "model": "actor_rollout_ref.model", "config": "ppo_trainer"},
    "sft": {"engine": "engine", "optim": "optim", "model": "model", "config": "sft_trainer_engine"},
}

# keys owned by a project knob → the knob to use instead
OWNED = {
    "{engine}.tp": "mesh.tp", "{engine}.pp": "mesh.pp", "{engine}.vpp": "mesh.vpp", "{engine}.ep": "mesh.ep",
    "{engine}.etp": "mesh.etp", "{engine}.cp": "mesh.cp", "{engine}.model_name": "model.mlite_name",
    "{engine}.impl_cfg.optimizer": "optimizer=fsdp2|dist_opt", "{model}.path": "model.path",
    "trainer.nnodes": "mesh.nnodes", "trainer.n_gpus_per_node": "mesh.gpus_per_node",
    "trainer.project_name": "run.project_name", "trainer.experiment_name": "run.experiment_name",
    "trainer.default_local_dir": "hydra.run.dir (checkpoints go to <run dir>/checkpoints)",
}

# maps whose keys are free-form for verl (a `+` may add to them)
OPEN_MAPS = ("reward.reward_kwargs", "ray_kwargs.ray_init")


@dataclass
class VerlRequest:
    entrypoint: str
    config_name: str
    groups: tuple
    overrides: list = field(default_factory=list)
    problems: list = field(default_factory=list)


def flatten(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(d, dict) and d:
        for k, v in d.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix, d


def needs_reference(values: dict) -> bool:
    return bool(values.get("actor_rollout_ref.actor.use_kl_loss")) or \
        bool(values.get("algorithm.use_kl_in_reward"))


def build(cfg: dict, run_dir: str, env: dict, model_path: str) -> VerlRequest:
    """cfg: the resolved run config as plain containers. env: the run's variables to set."""
    ep = cfg["algo"]["entrypoint"]
    pre = PREFIX[ep]
    source = mlite.find_source()
    mesh = Mesh.of(cfg["mesh"])

    values: dict[str, Any] = {}
    origin: dict[str, str] = {}

    def put(items, where):
        for k, v in items:
            values.pop(k, None)  # keep the order of the last writer
            values[k] = v
            origin[k] = where

    put(flatten(cfg.get("engine") or {}, pre["engine"]), "engine")
    put(flatten(cfg.get("optim") or {}, pre["optim"]), "optim")
    put(flatten((cfg.get("recipe") or {}).get(ep) or {}), f"recipe.{ep}")

    owned = {k.format(**pre): knob for k, knob in OWNED.items()}
    passthrough = list(flatten(cfg.get("verl") or {}))
    problems = [Problem(f"verl.{k}", v, f"{k} is set by the project", f"use {owned[k]}")
                for k, v in passthrough if k in owned]
    eng = pre["engine"]
    derived = [(f"{eng}.{k}", getattr(mesh, k)) for k in ("tp", "pp", "vpp", "ep", "cp", "etp")]
    derived += [(f"{eng}.model_name", cfg["model"]["mlite_name"]),
                (f"{eng}.impl_cfg.optimizer", cfg["optimizer"]["name"]),
                (f"{pre['model']}.path", model_path),
                ("trainer.nnodes", mesh.nnodes), ("trainer.n_gpus_per_node", mesh.gpus_per_node),
                ("trainer.project_name", cfg["run"]["project_name"]),
                ("trainer.experiment_name", cfg["run"]["experiment_name"]),
                ("trainer.default_local_dir", f"{run_dir}/checkpoints")]
    if ep == "ppo":
        if cfg["run"].get("dump_rollouts"):
            derived.append(("trainer.rollout_data_dir", f"{run_dir}/rollouts"))
        derived += [(f"ray_kwargs.ray_init.runtime_env.env_vars.{k}", str(v)) for k, v in env.items()]
        ray = cfg["cluster"]["ray"]
        # a fresh local instance ("local") or a deliberate join, never an accidental one
        derived.append(("ray_kwargs.ray_init.address", ray["address"]))
        for k in ("num_cpus", "num_gpus"):
            if ray.get(k) is not None:
                derived.append((f"ray_kwargs.ray_init.{k}", ray[k]))
    put(derived, "project")
    put([(k, v) for k, v in passthrough if k not in owned], "verl")

    groups = [f"hydra.searchpath=[{source.searchpath}]"]
    if ep == "ppo":
        groups.append("actor@actor_rollout_ref.actor=mlite_actor")
        if needs_reference(values):
            groups.append("ref@actor_rollout_ref.ref=mlite_ref")
    else:
        groups += ["engine=mlite", "optim=megatron"]
    req = VerlRequest(ep, pre["config"], tuple(groups), problems=problems)

    base = verl_tree.base_tree(req.config_name, req.groups)
    allowed_impl = set(mlite.impl_cfg_fields(cfg["model"]["mlite_name"]))
    rec = mlite.record()
    for key, value in values.items():
        mode, problem = _mode(base, key, value, pre, allowed_impl, rec, cfg["model"]["name"], origin[key])
        if problem:
            req.problems.append(problem)
        else:
            req.overrides.append(Override(key, value, mode))
    return req


def _mode(base, key, value, pre, allowed_impl, rec, model, origin):
    shown = f"verl.{key}" if origin == "verl" else (f"{origin}.{key[len(pre[origin]) + 1:]}"
                                                     if origin in ("engine", "optim") else key)
    impl = f"{pre['engine']}.impl_cfg."
    if key.startswith(impl):
        name = key[len(impl):].split(".")[0]
        if name == "parallel":
            return None, Problem(shown, value, "the engine builds impl_cfg.parallel from the mesh",
                                 "set mesh.tp/pp/ep/cp/etp")
        if name not in allowed_impl:
            import difflib

            near = difflib.get_close_matches(name, sorted(allowed_impl), n=2, cutoff=0.6)
            return None, Problem(shown, value, f"Megatron Lite's {model} ImplConfig has no field '{name}': the "
                                 "runtime would drop it silently",
                                 f"did you mean {' or '.join(near)}?" if near else
                                 f"one of {sorted(allowed_impl)}")
    oo = f"{pre['optim']}.override_optimizer_config."
    if key.startswith(oo):
        name = key[len(oo):]
        if name not in rec["override_optimizer_config_keys"]:
            return None, Problem(shown, value, "the Megatron Lite engine does not read this optimizer override "
                                 "(it would be ignored)", f"one of {rec['override_optimizer_config_keys']}")
    if dotted.get(base, key, dotted.MISSING) is not dotted.MISSING:
        return "set", None
    if key.startswith(impl) or key.startswith(oo):
        return "add", None
    if key.startswith(pre["engine"] + ".") and key[len(pre["engine"]) + 1:] in rec["engine_extra_fields"]:
        return "add", None
    if any(key.startswith(m + ".") for m in OPEN_MAPS) or _under_empty_map(base, key):
        return "add", None
    p = verl_tree.unknown_key(base, key, value)
    fix = p.fix if origin != "verl" or p.fix.startswith("one of") else \
        " or ".join(f"verl.{k}" for k in p.fix.split(" or "))
    return None, Problem(shown, value, p.why, fix)


def _under_empty_map(base: dict, key: str) -> bool:
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        node = dotted.get(base, ".".join(parts[:i]), dotted.MISSING)
        if node is not dotted.MISSING:
            return node == {}
    return False

"""The run config → the request to verl: which tree, which group choices, which values.

Order of the values (later wins): the shared `engine` and `optim` blocks, the entrypoint's `recipe`, the
keys the project owns (mesh, model path, names, run directory, optimizer, env), then the `verl.`
pass-through. Owned keys cannot be set through the pass-through: each has one knob. Which value goes where
comes from the entrypoint's record (vrun.entrypoints).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional

from vrun.core import dotted
from vrun.compose import mlite, stack, verl_tree
from vrun.entrypoints import Entrypoint
from vrun.estimate.mesh import KNOBS, Mesh
from vrun.estimate.rollout import ROLLOUT_DP, ROLLOUT_EP, ROLLOUT_TP
from vrun.core.problems import Problem
from vrun.config.schema import RunConfig
from vrun.compose.verl_tree import Override

# verl's trainer keys that size the cluster → the mesh's field that sets them (the plan checks they stay equal)
TRAINER_SIZES = {"trainer.nnodes": "nnodes", "trainer.n_gpus_per_node": "gpus_per_node"}

# keys owned by a project knob → the knob to use instead ({engine} and {model}: the entrypoint's blocks)
OWNED = {
    **{f"{{engine}}.{k}": f"mesh.{k}" for k in KNOBS}, "{engine}.model_name": "model.mlite_name",
    "{engine}.impl_cfg.optimizer": "optimizer=fsdp2|dist_opt", "{model}.path": "model.path",
    **{k: f"mesh.{f}" for k, f in TRAINER_SIZES.items()},
    "trainer.project_name": "run.project_name", "trainer.experiment_name": "run.experiment_name",
    "trainer.default_local_dir": "hydra.run.dir (checkpoints go to <run dir>/checkpoints)",
}

# maps whose keys are free-form for verl (a `+` may add to them)
OPEN_MAPS = ("reward.reward_kwargs", "ray_kwargs.ray_init")


@dataclass
class VerlRequest:
    config_name: str
    groups: tuple
    overrides: list = field(default_factory=list)
    problems: list = field(default_factory=list)

    def with_mesh(self, entrypoint: Entrypoint, mesh: Mesh, rollout: Optional[tuple] = None) -> "VerlRequest":
        """The same request with mesh=auto's choice: the mesh's values and the rollout (TP, DP) chosen beside it."""
        new = dict(mesh_values(entrypoint, mesh, rollout))
        kept = [replace(o, value=new.pop(o.key)) if o.key in new else o for o in self.overrides]
        return replace(self, overrides=kept + [Override(k, v, "set") for k, v in new.items()])


def flatten(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(d, dict) and d:
        for k, v in d.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix, d


def mesh_values(entrypoint: Entrypoint, mesh: Mesh, rollout: Optional[tuple] = None) -> list[tuple[str, Any]]:
    """The verl keys the mesh sets (and, given a rollout (TP, DP), the rollout's)."""
    out = [(f"{entrypoint.engine}.{k}", getattr(mesh, k)) for k in KNOBS] + \
        [(k, getattr(mesh, f)) for k, f in TRAINER_SIZES.items()]
    if rollout is not None:
        out += [(ROLLOUT_TP, rollout[0]), (ROLLOUT_DP, rollout[1])]
        if len(rollout) > 2 and rollout[2] is not None:  # expert parallelism on: verl requires EP = TP·DP
            out.append((ROLLOUT_EP, rollout[2]))
    return out


def mesh_overrides(entrypoint: Entrypoint, mesh: Mesh, rollout: Optional[tuple] = None) -> list[Override]:
    """The mesh's keys as overrides (each exists in verl's tree)."""
    return [Override(k, v, "set") for k, v in mesh_values(entrypoint, mesh, rollout)]


def build(config: RunConfig, entrypoint: Entrypoint, mesh: Mesh, run_dir: str, env: dict,
          model_path: str) -> VerlRequest:
    """env: the run's variables to set."""
    ep = entrypoint
    source = mlite.find_source()

    values: dict[str, Any] = {}
    origin: dict[str, str] = {}

    def put(items, where):
        for k, v in items:
            values.pop(k, None)  # keep the order of the last writer
            values[k] = v
            origin[k] = where

    put(flatten(config.engine, ep.engine), "engine")
    put(flatten(config.optim, ep.optim), "optim")
    put(flatten(config.recipe.get(ep.name.value) or {}), f"recipe.{ep.name.value}")

    owned = {k.format(engine=ep.engine, model=ep.model): knob for k, knob in OWNED.items()}
    passthrough = list(flatten(config.verl))
    problems = [Problem(f"verl.{k}", v, f"{k} is set by the project", f"use {owned[k]}")
                for k, v in passthrough if k in owned]
    # the same keys through the other doors (engine., optim., recipe.<entrypoint>.): refused alike, not overwritten
    doors = [(f"engine.{k[len(ep.engine) + 1:]}", k, v) for k, v in flatten(config.engine, ep.engine)] + \
        [(f"optim.{k[len(ep.optim) + 1:]}", k, v) for k, v in flatten(config.optim, ep.optim)] + \
        [(f"recipe.{ep.name.value}.{k}", k, v) for k, v in flatten(config.recipe.get(ep.name.value) or {})]
    problems += [Problem(door, v, f"{k} is set by the project", f"use {owned[k]}") for door, k, v in doors
                 if k in owned]
    for k in [k for _, k, _ in doors if k in owned]:
        values.pop(k, None)
        origin.pop(k, None)
    derived = mesh_values(ep, mesh)
    derived += [(f"{ep.engine}.model_name", config.model.mlite_name),
                (f"{ep.engine}.impl_cfg.optimizer", config.optimizer.name.value),
                (f"{ep.model}.path", model_path),
                ("trainer.project_name", config.run.project_name),
                ("trainer.experiment_name", config.run.experiment_name),
                ("trainer.default_local_dir", f"{run_dir}/checkpoints")]
    derived += ep.derived(config, run_dir, env)
    put(derived, "project")
    put([(k, v) for k, v in passthrough if k not in owned], "verl")
    # lengths have one source: whichever door sets the data lengths, the keys the record links to them follow
    for src, dests in ep.linked_lengths.items():
        if src in values and origin.get(src) == "verl":
            for d in dests:
                if d in values and origin.get(d) != "verl":
                    values[d] = values[src]

    req = VerlRequest(ep.config_name, tuple(ep.groups(source.searchpath, values)), problems=problems)
    base = verl_tree.base_view(req.config_name, req.groups)
    allowed_impl = set(mlite.impl_cfg_fields(config.model.mlite_name))
    values, algo_problems = ep.algorithm_values(config.algo, base, values, origin, stack.verl_version() or "?")
    req.problems += algo_problems
    rec = mlite.interface()
    pre = {"engine": ep.engine, "optim": ep.optim}
    for key, value in values.items():
        mode, problem = _mode(base, key, value, pre, allowed_impl, rec, config.model.name, origin[key])
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
        if name not in rec.override_optimizer_config_keys:
            return None, Problem(shown, value, "the Megatron Lite engine does not read this optimizer override "
                                 "(it would be ignored)", f"one of {list(rec.override_optimizer_config_keys)}")
    if dotted.get(base, key, dotted.MISSING) is not dotted.MISSING:
        return "set", None
    if key.startswith(impl) or key.startswith(oo):
        return "add", None
    if key.startswith(pre["engine"] + ".") and key[len(pre["engine"]) + 1:] in rec.engine_extra_fields:
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

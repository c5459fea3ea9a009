"""Mesh arithmetic and Megatron Lite's mesh rules, as pure functions (no I/O, no Hydra).

Megatron Lite builds two decompositions of the same world (megatron/lite/primitive/parallel/state.py):
  dense layers:  world = TP · CP · PP · DP
  expert layers: world = ETP · EP · PP · EDP
CP is a dense dimension of its own; DP and EDP are derived, never set.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, Optional

from vrun.problems import Problem

KNOBS = ("tp", "pp", "vpp", "ep", "etp", "cp")


@dataclass(frozen=True)
class Mesh:
    nnodes: int
    gpus_per_node: int
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int = 1
    cp: int = 1

    @classmethod
    def of(cls, m: Mapping[str, Any]) -> "Mesh":
        return cls(**{f.name: m[f.name] for f in fields(cls) if f.name in m})

    @property
    def world(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def dense(self) -> int:
        return self.tp * self.cp * self.pp

    @property
    def expert(self) -> int:
        return self.etp * self.ep * self.pp

    @property
    def dp(self) -> int:
        return self.world // self.dense

    @property
    def edp(self) -> int:
        return self.world // self.expert

    def summary(self) -> dict:
        return {"world": self.world, "nnodes": self.nnodes, "gpus_per_node": self.gpus_per_node,
                "tp": self.tp, "cp": self.cp, "pp": self.pp, "dp": self.dp, "ep": self.ep,
                "etp": self.etp, "edp": self.edp, "vpp": self.vpp}

    def replace(self, **kw) -> "Mesh":
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(kw)
        return Mesh(**d)


@dataclass(frozen=True)
class Arch:
    """The architecture numbers the rules need (a subset of the model group's `arch`)."""
    layers: int
    routed_experts: int
    heads: int
    kv_heads: Optional[int] = None
    o_groups: Optional[int] = None
    gdn_k_heads: Optional[int] = None
    gdn_v_heads: Optional[int] = None

    @classmethod
    def of(cls, m: Mapping[str, Any]) -> "Arch":
        return cls(**{f.name: m.get(f.name) for f in fields(cls)})


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh_problems(mesh: Mesh, arch: Arch, tp_allowed: Iterable[int], etp_allowed: Iterable[int],
                  model: str, use_deepep: bool = False) -> list[Problem]:
    """Every Megatron Lite rule the mesh breaks, each with the numbers and values that would pass."""
    out: list[Problem] = []
    tp_allowed, etp_allowed = list(tp_allowed), list(etp_allowed)
    for k in ("nnodes", "gpus_per_node") + KNOBS:
        v = getattr(mesh, k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            out.append(Problem(f"mesh.{k}", v, "must be a positive integer", f"set mesh.{k} to 1 or more"))
    if out:
        return out
    w = mesh.world
    if mesh.vpp != 1:
        out.append(Problem("mesh.vpp", mesh.vpp, "Megatron Lite's pipeline layout has no virtual stages "
                           "(vpp > 1 raises NotImplementedError for every model)", "mesh.vpp=1"))
    if mesh.tp not in tp_allowed:
        out.append(Problem("mesh.tp", mesh.tp, f"{model} allows TP in {tp_allowed} in Megatron Lite",
                           f"mesh.tp in {tp_allowed}"))
    if mesh.etp not in etp_allowed:
        out.append(Problem("mesh.etp", mesh.etp, f"{model} allows ETP in {etp_allowed} in Megatron Lite",
                           f"mesh.etp={etp_allowed[0]}"))
    if w % mesh.dense:
        ok = _fits(w, mesh.dense // mesh.cp)
        out.append(Problem("mesh.cp", mesh.cp,
                           f"dense layers need world % (tp·cp·pp) == 0, but {mesh.nnodes}×{mesh.gpus_per_node}={w} "
                           f"is not divisible by {mesh.tp}·{mesh.cp}·{mesh.pp}={mesh.dense}",
                           f"mesh.cp in {ok} (with tp={mesh.tp} pp={mesh.pp})" if ok else
                           f"choose tp·pp dividing {w}"))
    if w % mesh.expert:
        ok = _fits(w, mesh.expert // mesh.ep)
        ok = [e for e in ok if arch.routed_experts % e == 0]
        out.append(Problem("mesh.ep", mesh.ep,
                           f"expert layers need world % (etp·ep·pp) == 0, but {mesh.nnodes}×{mesh.gpus_per_node}={w} "
                           f"is not divisible by {mesh.etp}·{mesh.ep}·{mesh.pp}={mesh.expert}",
                           f"mesh.ep in {ok} (with etp={mesh.etp} pp={mesh.pp})" if ok else
                           f"choose etp·pp dividing {w}"))
    if arch.routed_experts % mesh.ep:
        ok = [e for e in divisors(arch.routed_experts) if w % (mesh.etp * mesh.pp * e) == 0]
        out.append(Problem("mesh.ep", mesh.ep, f"EP must divide {model}'s {arch.routed_experts} routed experts",
                           f"mesh.ep in {ok[-6:]}"))
    for what, n in (("attention heads", arch.heads), ("KV heads", arch.kv_heads),
                    ("gated-delta-net K heads", arch.gdn_k_heads), ("gated-delta-net V heads", arch.gdn_v_heads)):
        if n and mesh.tp in tp_allowed and n % mesh.tp:
            ok = [t for t in tp_allowed if n % t == 0]
            out.append(Problem("mesh.tp", mesh.tp, f"TP must divide {model}'s {n} {what}", f"mesh.tp in {ok}"))
    if mesh.pp > arch.layers:
        out.append(Problem("mesh.pp", mesh.pp, f"{model} has {arch.layers} decoder layers, fewer than {mesh.pp} "
                           f"pipeline stages", f"mesh.pp <= {arch.layers}"))
    if use_deepep and mesh.etp > 1:
        out.append(Problem("mesh.etp", mesh.etp, "impl_cfg.use_deepep excludes expert tensor parallelism",
                           "mesh.etp=1, or engine.impl_cfg.use_deepep=false"))
    return out


def rollout_problems(mesh: Mesh, rollout_tp: int, arch: Arch, model: str) -> list[Problem]:
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    out = []
    if not isinstance(rollout_tp, int) or rollout_tp < 1:
        return [Problem(key, rollout_tp, "must be a positive integer", f"{key}=1")]
    if mesh.world % rollout_tp:
        out.append(Problem(key, rollout_tp, f"vLLM replicas of {rollout_tp} GPUs must tile the {mesh.world} GPUs",
                           f"{key} in {[d for d in divisors(mesh.gpus_per_node)]}"))
    if arch.o_groups and arch.o_groups % rollout_tp:
        out.append(Problem(key, rollout_tp, f"{model}'s rollout TP must divide its {arch.o_groups} o_groups",
                           f"{key} in {[d for d in divisors(arch.o_groups) if mesh.world % d == 0]}"))
    return out


def _fits(world: int, other: int) -> list[int]:
    """Values x with world % (other·x) == 0."""
    if other < 1 or world % other:
        return []
    return divisors(world // other)

"""Mesh arithmetic and Megatron Lite's mesh rules, as pure functions (no I/O, no Hydra).

Megatron Lite builds two decompositions of the same world (megatron/lite/primitive/parallel/state.py):
  dense layers:  world = TP · CP · PP · DP
  expert layers: world = ETP · EP · PP · EDP
CP is a dense dimension of its own; DP and EDP are derived, never set.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping

from vrun.core.problems import PlanError, Problem
from vrun.config.schema import Arch
from vrun.estimate.rollout import ROLLOUT_TP

# the mesh's knobs, in the order overrides and hints spell them (nnodes and gpus_per_node size the world)
KNOBS = ("tp", "pp", "ep", "cp", "etp", "vpp")
SIZES = ("nnodes", "gpus_per_node") + KNOBS


@dataclass(frozen=True)
class Mesh:
    """One parallel layout, built once per plan and carried everywhere; every size is a positive integer."""
    nnodes: int
    gpus_per_node: int
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        sizes = (self.nnodes, self.gpus_per_node, self.tp, self.pp, self.ep, self.cp, self.etp, self.vpp)
        if set(map(type, sizes)) == _INT and min(sizes) >= 1:  # the search builds thousands: the quick test first
            return
        bad = [k for k in SIZES if not _positive(getattr(self, k))]
        raise PlanError([Problem(f"mesh.{k}", getattr(self, k), "must be a positive integer",
                                 f"set mesh.{k} to 1 or more") for k in bad])

    @classmethod
    def of(cls, m: Any) -> "Mesh":
        """From the config's mesh node (or a mapping): its sizes; `search` and other fields are not the mesh's."""
        get = m.get if isinstance(m, Mapping) else lambda k, d: getattr(m, k, d)
        return cls(**{f.name: get(f.name, f.default) for f in fields(cls)})

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

    def overrides(self, base: "Mesh | None" = None) -> str:
        """The knobs as overrides (only those that differ from `base` when given)."""
        return " ".join(f"mesh.{k}={getattr(self, k)}" for k in KNOBS
                        if base is None or getattr(self, k) != getattr(base, k))


_INT = {int}


def _positive(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


@dataclass(frozen=True)
class Rules:
    """Megatron Lite's mesh rules for one model and engine setting: the checks, mesh=auto and the hints all
    apply this one value, so no caller can leave an input (use_deepep) out."""
    model: str
    arch: Arch
    tp_allowed: tuple = (1,)
    etp_allowed: tuple = (1,)
    use_deepep: bool = False

    def problems(self, mesh: Mesh) -> list[Problem]:
        return mesh_problems(mesh, self.arch, self.tp_allowed, self.etp_allowed, self.model, self.use_deepep)

    def tp_values(self) -> list[int]:
        """Allowed TP values that divide every head count (the TP rules of mesh_problems)."""
        a = self.arch
        heads = [n for n in (a.heads, a.kv_heads, a.gdn_k_heads, a.gdn_v_heads) if n]
        return [t for t in sorted(set(self.tp_allowed)) if all(n % t == 0 for n in heads)]

    def etp_values(self) -> list[int]:
        """Allowed ETP values (1 only with use_deepep)."""
        return [e for e in sorted(set(self.etp_allowed)) if not self.use_deepep or e == 1]


def divisors(n: int) -> list[int]:
    return list(_divisors(n))


@functools.lru_cache(maxsize=None)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def mesh_problems(mesh: Mesh, arch: Arch, tp_allowed: Iterable[int], etp_allowed: Iterable[int],
                  model: str, use_deepep: bool = False) -> list[Problem]:
    """Every Megatron Lite rule the mesh breaks, each with the numbers and values that would pass."""
    out: list[Problem] = []
    tp_allowed, etp_allowed = list(tp_allowed), list(etp_allowed)
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
    key = ROLLOUT_TP
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

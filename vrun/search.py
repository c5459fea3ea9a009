"""mesh=auto and mesh suggestions: enumerate every mesh that passes the plan's checks, rank them.

Objective (in order): fits in GPU memory by the estimate (vrun.memory); then least communication — smaller
TP, smaller CP, expert parallelism within a node (EP·ETP ≤ GPUs per node), fewer pipeline stages; then the
lower memory peak. Pure functions of their inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from vrun import checks, dotted
from vrun.mesh import Arch, Mesh, divisors, rollout_problems


@dataclass(frozen=True)
class Candidate:
    mesh: Mesh
    estimate: object = None  # vrun.memory.Estimate or None when no estimate can be made

    @property
    def fits(self) -> bool:
        return self.estimate is None or self.estimate.fits

    def key(self):
        m = self.mesh
        peak = self.estimate.peak if self.estimate is not None else 0
        return (not self.fits, m.tp, m.cp, m.ep * m.etp > m.gpus_per_node, m.pp, peak, -m.ep, m.etp)


def valid_meshes(nnodes: int, gpus_per_node: int, arch: Arch, tp_allowed: Iterable[int],
                 etp_allowed: Iterable[int], model: str, verl: Optional[dict] = None, entrypoint: str = "ppo",
                 use_deepep: bool = False) -> list[Mesh]:
    """Every mesh of nnodes × gpus_per_node that passes the mesh, rollout and batch checks."""
    world = nnodes * gpus_per_node
    tps, etps = sorted(set(tp_allowed)), sorted(set(etp_allowed))
    out = []
    other: dict = {}  # the rollout and batch checks depend on the mesh only through its dense DP
    # the enumeration builds in every rule of mesh_problems (tests/test_search.py checks each result with it)
    heads = [n for n in (arch.heads, arch.kv_heads, arch.gdn_k_heads, arch.gdn_v_heads) if n]
    tps = [t for t in tps if all(n % t == 0 for n in heads)]
    if use_deepep:
        etps = [e for e in etps if e == 1]
    for pp in (d for d in divisors(world) if d <= arch.layers):
        for tp in tps:
            if (world // pp) % tp:
                continue
            for cp in divisors(world // (pp * tp)):
                for etp in etps:
                    if (world // pp) % etp:
                        continue
                    for ep in divisors(world // (pp * etp)):
                        if arch.routed_experts % ep:
                            continue
                        m = Mesh(nnodes, gpus_per_node, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)
                        if verl is not None:
                            if m.dp not in other:
                                other[m.dp] = bool(_other_problems(m, arch, model, verl, entrypoint))
                            if other[m.dp]:
                                continue
                        out.append(m)
    return out


def _other_problems(m: Mesh, arch: Arch, model: str, verl: dict, entrypoint: str) -> list:
    if entrypoint == "ppo":
        rtp = dotted.get(verl, "actor_rollout_ref.rollout.tensor_model_parallel_size")
        return rollout_problems(m, rtp, arch, model) or checks.ppo_batch_problems(verl, m)
    return checks.sft_batch_problems(verl, m)


def rank(meshes: Iterable[Mesh], estimate: Optional[Callable[[Mesh], object]] = None) -> list[Candidate]:
    # the estimate depends on the mesh only through (world, TP, PP, EP·ETP): DP·CP and EDP follow from them
    memo: dict = {}

    def est(m: Mesh):
        k = (m.world, m.tp, m.pp, m.ep * m.etp)
        if k not in memo:
            memo[k] = estimate(m)
        return memo[k]

    cands = [Candidate(m, est(m) if estimate else None) for m in meshes]
    return sorted(cands, key=Candidate.key)


KNOBS = ("tp", "pp", "ep", "cp", "etp")


def neighbours(mesh: Mesh, valid: Iterable[Mesh], limit: int = 4) -> tuple[list[Mesh], list[Mesh]]:
    """Valid meshes of the same GPU count that change one knob, and two knobs (closest values first)."""
    one, two = [], []
    for v in valid:
        changed = [k for k in KNOBS if getattr(v, k) != getattr(mesh, k)]
        dist = sum(abs(getattr(v, k).bit_length() - getattr(mesh, k).bit_length()) for k in changed)
        if len(changed) == 1:
            one.append((dist, v))
        elif len(changed) == 2:
            two.append((dist, v))
    pick = lambda xs: [v for _, v in sorted(xs, key=lambda t: (t[0], [getattr(t[1], k) for k in KNOBS]))][:limit]  # noqa: E731
    return pick(one), pick(two)


def as_overrides(mesh: Mesh, base: Mesh) -> str:
    return " ".join(f"mesh.{k}={getattr(mesh, k)}" for k in KNOBS if getattr(mesh, k) != getattr(base, k))

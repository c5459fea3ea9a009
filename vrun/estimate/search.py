"""mesh=auto and mesh suggestions: enumerate every mesh that passes the plan's checks, rank them.

Objective (RANKING, in order): fits in GPU memory by the estimate (vrun.estimate.memory) — and among meshes that do
not, the lower peak first; then least communication — smaller TP, smaller CP, expert parallelism within a node
(EP·ETP ≤ GPUs per node), fewer pipeline stages; then the lower memory peak. Pure functions of their inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable, NamedTuple, Optional

from vrun.estimate.mesh import KNOBS, Mesh, Rules, divisors
from vrun.estimate.rollout import RANKING as ROLLOUT_RANKING


class Candidate(NamedTuple):
    mesh: Mesh
    estimate: object = None  # vrun.estimate.memory.Estimate or None when no estimate can be made

    @property
    def fits(self) -> bool:
        return self.estimate is None or self.estimate.fits

    @property
    def peak(self) -> float:
        return self.estimate.peak if self.estimate is not None else 0.0

    def key(self):
        return ranking_key(self.mesh, self.fits, self.peak)


# mesh=auto's ranking: (what it prefers, its value as an expression of the mesh `m`, `fits` and `peak`; smaller
# first), applied in order. One list: a ranking by another measure (step time) replaces or inserts entries here.
# The expressions are compiled into one key function (the search ranks thousands of meshes).
RANKING: tuple = (
    ("fits in memory", "not fits"),
    ("when it does not fit, the lower peak", "0.0 if fits else peak"),
    ("smaller TP", "m.tp"),
    ("smaller CP", "m.cp"),
    ("EP·ETP within a node", "m.ep * m.etp > m.gpus_per_node"),
    ("fewer PP stages", "m.pp"),
    ("lower peak", "peak"),
    ("more EP", "-m.ep"),
    ("smaller ETP", "m.etp"),
)


def compile_ranking(ranking: tuple) -> Callable:
    return eval("lambda m, fits, peak: (" + "".join(f"{expr}, " for _, expr in ranking) + ")")  # noqa: S307


ranking_key = compile_ranking(RANKING)


@dataclass(frozen=True)
class MeshSearch:
    """What a plan records about mesh=auto's search (plan.json's mesh_search). The rows are plan.json's:
    chosen and each alternative {overrides, dp, edp, rollout_tp, peak_gib, fits}; each rollout TP choice {tp, dp,
    replicas, sequences_fit, step_sequences_per_replica}."""
    valid_meshes: int
    search_ms: float
    chosen: dict
    alternatives: tuple            # the next best meshes after the chosen one
    rollout_tp_choices: tuple      # the best rollout (TP, DP) first; empty without a rollout or an estimate
    memory: str                    # "estimated", or why no estimate ranked the meshes
    objective: ClassVar[str] = ("mesh: " + ", then ".join(name for name, _ in RANKING) + "; rollout TP·DP: "
                                + ", then ".join(ROLLOUT_RANKING))

    def summary(self) -> dict:
        return {"valid_meshes": self.valid_meshes, "search_ms": self.search_ms, "chosen": self.chosen,
                "alternatives": list(self.alternatives), "rollout_tp_choices": list(self.rollout_tp_choices),
                "memory": self.memory, "objective": self.objective}


def valid_meshes(rules: Rules, nnodes: int, gpus_per_node: int, verl: Optional[dict] = None,
                 entrypoint=None, rollout_tps: Optional[list] = None) -> list[Mesh]:
    """Every mesh of nnodes × gpus_per_node that passes the mesh rules and, given verl's tree and the
    entrypoint's record (vrun.entrypoints), its mesh-dependent checks (rollout, batch). rollout_tps: the rollout
    TPs mesh=auto may choose from (the configured one is then not required)."""
    world = nnodes * gpus_per_node
    arch = rules.arch
    out = []
    other: dict = {}  # the rollout and batch checks depend on the mesh only through its dense DP
    # the enumeration builds in every rule of mesh_problems (tests/test_search.py checks each result with it)
    tps, etps = rules.tp_values(), rules.etp_values()
    for pp in (d for d in divisors(world) if d <= arch.layers):
        for tp in tps:
            if (world // pp) % tp:
                continue
            for cp in divisors(world // (pp * tp)):
                for etp in etps:
                    if (world // pp) % etp:
                        continue
                    dp = world // (pp * tp * cp)
                    if other.get(dp):
                        continue
                    for ep in divisors(world // (pp * etp)):
                        if arch.routed_experts % ep:
                            continue
                        m = Mesh(nnodes, gpus_per_node, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)
                        if verl is not None and dp not in other:
                            other[dp] = bool(entrypoint.mesh_problems(verl, m, rules, rollout_tps))
                            if other[dp]:
                                break
                        out.append(m)
    return out


def rank(meshes: Iterable[Mesh], estimate: Optional[Callable[[Mesh], object]] = None) -> list[Candidate]:
    # the estimate depends on the mesh only through (world, TP, PP, EP·ETP): DP·CP and EDP follow from them
    memo: dict = {}

    def est(m: Mesh):
        k = (m.world, m.tp, m.pp, m.ep * m.etp)
        if k not in memo:
            memo[k] = estimate(m)
        return memo[k]

    keyed = []
    for m in meshes:
        e = est(m) if estimate else None
        fits, peak = (True, 0.0) if e is None else (e.fits, e.peak)
        keyed.append((ranking_key(m, fits, peak), m, e))
    keyed.sort(key=lambda kc: kc[0])
    return [Candidate(m, e) for _, m, e in keyed]


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
    return mesh.overrides(base)


def binding_constraint(rules: Rules, nnodes: int, gpus_per_node: int, verl: Optional[dict], entrypoint,
                       rollout_tps: Optional[list]):
    """Why no mesh passes: the first family of checks that leaves none — Megatron Lite's mesh rules, the rollout
    TP, then the batch checks (with the problem of the best mesh that passed the earlier ones)."""
    from vrun.core.problems import Problem

    world = nnodes * gpus_per_node
    arch = rules.arch
    meshes = valid_meshes(rules, nnodes, gpus_per_node)
    if not meshes:
        return Problem("mesh.nnodes", nnodes, f"no TP·CP·PP / ETP·EP·PP split of {nnodes}×{gpus_per_node}={world} "
                       f"GPUs meets {rules.model}'s rules (EP divides {arch.routed_experts} experts, TP in "
                       f"{list(rules.tp_allowed)})", "a GPU count with more factors of 2, e.g. mesh.nnodes="
                       f"{max(1, 1 << (max(nnodes, 1) - 1).bit_length())}")
    if entrypoint.has_rollout and rollout_tps is not None and not rollout_tps:
        key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
        rule = f" and divide {arch.o_groups} o_groups" if arch.o_groups else ""
        return Problem(key, None, f"no rollout TP fits within a node of {gpus_per_node} GPUs, tiles {world} GPUs"
                       f"{rule}", "mesh.gpus_per_node a power of two")
    ranked = rank(meshes)
    found = entrypoint.mesh_problems(verl, ranked[0].mesh, rules, rollout_tps) if verl else []
    if found:
        p = found[0]
        example = " ".join(f"{k}={getattr(ranked[0].mesh, k)}" for k in KNOBS)
        return Problem(p.key, p.value, f"every mesh of {world} GPUs fails the batch checks; with {example}: {p.why}",
                       p.fix)
    return None


def hints(rules: Rules, mesh: Mesh, verl: dict, entrypoint) -> list[str]:
    """For mesh errors: valid meshes of the same GPU count that change one knob, then two."""
    valid = valid_meshes(rules, mesh.nnodes, mesh.gpus_per_node, verl, entrypoint)
    one, two = neighbours(mesh, valid)
    out = []
    if one:
        out.append("valid meshes, one change: " + " | ".join(as_overrides(v, mesh) for v in one))
    if two:
        out.append("valid meshes, two changes: " + " | ".join(as_overrides(v, mesh) for v in two))
    if not valid:
        out.append(f"no mesh of {mesh.world} GPUs passes for {rules.model}: change mesh.nnodes")
    return out

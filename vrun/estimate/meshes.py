"""Every mesh of a GPU count that passes the plan's checks, and the valid meshes one or two knobs away from a mesh
that does not (the suggestions after a mesh error). Pure functions of their inputs; vrun.estimate.search ranks
what valid_meshes gives."""
from __future__ import annotations

from typing import Iterable, Optional

from vrun.estimate.mesh import KNOBS, Mesh, Rules, divisors


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

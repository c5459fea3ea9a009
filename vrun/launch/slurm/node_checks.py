"""On a SLURM node, before anything starts: the cluster group typed again from the plain values plan.json records
(cluster_of), the node's verl and verl_mlite against those the plan was composed with (check_stack), and the checks
a login node skipped under cluster.login_preflight=false (check_node).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Optional

from vrun.compose import stack
from vrun.config.schema import Cluster


# ==================================================================== on the node, before anything starts
def cluster_of(values: dict) -> Cluster:
    """The cluster group as the schema's object from the plain values plan.json records (asdict of it)."""
    from dataclasses import MISSING, is_dataclass

    given = {}
    for f in fields(Cluster):
        if f.name not in values:
            continue
        inner = f.default_factory() if f.default_factory is not MISSING else None
        if is_dataclass(inner):  # a nested group (ray, kuberay): its known fields, the rest at their defaults
            v = values[f.name] or {}
            given[f.name] = type(inner)(**{k: x for k, x in v.items() if k in {g.name for g in fields(inner)}})
        else:
            given[f.name] = values[f.name]
    return Cluster(**given)


def check_stack(recorded: dict, where: str) -> None:
    """Before Ray or torchrun start on a node: its verl and verl_mlite must be those the plan was composed against
    (a login node's venv and the cluster image differing is the ordinary case)."""
    wrong = stack.mismatch(recorded)
    if wrong:
        raise RuntimeError(f"{where}: " + " | ".join(p.line() for p in wrong))


def check_node(checks: Optional[dict], where: str) -> None:
    """cluster.login_preflight=false: the checks the submitting machine skipped, first thing on every node."""
    if not checks:
        return
    from vrun.launch.slurm.checks import node_problems

    found = node_problems(checks)
    if found:
        raise RuntimeError(f"{where}: preflight found {len(found)} problem(s): " + " | ".join(found))

"""The parameters a plan counts: the checkpoint's headers when it is on disk, else the model group's facts
(vrun.estimate.params), with the MTP layers Megatron Lite builds; their layout over the pipeline stages; what vLLM
loads of them.
"""
from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Optional

from vrun.compose import mlite
from vrun.config.schema import RunConfig
from vrun.core import fs
from vrun.core.problems import PlanError, Problem
from vrun.entrypoints import Entrypoint
from vrun.estimate.mesh import Mesh
from vrun.planning import phases

if TYPE_CHECKING:
    from vrun.estimate.params import ParamCounts


def model_params(config: RunConfig, entrypoint: Entrypoint, path: Optional[str], problems: list,
                 verl: dict) -> tuple:
    """Parameter counts: the checkpoint's when it is on disk, else the model group's facts (vrun/estimate/params.py).
    Returns (memory units, why none, checkpoint summary, the counts the plan reports)."""
    from vrun.estimate import params as counting

    m = config.model
    arch = m.arch.facts()
    facts_count, _ = counting.count(arch)
    if path and fs.is_dir(os.path.expanduser(path)):
        from vrun.estimate import checkpoint

        try:
            facts = checkpoint.read_checkpoint(os.path.expanduser(path))
        except (OSError, ValueError) as e:
            if getattr(e, "fix", None):  # the checkpoint's facts disagree: refused, never sized from them
                raise PlanError(problems + [Problem(m.path_env, path, str(e), e.fix)]) from None
            facts = None
            problems.append(Problem(m.path_env, path, f"checkpoint headers unreadable ({e})",
                                    "check the checkpoint files", warning=True))
        if facts is not None and facts.shards == 0:  # a config.json alone: never a count of 0 parameters
            problems.append(Problem(m.path_env, path, "no safetensors weights beside config.json; the parameter "
                                    "counts come from the model group's facts", "point at the checkpoint's "
                                    "directory with its *.safetensors weights", warning=True))
            facts = None
        if facts is not None:
            for line in checkpoint.cross_check(facts, arch):
                problems.append(Problem("model.arch", m.name, line, "the checkpoint is the truth: "
                                        "fix conf/model or point at the right checkpoint", warning=True))
            p = checkpoint.params_from_checkpoint(facts, arch)
            summary = checkpoint.checkpoint_summary(facts)
            if not facts.complete:
                problems.append(Problem("checkpoint", path, f"unknown tensor layouts: {facts.unknown[:3]}",
                                        "the counts exclude them", warning=True))
            t = facts.totals
            counts = counting.ParamCounts(
                total=t["total"], active=None, source=p.source,
                rollout=(int(t["total"] - t.get("mtp", 0) - t["routed_expert"]), int(t["routed_expert"])),
                facts_total=facts_count.total if facts_count is not None else None)
            if facts_count is not None:
                off = facts_count.total / max(t["total"], 1) - 1
                if abs(off) > 0.05:
                    problems.append(Problem("model.arch", m.name, f"the facts count "
                                            f"{facts_count.total / 1e9:.1f}B parameters, the checkpoint "
                                            f"{t['total'] / 1e9:.1f}B ({off:+.0%})", "the checkpoint is the "
                                            "truth: fix conf/model", warning=True))
            return p, "", summary, counts
    if facts_count is None:
        _, note = counting.count(arch)
        return None, note, None, None
    p = counting.to_memory_params(facts_count, mtp=phases.mtp_enabled(config, entrypoint, verl),
                                  vision=phases.vision_mounted(entrypoint, verl))
    return p, "", None, counting.ParamCounts.of_facts(facts_count, mtp_built=p.mtp_layers > 0)


def pipeline_stages(config: RunConfig, entrypoint: Entrypoint, verl: dict, mesh: Mesh, params) -> list[dict]:
    """Megatron Lite's auto layout of this run: per pipeline stage, its decoder layers and what else it holds."""
    from vrun.estimate import memory

    m = config.model
    layers = len(params.dense_per_layer) if params is not None else m.arch.layers
    mtp = params.mtp_layers if params is not None else mlite.mtp_layers_built(
        m.mlite_name, phases.impl_cfg(entrypoint, verl), m.arch.mtp_layers or 0)
    out = []
    for units in memory.stage_layout(mesh.pp, layers, mtp):
        idx = [u[1] for u in units if u[0] == "layer"]
        out.append({"layers": [idx[0], idx[-1]] if idx else [], "embedding": ("emb",) in units,
                    "mtp": any(u[0] == "mtp" for u in units), "loss": ("loss",) in units})
    return out


def with_built_mtp(params, config: RunConfig, entrypoint: Entrypoint, verl: dict):
    """The parameter counts with the MTP layers the engine will build (the pipeline layout places those)."""
    if params is None:
        return None
    m = config.model
    built = mlite.mtp_layers_built(m.mlite_name, phases.impl_cfg(entrypoint, verl),
                                   params.mtp_layers or m.arch.mtp_layers or 0)
    return dataclasses.replace(params, mtp_layers=built)


def rollout_params(params, counts: Optional[ParamCounts]) -> tuple:
    """(dense, routed experts) that vLLM loads: the counts' when known, else the units' without MTP."""
    if counts is not None:
        return counts.rollout
    routed = sum(params.expert_per_layer)
    return (params.total - params.mtp_dense - params.mtp_expert - routed, routed)

"""One record per verl entrypoint: PPO on Ray (GRPO, DAPO) and SFT under torchrun.

Each says where its keys live in verl's tree, which verl config and groups it composes, its batch checks,
what the memory estimate reads from its tree, its rollout phase's inputs (none for SFT: no rollout estimate, no
rollout TP to choose), the step's batch the step-time estimate reads, the lengths that repeat the data's, its
batch summary and its command. The plan looks the record up
once (`of(config)`); no other module branches on the entrypoint's name.

May import: `vrun.core`, `vrun.config`, `vrun.estimate`. Adding an entrypoint touches its record here and its
conf group only.
"""
from __future__ import annotations

from vrun.entrypoints.base import Entrypoint
from vrun.entrypoints.ppo import ACTOR, PPO, ROLLOUT
from vrun.entrypoints.sft import SFT, torchrun_argv
from vrun.config.schema import EntrypointName, RunConfig

__all__ = ["ACTOR", "ENTRYPOINTS", "Entrypoint", "PPO", "ROLLOUT", "SFT", "of", "torchrun_argv"]

ENTRYPOINTS: dict[EntrypointName, Entrypoint] = {EntrypointName.ppo: PPO(), EntrypointName.sft: SFT()}


def of(config: RunConfig) -> Entrypoint:
    return ENTRYPOINTS[config.algo.entrypoint]

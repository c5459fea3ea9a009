"""The environment a run's processes start with, locally (vrun.launch.local) and on every SLURM node
(vrun.launch.slurm.node): the environment of the process that launches them, less the plan's unset variables and
ROCR/HIP_VISIBLE_DEVICES where CUDA_VISIBLE_DEVICES is set (decided where the processes start: SLURM sets
CUDA_VISIBLE_DEVICES per allocation; a Ray runtime env can set variables but not unset them), plus the plan's
variables (vrun.planning.plan.run_env: Megatron Lite's and this project's PYTHONPATH, env, model.env; never a
secret's value, which passes by name) and the run's id, which `cancel` checks before it signals a process
(vrun.runs.owner). Each launcher adds its own on top (the node: its attempt, Ray's address)."""
from __future__ import annotations

from typing import Iterable, Mapping

from vrun.planning.plan import UNSET_WITH_CUDA

RUN_ID = "VRUN_RUN_ID"


def child_environ(base: Mapping[str, str], env: Mapping[str, str], unset: Iterable[str], run_id: str) -> dict:
    """base (the launching process's environment) without `unset` (the plan's env_unset) and, when base sets
    CUDA_VISIBLE_DEVICES, without UNSET_WITH_CUDA; then the plan's `env` and RUN_ID=run_id."""
    out = dict(base)
    drop = set(unset) | (set(UNSET_WITH_CUDA) if out.get("CUDA_VISIBLE_DEVICES") else set())
    for name in drop:
        out.pop(name, None)
    out.update(env)
    out[RUN_ID] = run_id
    return out

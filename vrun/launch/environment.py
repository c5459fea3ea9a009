"""The environment a run's processes start with, locally (vrun.launch.local) and on every SLURM node
(vrun.launch.slurm.node): the environment of the process that launches them, less the plan's unset variables and
ROCR/HIP_VISIBLE_DEVICES where CUDA_VISIBLE_DEVICES is set (decided where the processes start: SLURM sets
CUDA_VISIBLE_DEVICES per allocation; a Ray runtime env can set variables but not unset them), plus the plan's
variables (vrun.planning.plan.run_env: Megatron Lite's and this project's PYTHONPATH, env, model.env; never a
secret's value, which passes by name) and the run's id, which `cancel` checks before it signals a process
(vrun.runs.owner). Each launcher adds its own on top (the node: its attempt, Ray's address)."""
from __future__ import annotations

import os
from typing import Iterable, Mapping, Optional

from vrun.launch.stacks import TRACER_ENV
from vrun.planning.plan import UNSET_WITH_CUDA

RUN_ID = "VRUN_RUN_ID"


def tracker_env(run_id: str) -> dict:
    """The experiment tracker continues one run across restarts: wandb reads its run id from WANDB_RUN_ID and,
    with WANDB_RESUME=allow, continues that run or starts it (verl's Tracking calls wandb.init with neither an id
    nor resume, so the environment decides). The id is the run's own (plan.json run_id: the run dir's)."""
    return {"WANDB_RUN_ID": f"vrun-{run_id}", "WANDB_RESUME": "allow"}


def child_environ(base: Mapping[str, str], env: Mapping[str, str], unset: Iterable[str], run_id: str,
                  run_dir: Optional[str] = None) -> dict:
    """base (the launching process's environment) without `unset` (the plan's env_unset) and, when base sets
    CUDA_VISIBLE_DEVICES, without UNSET_WITH_CUDA; then what the run is watched and tracked with (torch's flight
    recorder for NCCL and gloo dumping under <run dir>/stalls/, vrun.planning.recorder.env; the tracker's run id —
    each unless set already), the plan's `env`,
    RUN_ID=run_id and, for the stack hook, TRACER_ENV=this process's pid (it dumps a stall's stacks: under Yama's
    ptrace_scope 1 every process of the run names it its ptracer, so that py-spy, its child, may read them)."""
    from vrun.launch.flightrec import nccl_env

    out = dict(base)
    drop = set(unset) | (set(UNSET_WITH_CUDA) if out.get("CUDA_VISIBLE_DEVICES") else set())
    for name in drop:
        out.pop(name, None)
    watched = {**(nccl_env(run_dir) if run_dir else {}), **tracker_env(run_id)}
    out.update({k: v for k, v in watched.items() if k not in out and k not in env})
    out.update(env)
    out[RUN_ID] = run_id
    out[TRACER_ENV] = str(os.getpid())
    return out

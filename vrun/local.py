"""Hand-off on this machine: the plan's command, in the plan's environment.

The environment is built here and the command inherits it, so whatever the command starts (Ray's local
instance, torchrun's ranks) starts from it: variables set, ROCR/HIP unset when CUDA_VISIBLE_DEVICES is set
(a Ray runtime env can set variables but not unset them). Secrets pass by name only.
"""
from __future__ import annotations

import os
import subprocess
import sys

from vrun import rundir
from vrun.plan import Plan


def child_env(plan: Plan, environ: dict | None = None) -> dict:
    env = dict(os.environ if environ is None else environ)
    for name in plan.env_unset:
        env.pop(name, None)
    env.update(plan.env)
    env["VRUN_RUN_ID"] = rundir.run_id(plan.run_dir)  # inherited by every process the run starts (cancel checks it)
    return env


def train(plan: Plan) -> int:
    print(f"launch: {' '.join(plan.argv)}", flush=True)
    proc = subprocess.Popen(plan.argv, env=child_env(plan), cwd=plan.run_dir)
    rundir.record(plan.run_dir, "entrypoint_started", attempt=0, node=0, pid=proc.pid)
    try:
        proc.wait()
    finally:
        rundir.record(plan.run_dir, "exited", attempt=0, node=0, rc=proc.poll())
    if proc.returncode:
        print(f"error: the run exited {proc.returncode}; see the output above and {plan.run_dir}", file=sys.stderr)
    return proc.returncode

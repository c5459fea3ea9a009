"""The task Hydra runs for each job: plan, then (by mode) preflight and hand off."""
from __future__ import annotations

import os
import sys

from omegaconf import DictConfig, OmegaConf

from vrun import errors, plan as planning, rundir
from vrun.problems import PlanError

MODES = ("plan", "preflight", "train")
# plans made up front by the sweeper, keyed by run dir (the basic launcher runs jobs in this process)
PLANNED: dict[str, "planning.Plan"] = {}


def run(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    run_dir = hc.runtime.output_dir
    if "submitit" in str(hc.launcher.get("_target_", "")) and str(hc.mode) == "RunMode.RUN":
        errors.emit(["error: hydra/launcher=" + str(hc.runtime.choices.get("hydra/launcher")) + ": Hydra applies a "
                     "launcher only in multirun, so this run would train on this machine; fix: add cluster=slurm "
                     "(it submits without -m)"])
    try:
        p = PLANNED.pop(run_dir, None) or plan_config(cfg, run_dir)
        planning.write(p)
        print(planning.table(p), flush=True)
        if p.cfg["mode"] == "plan":
            return
        from vrun import preflight

        rundir.record(p.run_dir, "started", attempt=0, pid=os.getpid())
        try:
            preflight.require(p)
        except PlanError as e:
            rundir.record(p.run_dir, "failed", attempt=0, node=0, error=str(e).splitlines()[0])
            raise
        if p.cfg["mode"] == "preflight":
            rundir.record(p.run_dir, "exited", attempt=0, node=0, rc=0)
            print("preflight: all checks passed", flush=True)
            return
        from vrun import launch

        sys.exit(launch.train(p))
    except PlanError as e:
        errors.emit([pr.line() for pr in e.problems] + e.hints)


def plan_config(cfg: DictConfig, run_dir: str, single_model: bool = True) -> "planning.Plan":
    c = OmegaConf.to_container(cfg, resolve=True)
    if c["mode"] not in MODES:
        from vrun.problems import Problem

        raise PlanError([Problem("mode", c["mode"], f"not one of {list(MODES)}", "mode=plan")])
    return planning.make_plan(c, run_dir, single_model=single_model)

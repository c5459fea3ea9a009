"""The task Hydra runs for each job: plan (or take the plan the sweeper made), report it, then by mode
preflight and hand off to the cluster's launcher (vrun.launch.local on this machine; SLURM submits from the sweeper)."""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from vrun.config import cli_errors
from vrun.planning import report
from vrun.rundir import records as rundir
from vrun.planning.plan import Plan, make_plan
from vrun.core.problems import PlanError, Problem
from vrun.config.schema import Mode, typed

# the sweeper plans every point before any runs and leaves each plan here for its job, which takes it
PLANNED = ".plan.pickle"


def run(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from vrun.checks import composed as check_composed, paths as check_paths
    from vrun.planning.manifest import write_manifest

    hc = HydraConfig.get()
    run_dir = hc.runtime.output_dir
    drawer = None
    try:
        planned = take_planned(run_dir)
        if planned is None:  # a single run draws its plan (sweep points only when asked: python -m vrun show)
            from vrun.planning.picture import Prerenderer

            drawer = Prerenderer()
        p = planned or plan_config(cfg, run_dir)
    except Exception as e:  # noqa: BLE001 - a refused plan: one line each, and it leaves nothing behind
        if drawer is not None:
            drawer.close()
        check_paths.remove_if_empty(check_composed.created_dirs())
        if os.environ.get("HYDRA_FULL_ERROR") == "1" and not isinstance(e, PlanError):
            raise
        cli_errors.emit([pr.line() for pr in e.problems] + e.hints if isinstance(e, PlanError)
                        else [cli_errors.describe(e)])
    try:
        report.write(p)
        write_manifest(cfg, run_dir, list(hc.overrides.task))
        print(report.table(p), flush=True)
        if drawer is not None:
            svg, why = drawer.render(str(Path(p.run_dir) / "plan.json"))
            print(f"picture {svg}" if svg else f"picture not drawn: {why}", flush=True)
        if p.config.mode == Mode.plan:
            return
        from vrun.launch import preflight

        rundir.record(p.run_dir, "started", attempt=0, pid=os.getpid())
        try:
            preflight.require(p)
        except PlanError as e:
            rundir.record(p.run_dir, "failed", attempt=0, node=0, error=str(e).splitlines()[0])
            raise
        if p.config.mode == Mode.preflight:
            rundir.record(p.run_dir, "exited", attempt=0, node=0, rc=0)
            print("preflight: all checks passed", flush=True)
            return
        from vrun.launch import local

        sys.exit(local.train(p))
    except PlanError as e:
        cli_errors.emit([pr.line() for pr in e.problems] + e.hints)


def plan_config(cfg: DictConfig, run_dir: str, single_model: bool = True) -> Plan:
    return make_plan(typed(cfg), run_dir, single_model=single_model)


def leave_planned(plan: Plan) -> None:
    """Put a plan in its run dir for the job that runs it."""
    d = Path(plan.run_dir)
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / PLANNED, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pickle.dumps(plan))


def take_planned(run_dir: str) -> Optional[Plan]:
    """The plan the sweeper left in this run dir, removed as it is taken (a later run plans afresh)."""
    from vrun.checks import paths as check_paths

    f = Path(run_dir) / PLANNED
    if not os.path.lexists(f):
        return None
    why = check_paths.untrusted(str(f), run_dir)
    if why:  # validated before anything is unpickled
        raise PlanError([Problem(str(f), None, f"{why}: not loaded", "plan the run again (remove the file)")])
    plan = pickle.loads(f.read_bytes())
    f.unlink()
    return plan

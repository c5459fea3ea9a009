"""`python -m vrun.launch.entry ppo --config RUN/verl_config.yaml [--task-runner mod:Class] [--pass-env NAME]...`

What verl's `main_ppo.main` does — auto_set_device, validate_config, run_ppo — on the saved config, with a
task runner the run config may name (verl's CLI hard-codes its own). Secrets named by --pass-env stay in the
environment: the Ray instance this driver starts (address=local), or the `ray start` daemons of a SLURM job,
inherit it and hand it to every worker. They are never put into the config or Ray's runtime env, which verl's
run_ppo and task runner print into the job's logs.

On cluster=ray and cluster=kuberay (mode=train) the entry also gives verl the job's deadline and watches the
training beside verl's driver (vrun.launch.raywatch: the watchdog SLURM's node 0 runs, the same events).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys


def load_class(path: str):
    module, _, name = path.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module), name)


def stack_problems(config_path: str) -> list[str]:
    """The plan next to the config (plan.json) must have been composed against this environment's verl and
    verl_mlite: one line per part that differs, naming both versions."""
    from vrun.compose import stack
    from vrun.core.problems import Problem
    from vrun.rundir.files import RunDirError
    from vrun.rundir.record import PlanRecord

    run_dir = os.path.dirname(os.path.abspath(config_path))
    plan_file = os.path.join(run_dir, "plan.json")
    if not os.path.lexists(plan_file):
        return [Problem(plan_file, "missing", "the config's plan is not beside it: the stack it was composed "
                        "against is unknown", "run the plan's own argv from its run dir, or plan again").line()]
    try:
        recorded = PlanRecord.load(run_dir).stack
    except RunDirError as e:
        return [str(e)]
    return [p.line() for p in stack.mismatch(recorded) + stack.runtime_mismatch((recorded or {}).get("runtime"))]


def resume_problem(config_path: str, config) -> str:
    """A training run's checkpoint, checked here where no launcher checked it before the command (cluster=ray,
    cluster=kuberay: the job starts here; a SLURM node and cluster=local set checkpoints.CHECKED_ENV): what verl
    will load is whole and this plan's, or the last whole step is made the one it loads, or none — each line said,
    and recorded as `resumed` in the run dir when it is reachable from here. Another plan's: its one line ("" when
    it may go on). cluster.no_progress_attempts starts in a row that ended without a newer whole checkpoint (a
    resubmission by hand or by a stall's requeue): recorded as `stopped`, its one line."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from vrun.rundir import checkpoints
    from vrun.rundir import records as rundir
    from vrun.rundir.files import RunDirError
    from vrun.rundir.record import PlanRecord

    if os.environ.get(checkpoints.CHECKED_ENV) == "1":
        return ""
    here = os.path.dirname(os.path.abspath(config_path))
    try:
        record = PlanRecord.load(here)
    except RunDirError as e:
        return str(e)
    if record.mode != "train":
        return ""
    root = OmegaConf.select(config, "trainer.default_local_dir", default=None) or os.path.join(here, "checkpoints")
    decision = checkpoints.check(Path(str(root)), record, lambda line: print(line, flush=True))
    if decision.refused is not None:
        return decision.refused.line()
    from vrun.launch import raywatch
    from vrun.launch.raywatch import place

    where = place(here, record)  # the run dir when the job reaches it (this run's), else the job's own copy
    from vrun.launch.slurm.node_checks import cluster_of
    from vrun.rundir import no_progress  # restarts that make no progress stop here, as on a SLURM node

    stop = no_progress.judge(rundir.events(where.dir), decision.step,
                             cluster_of(record.cluster_group or {}).no_progress_attempts,
                             no_progress.save_freq_of(record))
    if stop is not None:
        rundir.record(where.dir, "stopped", attempt=raywatch.attempt(), **stop.fields())
        return f"vrun: {stop.line()}"
    rundir.record(where.dir, "resumed", attempt=raywatch.attempt(), **checkpoints.resumed_fields(decision))
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vrun.launch.entry")
    ap.add_argument("entrypoint", choices=["ppo"])
    ap.add_argument("--config", required=True)
    ap.add_argument("--task-runner", default=None)
    ap.add_argument("--pass-env", action="append", default=[])
    args = ap.parse_args(argv)

    wrong = stack_problems(args.config)
    if wrong:  # before Ray or torchrun start, as on every SLURM node (vrun.launch.slurm.node.check_stack)
        for line in wrong:
            print(line, file=sys.stderr)
        return 2

    from omegaconf import OmegaConf

    from vrun.core import fs
    from vrun.rundir.files import LIMIT

    text, why = fs.read_checked(args.config, LIMIT, own=True)  # the run dir's file: the user's own, never a FIFO
    if text is None:
        print(f"error: --config={args.config}: {why}; fix: plan the run again", file=sys.stderr)
        return 2
    config = OmegaConf.create(text)
    refused = resume_problem(args.config, config)
    if refused:  # before Ray starts, as a SLURM node's check before anything starts
        print(refused, file=sys.stderr)
        return 2
    missing = [n for n in args.pass_env if not os.environ.get(n)]
    if missing:
        print(f"entry: pass_env {', '.join(missing)} not set in this environment: the workers will not see them",
              flush=True)

    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    try:
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
    except Exception as e:  # noqa: BLE001 - ImportError, or Hydra's InstantiationException around it
        # building the mlite engine dataclass imports verl_mlite; a custom runner may not need it
        if not args.task_runner or "verl_mlite" not in str(e):
            raise
        print(f"entry: verl's validate_config skipped ({str(e).splitlines()[0]}); the task runner {args.task_runner} runs without "
              "Megatron Lite", flush=True)

    if args.task_runner:
        runner = load_class(args.task_runner)
    elif config.trainer.use_v1:
        from verl.trainer.main_ppo import TaskRunnerV1 as runner
    else:
        from verl.trainer.main_ppo_v0 import TaskRunner as runner
    if not hasattr(runner, "remote"):
        import ray

        runner = ray.remote(num_cpus=1)(runner)
    from vrun.launch import rayjob_own, raywatch

    rayjob_own.begin(args.config)  # cluster=ray: the job's start in the run dir where its nodes share it
    try:  # cluster=ray, kuberay: verl's deadline, and the job watched
        dog = raywatch.start(args.config, config)
    except Exception as e:  # noqa: BLE001 - a watchdog that cannot start never stops the training
        first = (str(e).strip().splitlines() or [""])[0][:300]
        print(f"vrun: watchdog: not started ({type(e).__name__}: {first})", flush=True)
        dog = None
    try:
        run_ppo(config, task_runner_class=runner)
    except Exception as e:
        rayjob_own.finish("failed", e)  # its end and its log, as the job saw them
        raise
    if dog is not None:
        dog.stop()
    raywatch.learn(args.config)  # the calibration learns where the run ends
    rayjob_own.finish("completed")
    return 0


if __name__ == "__main__":
    from vrun.core import writer

    writer.install()
    sys.exit(main())

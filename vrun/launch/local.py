"""cluster=local: the points the sweeper planned, run on this machine (hydra/launcher=vrun_local calls `launch`).
A run prints its table and draws plan.svg; a sweep prints a line per point. By mode: plan stops there, preflight
checks this machine (vrun.launch.preflight), train runs the plan's command in the plan's environment, the points
one after the other (a failing point ends the sweep with its exit code).

The child's output goes to the terminal (stdout and stderr apart) and to <run dir>/job.log (both), where
`python -m vrun status` reads verl's per-step timings back (vrun/rundir/joblog.py). The command starts in the
run's environment (vrun/launch/environment.py, as on a SLURM node) and whatever it starts (Ray's local instance,
torchrun's ranks) inherits it: variables set, ROCR/HIP unset when CUDA_VISIBLE_DEVICES is set (a Ray runtime env
can set variables but not unset them). Secrets pass by name only.
"""
from __future__ import annotations

import os
import subprocess
import sys

from pathlib import Path

from vrun.rundir import records as rundir
from vrun.rundir.joblog import JOB_LOG
from vrun.planning import measured
from vrun.planning.plan import Plan


def launch(sweep, drawer=None) -> list:
    """sweep: vrun.launch.points.Sweep; drawer: a vrun.planning.picture.Prerenderer for a single run, or None."""
    from vrun.config.schema import Mode
    from vrun.launch import points
    from vrun.planning import report

    plans = sweep.plans
    if not sweep.single and {p.config.mode for p in plans} == {Mode.plan}:
        for point in sweep.points:
            points.write(point)
            print(report.one_line(point.idx, point.overrides, point.plan), flush=True)
        print(f"sweep: {len(plans)} point(s) planned and checked under {sweep.dir}", flush=True)
        return []
    if not sweep.single:
        print(f"sweep: {len(plans)} point(s) planned and checked; launching", flush=True)
    for point in sweep.points:
        run_point(point, drawer if sweep.single else None)
    return []


def run_point(point, drawer=None) -> None:
    """One point: written, its table printed (and plan.svg drawn), then by mode."""
    from vrun.config import cli_errors
    from vrun.config.schema import Mode
    from vrun.core.problems import PlanError
    from vrun.launch import points, preflight
    from vrun.planning import report

    p = point.plan
    try:
        points.write(point)
        print(report.table(p), flush=True)
        if drawer is not None:
            svg, why = drawer.render(str(Path(p.run_dir) / "plan.json"))
            print(f"picture {svg} (drawing)" if svg else f"picture not drawn: {why} (python -m vrun show draws it)",
                  flush=True)
        if p.config.mode == Mode.plan:
            return
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
        try:
            resume(p)
        except PlanError as e:
            rundir.record(p.run_dir, "failed", attempt=0, node=0, error=str(e).splitlines()[0])
            raise
        rc = train(p) or trained_nothing(p)
        if rc:
            sys.exit(rc)
    except PlanError as e:
        cli_errors.emit([pr.line() for pr in e.problems] + e.hints)
    finally:
        if drawer is not None:
            drawer.close()


def trained_nothing(plan: Plan) -> int:
    """A run that exited 0 after resuming and printing no verl step past its checkpoint failed
    (vrun.rundir.no_progress.zero_steps, as status reads it back): its line, and 1."""
    from vrun.rundir import state

    run = state.load(Path(plan.run_dir))
    if run.attempts and run.attempts[-1].state == "failed" and run.attempts[-1].phase.startswith("exited 0 after 0"):
        print(f"error: run={plan.run_dir}: {run.attempts[-1].phase}; fix: see why in the output above (python -m vrun "
              f"status {plan.run_dir})", file=sys.stderr)
        return 1
    return 0


def resume(plan: Plan) -> None:
    """Before the command starts, as on a SLURM node: the checkpoint verl will load is whole and this plan's, or the
    last whole one is made the one it loads, or none (step 0) — each said and recorded as `resumed`; another plan's
    is refused (a PlanError: nothing starts)."""
    from vrun.core.problems import PlanError
    from vrun.rundir import checkpoints
    from vrun.rundir.record import PlanRecord

    decision = checkpoints.check(Path(plan.run_dir) / "checkpoints", PlanRecord.load(plan.run_dir),
                                 lambda line: print(line, flush=True))
    if decision.refused is not None:
        raise PlanError([decision.refused])
    rundir.record(plan.run_dir, "resumed", attempt=0, **checkpoints.resumed_fields(decision))


def child_env(plan: Plan, environ: dict | None = None) -> dict:
    """The command's environment (vrun.launch.environment), inherited by every process the run starts."""
    from vrun.launch.environment import child_environ
    from vrun.rundir import checkpoints

    env = child_environ(os.environ if environ is None else environ, plan.env, plan.env_unset,
                        rundir.run_id(plan.run_dir), plan.run_dir)
    env[checkpoints.CHECKED_ENV] = "1"  # checked before the command starts (resume)
    return env


def train(plan: Plan) -> int:
    print(f"launch: {' '.join(plan.argv)}", flush=True)
    proc = subprocess.Popen(plan.argv, env=child_env(plan), cwd=plan.run_dir, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    rundir.record(plan.run_dir, "entrypoint_started", attempt=0, node=0, pid=proc.pid)
    dog = watch(plan, proc)
    try:
        tee([(proc.stdout, sys.stdout), (proc.stderr, sys.stderr)], Path(plan.run_dir) / JOB_LOG)
        proc.wait()
    finally:
        if dog is not None:
            dog.stop()
        rundir.record(plan.run_dir, "exited", attempt=0, node=0, rc=proc.poll())
        measured.learn_at_end(plan.run_dir)
    if proc.returncode:
        print(f"error: the run exited {proc.returncode}; see the output above and {plan.run_dir}", file=sys.stderr)
    return proc.returncode


def watch(plan: Plan, proc: subprocess.Popen):
    """The watchdog on a local run (vrun.launch.watchdog): the step lines reaching job.log; a stall's stacks are this
    process's descendants (the driver, its Ray instance and workers, or torchrun's ranks); cancel (or requeue, which
    needs a cluster to submit to) stops the run's process."""
    from vrun.launch.watchdog import Watchdog, collect_nccl, poke_nccl
    from vrun.planning.report import watch as watch_record

    if plan.config.mode != "train":
        return None
    w = watch_record(plan)

    def collect(n: int, out: Path) -> None:
        from vrun.launch import stacks

        poke_nccl(plan.run_dir)
        stacks.dump_node(out, os.getpid())
        collect_nccl(plan.run_dir, out)

    def act(action: str, summary: str, hosts: list) -> None:
        rundir.record(plan.run_dir, "stall_action", attempt=0, action="cancelled", summary=summary,
                      **({"note": "a requeue needs cluster=slurm"} if action == "requeue" else {}))
        proc.terminate()

    dog = Watchdog(plan.run_dir, Path(plan.run_dir) / JOB_LOG, w,
                   record=lambda event, **f: rundir.record(plan.run_dir, event, attempt=0, **f),
                   collect=collect, act=act)
    dog.start()
    return dog


def tee(streams: list, path: Path) -> None:
    """Copy each child stream to its own stream here (stdout to stdout, stderr to stderr) and both to `path`,
    line by line as they come; returns when every stream has ended."""
    import threading

    lock = threading.Lock()
    try:
        log = open(path, "ab")
    except OSError:
        log = None

    def pump(src, dst) -> None:
        nonlocal log
        out = dst.buffer
        for line in iter(src.readline, b""):
            with lock:
                out.write(line)
                out.flush()
                if log is not None:
                    try:
                        log.write(line)
                        log.flush()
                    except OSError:
                        log = None

    threads = [threading.Thread(target=pump, args=pair, daemon=True) for pair in streams]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        if log is not None:
            log.close()


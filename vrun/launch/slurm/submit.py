"""SLURM from the login node: what is submitted (from the plan), the confirmation, the submission
(submitit), and `python -m vrun resubmit <run dir>` (also `python -m vrun.launch.slurm.submit resubmit`). The job each
node runs is vrun.launch.slurm.node.

Every sbatch value has one home: the cluster group (vrun.config.schema.Cluster) and the mesh; Submission.of reads only
those. Hydra's submitit launcher is only selected (conf/cluster/slurm.yaml). A `hydra.launcher.*` value given by
hand is put onto the knob it names before the point's checks (vrun.launch.slurm.launcher_knobs, its names importable
from here), refused where the mesh decides it, and named as typed in any error.
The script previewed in the run dir (sbatch_script) is the one submitit's own executor submits.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrun.rundir import records as rundir
from vrun.core import writer
from vrun.core.problems import PlanError, Problem
from vrun.launch import nodecheck
from vrun.launch.slurm.job import RunJob
from vrun.rundir.record import SlurmRecord
from vrun.launch.slurm.launcher_knobs import (  # noqa: F401 - hydra.launcher.* onto the knobs; importable from here
    LAUNCHER_KNOBS, LAUNCHER_MESH, LAUNCHER_REFUSED, as_given, folder_problems, launcher_given, point_problems,
    take_launcher)

def job_name(plan) -> str:
    """The default sbatch job name: model, algorithm and data set (sweep points apart in squeue)."""
    c = plan.config
    return re.sub(r"[^A-Za-z0-9._+-]", "_", f"{c.model.name}_{c.algo.name}_{c.data.name}")[:128]


@dataclass(frozen=True)
class Submission:
    """One sbatch job: submitit's SlurmExecutor parameters (its names) and how often it requeues on timeout."""
    parameters: dict
    max_num_timeout: int

    @classmethod
    def of(cls, plan) -> "Submission":
        """From the plan: the cluster group and the mesh."""
        c, m = plan.config.cluster, plan.mesh
        p: dict[str, Any] = {"nodes": m.nnodes, "gpus_per_node": m.gpus_per_node, "ntasks_per_node": 1,
                             "time": c.time_min, "job_name": c.job_name or job_name(plan),
                             "signal_delay_s": c.signal_delay_s, "setup": list(c.setup),
                             "additional_parameters": dict(c.additional_parameters)}
        for k in ("cpus_per_task", "partition", "account", "qos", "constraint"):
            if getattr(c, k) is not None:
                p[k] = getattr(c, k)
        if c.mem_gb is not None:
            p["mem"] = f"{c.mem_gb}GB"
        return cls(p, c.max_requeues)

    @classmethod
    def load(cls, saved: dict) -> "Submission":
        """From slurm_job.json's "spec" (also the field-per-knob form run dirs written before kept)."""
        saved = dict(saved)
        n = int(saved.pop("max_num_timeout", 0))
        if "time" not in saved:
            renamed = {"timeout_min": "time", "tasks_per_node": "ntasks_per_node", "name": "job_name"}
            saved = {renamed.get(k, k): v for k, v in saved.items() if v is not None}
            if "mem_gb" in saved:
                saved["mem"] = f"{saved.pop('mem_gb')}GB"
        return cls(saved, n)

    def saved(self) -> dict:
        return {**self.parameters, "max_num_timeout": self.max_num_timeout}

    @property
    def nodes(self) -> int:
        return int(self.parameters["nodes"])

    @property
    def gpus_per_node(self) -> int:
        return int(self.parameters["gpus_per_node"])

    @property
    def gpu_hours(self) -> float:
        return self.nodes * self.gpus_per_node * self.parameters["time"] / 60.0

    def describe(self) -> str:
        return (f"{self.nodes} node(s) × {self.gpus_per_node} GPU(s), {self.parameters['time']} min, partition "
                f"{self.parameters.get('partition') or '(default)'}: {self.gpu_hours:.1f} GPU-hours")


def executor(sub: Submission, folder: str):
    """submitit's SlurmExecutor for this job (creates nothing until it submits)."""
    import submitit

    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=sub.max_num_timeout)
    ex.update_parameters(**sub.parameters)
    return ex


def sbatch_script(sub: Submission, folder: str) -> str:
    """The sbatch script submitit submits for this job: its template, with the command its SlurmExecutor gives
    (the folder absolute and quoted). Built without the executor, which needs srun: plans are made anywhere."""
    import shlex

    from submitit.slurm.slurm import _make_sbatch_string

    path = Path(os.path.expanduser(folder)).absolute()  # pathlib's expanduser raises on ~nosuchuser
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(path))])
    return _make_sbatch_string(command=command, folder=path, **sub.parameters)


def confirm(total_gpu_hours: float, cluster, stream=None) -> None:
    """Above cluster.confirm_gpu_hours: ask on a terminal, require cluster.yes=true otherwise."""
    limit = float(cluster.confirm_gpu_hours or math.inf)
    if total_gpu_hours <= limit or cluster.yes:
        return
    stream = stream or sys.stdin
    if stream.isatty():
        answer = input(f"submit {total_gpu_hours:.0f} GPU-hours (over cluster.confirm_gpu_hours={limit:g})? [y/N] ")
        if answer.strip().lower() in ("y", "yes"):
            return
        raise PlanError([Problem("cluster.yes", False, "submission not confirmed", "answer y, or cluster.yes=true")])
    raise PlanError([Problem("cluster.yes", False, f"{total_gpu_hours:.0f} GPU-hours exceed "
                             f"cluster.confirm_gpu_hours={limit:g} and there is no terminal to confirm on",
                             "cluster.yes=true")])


def point_line(idx: int, overrides, plan, sub: Submission, warnings: list) -> str:
    """A sweep point's verdict on one line: the mesh, its peak memory and fit, its warnings, the job."""
    from vrun.planning import report

    e = plan.memory
    gib = 1024 ** 3
    mem = (f"peak {e.peak / gib:.1f} of {e.gpu_mem / gib:g} GiB ({e.verdict()})"
           if e is not None else "memory: no estimate")
    n = len(plan.warnings) + len(warnings)
    return f"{report.one_line(idx, overrides, plan)}\n    {mem} · {n} warning(s) · slurm: {sub.describe()}"


def launch(sweep) -> list:
    """cluster=slurm (sweep: vrun.launch.points.Sweep): every point's verdict shown and every check that needs no
    GPU made (vrun.launch.slurm.checks) before anything is written or submitted; then each point written to its run
    dir (sbatch.sh beside plan.json) and, unless mode=plan, submitted."""
    from vrun.config.schema import Mode
    from vrun.launch import points as planned
    from vrun.launch.slurm import checks as slurm_checks
    from vrun.planning import report

    plans = sweep.plans
    submitting = {p.config.mode for p in plans} != {Mode.plan}
    parts = slurm_checks.partitions() if submitting else None
    checked, refused = [], []
    for point in sweep.points:
        p, folder = point.plan, point.launcher["folder"]
        sub = Submission.of(p)
        found = []
        if submitting:
            found += slurm_checks.storage_problems(p, folder) + slurm_checks.partition_problems(sub, parts or [])
        if p.config.mode == Mode.train:
            found += slurm_checks.login_problems(p)
        elif p.config.mode == Mode.preflight:
            from vrun.launch import preflight

            found += preflight.memory_problems(p)
        errors = [x for x in found if not x.warning]
        if errors:
            refused.append((point.idx, point.overrides, "\n".join(x.line() for x in errors)))
        checked.append((point, sub, [x for x in found if x.warning]))
    for point, sub, warnings in checked:
        if sweep.single:
            print(report.table(point.plan), flush=True)
            for w in warnings:
                print(w.line(), flush=True)
            print(f"slurm   {sub.describe()}", flush=True)
            print(f"nodes   {nodecheck.need_for(point.plan).describe()}", flush=True)
        else:
            print(point_line(point.idx, point.overrides, point.plan, sub, warnings), flush=True)
            for w in list(point.plan.warnings) + warnings:
                print(f"    {w.line()}", flush=True)
    if refused:
        planned.refuse(refused, len(plans), "refused before sbatch; nothing was submitted")
    items, total = [], 0.0
    for point, sub, _ in checked:
        p, folder = point.plan, point.launcher["folder"]
        planned.write(point, slurm=SlurmRecord(sub.parameters, sub.max_num_timeout, sub.gpu_hours, folder, "sbatch.sh"),
                      node_checks=slurm_checks.node_checks(p) if p.config.mode == Mode.train and
                      not p.config.cluster.login_preflight else None)
        writer.write_text(Path(p.run_dir) / "sbatch.sh", sbatch_script(sub, folder), root=p.run_dir)
        items.append((p, sub, p.config.mode, folder))
        total += sub.gpu_hours
    if not sweep.single:
        print(f"sweep: {len(items)} job(s), {total:.1f} GPU-hours", flush=True)
    if not submitting:
        print("plan only: nothing submitted (sbatch.sh in " + ("the run dir)" if sweep.single else "each run dir)"),
              flush=True)
        return []
    from vrun.config import cli_errors

    try:
        confirm(total, plans[0].config.cluster)
    except Exception as e:  # noqa: BLE001 - one line, non-zero exit
        cli_errors.emit([cli_errors.describe(e)])
    return submit(items, detach=plans[0].config.cluster.detach)


def submit(items: list, detach: bool) -> list:
    """items: (plan, submission, mode, submitit folder). Submits one job per item; unless detached, waits for all,
    showing each job's progress (vrun.launch.slurm.watch), and returns or exits with their outcome (vrun.launch.slurm.wait)."""
    import contextlib
    import io
    import logging

    from vrun.config import cli_errors
    from vrun.launch.slurm import checks as slurm_checks, wait as slurm_wait

    logging.getLogger("submitit").setLevel(logging.ERROR)  # its accounting warning: said once by slurm_wait
    jobs = []
    for plan, sub, mode, folder in items:
        run_job = RunJob(plan.run_dir, rundir.run_id(plan.run_dir))
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's stderr: mapped below
                job = executor(sub, folder).submit(run_job)
        except Exception as e:  # noqa: BLE001 - sbatch's refusal, or no sbatch at all
            problem = slurm_checks.sbatch_problem(e, sub)
            rundir.record(plan.run_dir, "failed", attempt=0, node="sbatch", error=f"not submitted: {problem.why}")
            done = [f"submitted before it: {' '.join(j.job_id for j in jobs)}"] if jobs else []
            cli_errors.emit([problem.line()] + done)
        writer.write_text(Path(plan.run_dir) / "slurm_job.json", json.dumps(
            {"job_id": job.job_id, "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr),
             "folder": folder, "spec": sub.saved(), "mode": str(mode), "attempt": 0}, indent=2,
            default=str) + "\n", root=plan.run_dir)
        rundir.record(plan.run_dir, "submitted", job_id=job.job_id, restart=0, attempt=0, nodes=sub.nodes,
                      gpus_per_node=sub.gpus_per_node, work_dir=os.getcwd())
        print(f"submitted job {job.job_id}: {plan.run_dir}  logs {job.paths.stdout}", flush=True)
        jobs.append(job)
    from vrun.rundir import lock

    lock.release_all()  # submitted: the wait writes nothing, and a job's own requeue resubmits into its run dir
    if detach:
        print(f"detached: {len(jobs)} job(s); watch with: python -m vrun runs "
              f"{' '.join(plan.run_dir for plan, *_ in items)}", flush=True)
        return jobs
    slurm_wait.until_ended([(job, plan.run_dir) for job, (plan, *_) in zip(jobs, items)])
    return jobs


def resubmit(run_dir: str, detach: bool = False, exclude: tuple = (), replacing: str | None = None) -> list:
    """Submit again from a run dir: the plan's own checked job (plan.json's `slurm` section, never a copy read back
    from elsewhere), the same run dir; the job resumes from the last whole checkpoint (vrun.rundir.checkpoints).
    Refused while any of the run's jobs is queued or running (but `replacing`: the job a stall's requeue is about to
    cancel). exclude: nodes the new job must not get (sbatch --exclude, added to any the plan has)."""
    from vrun.rundir import lock, state
    from vrun.rundir.record import PlanRecord

    held = lock.take(run_dir, "run", create=False)
    if held is not None:
        raise PlanError([held])
    record = PlanRecord.load(run_dir)
    if record.slurm is None:
        raise PlanError([Problem(f"{run_dir}/plan.json", "slurm", "holds no SLURM job to submit again (planned for "
                                 "another cluster, or never submitted)",
                                 "submit it with python runner.py ... cluster=slurm")])
    run = state.load(Path(run_dir))
    state.refresh([run])
    # the run's own state, SLURM's record on top: a queued, running or requeued attempt is in the way (not the job a
    # stall's requeue replaces, nor a job whose end the run recorded while SLURM still lists it leaving)
    if run.active and run.job_id != replacing:
        from vrun.rundir import jobs
        from vrun.rundir.state import describe, not_own

        listed = (jobs.squeue() or {}).get(run.job_id or "")
        why = not_own(run, listed) if listed is not None and listed.active else ""
        if why:
            raise PlanError([Problem("run", run_dir, f"records job {run.job_id}, which SLURM lists as "
                                     f"{listed.state} but {why}: not confirmed as this run's, nothing submitted",
                                     f"check it with squeue -j {run.job_id} -O JobID,Name,WorkDir; plan the run "
                                     "again into a new dir")])

        raise PlanError([Problem("run", run_dir, f"job {run.job_id} is still {describe(run)}",
                                 f"python -m vrun cancel {run_dir} first, or wait for it to end")])
    params = dict(record.slurm.parameters)
    if exclude:
        extra = dict(params.get("additional_parameters") or {})
        have = [h for h in str(extra.get("exclude") or "").split(",") if h]
        extra["exclude"] = ",".join(dict.fromkeys(have + list(exclude)))
        params["additional_parameters"] = extra
    sub = Submission(params, record.slurm.max_num_timeout)
    attempt = len(run.attempts)
    folder = record.slurm.submitit_folder
    job = executor(sub, folder).submit(RunJob(record.run_dir, record.run_id, attempt))
    rundir.record(run_dir, "submitted", job_id=job.job_id, restart=0, attempt=attempt, nodes=sub.nodes,
                  gpus_per_node=sub.gpus_per_node, work_dir=os.getcwd(),
                  **({"exclude": list(exclude)} if exclude else {}), **({"replacing": replacing} if replacing else {}))
    writer.write_text(Path(run_dir) / "slurm_job.json", json.dumps(
        {"job_id": job.job_id, "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr), "folder": folder,
         "spec": sub.saved(), "mode": record.mode, "attempt": attempt}, indent=2, default=str) + "\n", root=run_dir)
    without = f" (without {','.join(exclude)})" if exclude else ""
    print(f"resubmitted job {job.job_id}{without}: {run_dir}  logs {job.paths.stdout}", flush=True)
    lock.release_all()
    if not detach:
        from vrun.launch.slurm import wait as slurm_wait

        slurm_wait.until_ended([(job, run_dir)])
    return [job]


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vrun.launch.slurm.submit")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resubmit", help="submit a run dir again (same config, resumes)")
    r.add_argument("run_dir")
    r.add_argument("--detach", action="store_true")
    r.add_argument("--exclude", default="", help="nodes the new job must not get (comma-separated)")
    r.add_argument("--replacing", default=None, help="the job this one replaces (a stall's requeue cancels it)")
    a = ap.parse_args()
    writer.install()
    try:
        resubmit(a.run_dir, a.detach, tuple(h for h in a.exclude.split(",") if h), a.replacing)
    except PlanError as e:
        print(str(e), file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001
        print(f"error: {a.run_dir}: {e}", file=sys.stderr)
        sys.exit(2)

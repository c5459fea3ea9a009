"""SLURM from the login node: what is submitted (from the plan), the confirmation, the submission
(submitit), and `python -m vrun.slurm resubmit <run dir>`. The job each node runs is vrun.slurm_node.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from vrun.slurm_node import RunJob  # noqa: F401 - submitted here; jobs pickled as vrun.slurm.RunJob load too


@dataclass
class Spec:
    """The sbatch parameters of one job (submitit's SlurmExecutor names)."""
    nodes: int
    gpus_per_node: int
    tasks_per_node: int = 1
    cpus_per_task: Optional[int] = None
    mem_gb: Optional[int] = None
    timeout_min: int = 240
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    setup: list = field(default_factory=list)
    additional_parameters: dict = field(default_factory=dict)
    max_num_timeout: int = 3
    signal_delay_s: int = 120
    name: str = "vrun"

    @property
    def gpu_hours(self) -> float:
        return self.nodes * self.gpus_per_node * self.timeout_min / 60.0

    def executor_parameters(self) -> dict:
        p = {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "ntasks_per_node": self.tasks_per_node,
             "time": self.timeout_min, "signal_delay_s": self.signal_delay_s, "job_name": self.name,
             "setup": list(self.setup), "additional_parameters": dict(self.additional_parameters)}
        for k in ("cpus_per_task", "partition", "account", "qos", "constraint"):
            if getattr(self, k) is not None:
                p[k] = getattr(self, k)
        if self.mem_gb is not None:
            p["mem"] = f"{self.mem_gb}GB"
        return p


def spec_from(launcher: dict, cluster) -> Spec:
    """hydra.launcher (resolved for this point; the user's hydra.launcher.* overrides win) + the cluster group's
    lists (cluster: vrun.schema.Cluster)."""
    known = {f for f in Spec.__dataclass_fields__}
    kw = {k: v for k, v in launcher.items() if k in known and v is not None}
    kw["setup"] = list(launcher.get("setup") or []) + list(cluster.setup)
    kw["additional_parameters"] = {**(launcher.get("additional_parameters") or {}), **cluster.additional_parameters}
    return Spec(**kw)


def sbatch_script(spec: Spec, folder: str) -> str:
    """The sbatch script submitit writes for this spec (its own template function)."""
    from submitit.slurm.slurm import _make_sbatch_string

    command = f"{sys.executable} -u -m submitit.core._submit {folder}"
    return _make_sbatch_string(command=command, folder=folder, **spec.executor_parameters())


def node_error(text: str) -> str:
    """The node's own error line out of submitit's failure report (traceback text plus log paths)."""
    import re

    found = [m.group(1) for m in re.finditer(r"(?m)^\s*(?:\w+\.)*\w*(?:Error|Exception): (.+)$", text)]
    found = [f for f in found if not f.startswith("Job (task=")]
    return found[-1].strip() if found else (text.strip().splitlines() or ["unknown failure"])[0]


def job_payload(plan) -> dict:
    """What the node job needs from the plan (plain values: it is pickled with the job)."""
    m = plan.mesh
    return {"argv": plan.argv, "env": plan.env, "env_unset": plan.env_unset, "mesh": m.summary(),
            "algo_entrypoint": plan.entrypoint.name.value, "stack": plan.stack,
            "torchrun": {"python": sys.executable, "module": list(plan.config.run.sft_entry),
                         "nproc_per_node": m.gpus_per_node}}


def describe(spec: Spec) -> str:
    return (f"{spec.nodes} node(s) × {spec.gpus_per_node} GPU(s), {spec.timeout_min} min, partition "
            f"{spec.partition or '(default)'}: {spec.gpu_hours:.1f} GPU-hours")


def confirm(total_gpu_hours: float, cluster, stream=None) -> None:
    """Above cluster.confirm_gpu_hours: ask on a terminal, require cluster.yes=true otherwise."""
    from vrun.problems import PlanError, Problem

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


def submit(items: list, folder: str, detach: bool) -> list:
    """items: (plan, spec, mode). Submits one job per item; waits for all unless detached."""
    import logging

    import submitit

    logging.getLogger("submitit").setLevel(logging.ERROR)  # "Bypassing sacct error" on clusters without accounting
    jobs = []
    for plan, spec, mode in items:
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=spec.max_num_timeout)
        ex.update_parameters(**spec.executor_parameters())
        job = ex.submit(RunJob(plan.run_dir, job_payload(plan), dataclasses.asdict(plan.config.cluster), str(mode)))
        (Path(plan.run_dir) / "slurm_job.json").write_text(json.dumps(
            {"job_id": job.job_id, "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr),
             "folder": folder, "spec": asdict(spec), "mode": mode}, indent=2) + "\n")
        print(f"submitted job {job.job_id}: {plan.run_dir}  logs {job.paths.stdout}", flush=True)
        jobs.append(job)
    if detach:
        print(f"detached: {len(jobs)} job(s); watch with: squeue -j {','.join(j.job_id for j in jobs)}; "
              f"resubmit with: python -m vrun.slurm resubmit <run dir>", flush=True)
        return jobs
    failed = []
    for job in jobs:
        try:
            job.results()
            print(f"job {job.job_id}: done", flush=True)
        except Exception as e:  # noqa: BLE001 - submitit re-raises the node's exception
            failed.append(f"job {job.job_id} failed: {node_error(str(e))}")
    if failed:
        from vrun.problems import PlanError, Problem

        raise PlanError([Problem("slurm", "failed", line, f"see the job logs under {folder}") for line in failed])
    return jobs


def resubmit(run_dir: str, detach: bool = False) -> list:
    """Submit again from a run dir: same config, same run dir, verl resumes from its checkpoints."""
    import pickle

    import submitit

    info = json.loads((Path(run_dir) / "slurm_job.json").read_text())
    submitted = Path(info["folder"].replace("%j", info["job_id"])) / f"{info['job_id']}_submitted.pkl"
    with submitted.open("rb") as f:
        delayed = pickle.load(f)
    job_fn: RunJob = delayed.function
    spec = Spec(**info["spec"])
    ex = submitit.SlurmExecutor(folder=info["folder"], max_num_timeout=spec.max_num_timeout)
    ex.update_parameters(**spec.executor_parameters())
    job = ex.submit(RunJob(job_fn.run_dir, job_fn.plan, job_fn.cluster, job_fn.mode, job_fn.attempt + 1))
    info.update(job_id=job.job_id, stdout=str(job.paths.stdout), stderr=str(job.paths.stderr))
    (Path(run_dir) / "slurm_job.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"resubmitted job {job.job_id}: {run_dir}  logs {job.paths.stdout}", flush=True)
    if not detach:
        job.results()
    return [job]


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vrun.slurm")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resubmit", help="submit a run dir again (same config, resumes)")
    r.add_argument("run_dir")
    r.add_argument("--detach", action="store_true")
    a = ap.parse_args()
    try:
        resubmit(a.run_dir, a.detach)
    except Exception as e:  # noqa: BLE001
        print(f"error: {a.run_dir}: {e}", file=sys.stderr)
        sys.exit(2)

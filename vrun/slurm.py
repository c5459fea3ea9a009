"""SLURM from the login node: what is submitted (from the plan), the confirmation, the submission
(submitit), and `python -m vrun resubmit <run dir>` (also `python -m vrun.slurm resubmit`). The job each
node runs is vrun.slurm_node.

Every sbatch value has one home: the cluster group (vrun.schema.Cluster) and the mesh. Hydra's submitit launcher
is only selected (conf/cluster/slurm.yaml); a `hydra.launcher.*` value given by hand is taken onto the knob it
names (launcher_problems), refused where the mesh decides it, and passed to sbatch where the project has no knob.
"""
from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vrun import rundir
from vrun.problems import PlanError, Problem
from vrun.slurm_node import RunJob  # noqa: F401 - submitted here; jobs pickled as vrun.slurm.RunJob load too

# hydra.launcher.<key> given by hand → the cluster knob it sets (a given value wins over the cluster group's)
LAUNCHER_KNOBS = {"partition": "partition", "account": "account", "qos": "qos", "constraint": "constraint",
                  "timeout_min": "time_min", "cpus_per_task": "cpus_per_task", "mem_gb": "mem_gb",
                  "max_num_timeout": "max_requeues", "name": "job_name", "setup": "setup",
                  "additional_parameters": "additional_parameters"}
# ... that the mesh decides: refused when they disagree with it (one task per node holds all its GPUs)
LAUNCHER_MESH = {"nodes": "mesh.nnodes", "gpus_per_node": "mesh.gpus_per_node", "gpus_per_task": "mesh.gpus_per_node",
                 "tasks_per_node": None}
# ... sbatch options without a knob here: passed to submitit as they are (the plugin's defaults otherwise)
LAUNCHER_PASSED = ("comment", "exclude", "gres", "cpus_per_gpu", "mem_per_gpu", "mem_per_cpu", "signal_delay_s",
                   "stderr_to_stdout")
# a value that reaches an #SBATCH line: one word, no control characters
SBATCH_WORD = re.compile(r"[^\s\x00-\x1f\x7f]+")


def launcher_given(unresolved: dict, overridden: list[str]) -> set[str]:
    """The hydra.launcher keys set by hand: given on the command line, or differing from the plugin's defaults."""
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from omegaconf import OmegaConf

    defaults = OmegaConf.to_container(OmegaConf.structured(SlurmQueueConf), resolve=False)
    named = {o.lstrip("+~").split("=", 1)[0][len("hydra.launcher."):].split(".")[0]
             for o in overridden if o.lstrip("+~").startswith("hydra.launcher.")}
    return {k for k in unresolved if k not in ("_target_", "submitit_folder")
            and (k in named or unresolved[k] != defaults.get(k))}


def launcher_problems(cfg, launcher: dict, given: set[str]) -> list[Problem]:
    """Takes the hydra.launcher values given by hand onto their knobs in the composed point `cfg` (before its
    checks run); the ones the mesh decides must agree with it; unknown to this project: refused."""
    from omegaconf import OmegaConf

    out = []
    for key in sorted(given):
        v, name = launcher[key], f"hydra.launcher.{key}"
        if key in LAUNCHER_KNOBS:
            knob = f"cluster.{LAUNCHER_KNOBS[key]}"
            if key == "setup":  # the launcher's lines, then the cluster group's
                v = list(v or []) + list(OmegaConf.select(cfg, knob) or [])
            elif key == "additional_parameters":
                v = {**(OmegaConf.select(cfg, knob) or {}), **(v or {})}
            OmegaConf.update(cfg, knob, v, merge=False)
        elif key in LAUNCHER_MESH:
            src = LAUNCHER_MESH[key]
            want = OmegaConf.select(cfg, src) if src else 1
            if v is not None and v != want:
                out.append(Problem(name, v, f"the job's shape comes from the mesh: {src or 'one task per node'} = "
                                   f"{want}", f"drop {name}" + (f"; set {src}={v}" if src else "")))
        elif key in LAUNCHER_PASSED:
            if v is not None and not (isinstance(v, (bool, int)) or SBATCH_WORD.fullmatch(str(v))):
                out.append(Problem(name, v, "reaches sbatch.sh as an option value: one word without control "
                                   "characters", f"{name}=<value>"))
        else:  # array_parallelism: one job per sweep point, never a job array
            out.append(Problem(name, v, "this project submits one job per sweep point, not a job array",
                               f"drop {name}"))
    return out


@dataclass(frozen=True)
class Submission:
    """One sbatch job: submitit's SlurmExecutor parameters (its names) and how often it requeues on timeout."""
    parameters: dict
    max_num_timeout: int

    @classmethod
    def of(cls, plan, launcher: dict) -> "Submission":
        """From the plan (the cluster group and the mesh) and the launcher's own sbatch options (LAUNCHER_PASSED)."""
        c, m = plan.config.cluster, plan.mesh
        p: dict[str, Any] = {"nodes": m.nnodes, "gpus_per_node": m.gpus_per_node, "ntasks_per_node": 1,
                             "time": c.time_min, "job_name": c.job_name or plan.config.run.experiment_name,
                             "setup": list(c.setup), "additional_parameters": dict(c.additional_parameters)}
        for k in ("cpus_per_task", "partition", "account", "qos", "constraint"):
            if getattr(c, k) is not None:
                p[k] = getattr(c, k)
        if c.mem_gb is not None:
            p["mem"] = f"{c.mem_gb}GB"
        p.update({k: launcher[k] for k in LAUNCHER_PASSED if launcher.get(k) is not None})
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


def sbatch_script(sub: Submission, folder: str) -> str:
    """The sbatch script submitit writes for this job (its own template function)."""
    from submitit.slurm.slurm import _make_sbatch_string

    command = f"{sys.executable} -u -m submitit.core._submit {folder}"
    return _make_sbatch_string(command=command, folder=folder, **sub.parameters)


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


def submit(items: list, detach: bool) -> list:
    """items: (plan, submission, mode, submitit folder). Submits one job per item; unless detached, waits for all,
    showing each job's progress (vrun.runs.watch)."""
    import logging

    import submitit

    logging.getLogger("submitit").setLevel(logging.ERROR)  # "Bypassing sacct error" on clusters without accounting
    jobs = []
    for plan, sub, mode, folder in items:
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=sub.max_num_timeout)
        ex.update_parameters(**sub.parameters)
        job = ex.submit(RunJob(plan.run_dir, job_payload(plan), asdict(plan.config.cluster), str(mode)))
        (Path(plan.run_dir) / "slurm_job.json").write_text(json.dumps(
            {"job_id": job.job_id, "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr),
             "folder": folder, "spec": sub.saved(), "mode": mode}, indent=2) + "\n")
        rundir.record(plan.run_dir, "submitted", job_id=job.job_id, attempt=0, nodes=sub.nodes,
                      gpus_per_node=sub.gpus_per_node)
        print(f"submitted job {job.job_id}: {plan.run_dir}  logs {job.paths.stdout}", flush=True)
        jobs.append(job)
    if detach:
        print(f"detached: {len(jobs)} job(s); watch with: python -m vrun runs "
              f"{' '.join(plan.run_dir for plan, *_ in items)}", flush=True)
        return jobs
    from vrun.runs import watch

    watch.until_done([(job, plan.run_dir) for job, (plan, *_) in zip(jobs, items)])
    failed = []
    for job, (plan, *_) in zip(jobs, items):
        try:
            job.results()
            print(f"job {job.job_id}: done", flush=True)
        except Exception as e:  # noqa: BLE001 - submitit re-raises the node's exception
            failed.append((f"job {job.job_id} failed: {node_error(str(e))}", plan.run_dir))
    if failed:
        raise PlanError([Problem("slurm", "failed", line, f"python -m vrun status {run_dir}; python -m vrun logs "
                                 f"{run_dir}") for line, run_dir in failed])
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
    sub = Submission.load(info["spec"])
    ex = submitit.SlurmExecutor(folder=info["folder"], max_num_timeout=sub.max_num_timeout)
    ex.update_parameters(**sub.parameters)
    job = ex.submit(RunJob(job_fn.run_dir, job_fn.plan, job_fn.cluster, job_fn.mode, job_fn.attempt + 1))
    rundir.record(run_dir, "submitted", job_id=job.job_id, attempt=job_fn.attempt + 1, nodes=sub.nodes,
                  gpus_per_node=sub.gpus_per_node)
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

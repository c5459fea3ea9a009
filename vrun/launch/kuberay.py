"""cluster=kuberay: each planned point as a RayJob a KubeRay operator runs (hydra/launcher=vrun_kuberay calls
`launch`).

The manifest (<run dir>/rayjob.yaml) is the plan's job on its own Ray cluster: a head group and one worker group
sized from the mesh (mesh.nnodes pods of mesh.gpus_per_node GPUs each: the head is the first node, the workers
the rest), each pod with the GPUs in its limits, the image, the claim holding the run dir mounted at the same path
as here, and the pass_env secrets from a Secret by name (their values never enter the manifest). The job's
entrypoint is the hand-off every cluster runs: `python -m vrun.launch.entry ppo --config <run dir>/verl_config.yaml`
(the stack check first, then verl's run_ppo), with the plan's environment as the job's env_vars. Every field
written is checked against the project's schema of the RayJob API at a pinned KubeRay release
(vrun/launch/kuberay_schema.py, each field with its source) before the file is written.

The pods run as the planner's uid and gid (securityContext runAsUser, runAsGroup, fsGroup), who owns the run dir the
entry reads; cluster.kuberay.run_as_uid/run_as_gid name a site's own, and the job's env then names the planner's
uid as the one whose run dir files the entry trusts (VRUN_TRUST_UID, vrun.core.fs). Each pod requests CPUs
(cluster.cpus_per_task, else CPUS_PER_GPU per GPU) and memory (cluster.mem_gb, else pod_memory_gib: the states the
plan offloads to the host, each GPU's worker, Ray's object store) with the memory limit equal to the request, so no
pod is BestEffort; the operator mounts a memory-backed /dev/shm itself, sized by that limit. HOME is /tmp/vrun-home
(the image's home may not be the pods' uid's to write; Triton's and vLLM's caches go under it).

Checked before anything is written, as the other clusters check theirs: the image (a reference by its grammar),
the claim and its mount path (the run dir under it: the pods read the plan there and write checkpoints and progress
there), every path the job reads (data, model, reward function) on the claim or said off it, a Secret for pass_env,
Kubernetes names by their grammars and limits, and the preflight checks that need no GPU. No manifest is written
that cannot be applied: a plan without image or claim prints its table and what is missing. With
cluster.kuberay.apply=true the manifest is applied with kubectl (on PATH, its own context and credentials);
otherwise it is the hand-off, and the command that applies it is printed, shell-quoted.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from vrun.core.problems import Problem
from vrun.launch import kuberay_schema as api
from vrun.launch.kuberay_checks import CPUS_PER_GPU, host_gib_per_gpu, pod_memory_gib

MANIFEST = "rayjob.yaml"
# the operator derives service and pod names from the RayJob's name: it keeps it short
NAME_MAX = api.NAME_MAX
VOLUME = "run-dir"
KUBECTL_TIMEOUT_S = 120
RUN_ID_LABEL = "vrun/run-id"
# the pods' home: their uid (the planner's) has none in the image, whose own home (the Ray images' /home/ray) it may
# not write, while the caches under it must be written (Triton's, vLLM's, torch's); /tmp is writable wherever Ray runs
HOME = "/tmp/vrun-home"


@dataclass(frozen=True)
class Job:
    """What the manifest is made of, read from the planner's Plan (job_of_plan) or from plan.json (job_of_record,
    for resubmit): one builder for both, so the job applied again is the plan's, never a file read back."""
    run_dir: str
    run_id: str
    model: str
    argv: tuple
    env: dict               # the job's env_vars (rayjobs.job_env)
    pass_env: tuple
    nnodes: int
    gpus_per_node: int
    cluster: dict           # the cluster group's values, as plan.json's cluster_group
    host_gib_per_gpu: float  # the states the plan offloads to the host, per GPU (host_gib_per_gpu)
    ray_version: str

    @property
    def kuberay(self) -> dict:
        return self.cluster.get("kuberay") or {}


def _ray_version(stack: dict) -> str:
    got = (stack.get("runtime") or {}).get("ray") if isinstance(stack, dict) else None
    if got:
        return str(got)
    from vrun.launch import rayjobs

    return rayjobs.here()["ray"]


def job_of_plan(plan) -> Job:
    from vrun.launch import rayjobs
    from vrun.rundir.records import run_id

    memory = plan.memory.summary() if plan.memory is not None else {}
    return Job(str(plan.run_dir), run_id(plan.run_dir), str(plan.config.model.name), tuple(plan.argv),
               rayjobs.job_env(plan), tuple(plan.config.pass_env), plan.mesh.nnodes, plan.mesh.gpus_per_node,
               dataclasses.asdict(plan.config.cluster), host_gib_per_gpu(memory), _ray_version(plan.stack))


def job_of_record(record) -> Job:
    """From plan.json (vrun.rundir.record.PlanRecord): the run id the record holds is checked by the caller."""
    from vrun.launch import rayjobs

    return Job(record.run_dir, record.run_id, record.model.name, tuple(record.argv), rayjobs.job_env(record),
               tuple(record.pass_env), record.mesh.nnodes, record.mesh.gpus_per_node, dict(record.cluster_group),
               host_gib_per_gpu(record.memory), _ray_version(record.stack))


def pod_cpus(job: Job) -> int:
    cpus = job.cluster.get("cpus_per_task")
    return int(cpus) if cpus else CPUS_PER_GPU * job.gpus_per_node


def pod_memory(job: Job, head: bool) -> int:
    mem = job.cluster.get("mem_gb")
    return int(mem) if mem else pod_memory_gib(job.host_gib_per_gpu, job.gpus_per_node, head)


def run_as(job: Job) -> tuple[int, int]:
    """(uid, gid) the pods run as: the configured ones, else the planner's (who owns the run dir)."""
    k = job.kuberay
    uid = k.get("run_as_uid")
    gid = k.get("run_as_gid")
    return (os.getuid() if uid is None else int(uid)), (os.getgid() if gid is None else int(gid))


def job_name(job: Job) -> str:
    """metadata.name: vrun-<model>-<run id>, lower case, at most NAME_MAX characters (never read back: recomputed
    from the plan wherever it is needed)."""
    return name_of(job.model, job.run_id)


def name_of(model: str, run_id: str) -> str:
    model = re.sub(r"[^a-z0-9]+", "-", str(model).lower()).strip("-")
    return f"vrun-{model[:NAME_MAX - 16]}-{str(run_id)[:10]}".strip("-")


def entrypoint(job: Job) -> str:
    """The plan's argv as the job runs it: the image's python, the config in the run dir on the claim."""
    return " ".join(shlex.quote(a) for a in ["python"] + list(job.argv[1:]))


def job_env(job: Job) -> dict:
    """The job's env_vars; with pods of another uid than the planner's, the planner's uid as the one whose run dir
    files the entry trusts (vrun.core.fs.TRUST_UID_ENV)."""
    from vrun.core import fs

    env = dict(job.env)
    if run_as(job)[0] != os.getuid():
        env[fs.TRUST_UID_ENV] = str(os.getuid())
    return env


def _pod(job: Job, role: str, head: bool) -> dict:
    k, g = job.kuberay, job.gpus_per_node
    # optional: a variable the Secret lacks stays unset, as one this machine lacks is not passed
    env = [{"name": "HOME", "value": HOME}] + ([
        {"name": n, "valueFrom": {"secretKeyRef": {"name": k["env_from"], "key": n, "optional": True}}}
        for n in job.pass_env] if k.get("env_from") else [])
    mem = f"{pod_memory(job, head)}Gi"
    container: dict = {"name": f"ray-{role}", "image": k["image"],
                       "resources": {"requests": {"cpu": pod_cpus(job), "memory": mem},
                                     "limits": {k["gpu_resource"]: g, "memory": mem}}}
    container["env"] = env
    uid, gid = run_as(job)
    container["volumeMounts"] = [{"name": VOLUME, "mountPath": k["mount_path"]}]
    spec: dict = {"securityContext": {"runAsUser": uid, "runAsGroup": gid, "fsGroup": gid},
                  "containers": [container],
                  "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": k["claim"]}}]}
    return {"spec": spec}


def manifest(job: Job) -> dict:
    """The RayJob of one planned point (its knobs checked first: vrun.launch.kuberay_checks.problems)."""
    import yaml

    k, g = job.kuberay, job.gpus_per_node
    cluster_spec: dict = {
        "rayVersion": job.ray_version,
        "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": str(g)},
                          "template": _pod(job, "head", True)},
    }
    if job.nnodes > 1:
        n = job.nnodes - 1
        cluster_spec["workerGroupSpecs"] = [{"groupName": "gpu", "replicas": n, "minReplicas": n, "maxReplicas": n,
                                             "rayStartParams": {"num-gpus": str(g)},
                                             "template": _pod(job, "worker", False)}]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": job_name(job), "namespace": k["namespace"],
                     "labels": {"app.kubernetes.io/managed-by": "vrun", RUN_ID_LABEL: job.run_id[:63]}},
        "spec": {
            "entrypoint": entrypoint(job),
            "runtimeEnvYAML": yaml.safe_dump({"env_vars": job_env(job)}, sort_keys=True),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": int(k["ttl_s"]),
            "activeDeadlineSeconds": int(job.cluster["time_min"]) * 60,
            "submissionMode": "K8sJobMode",
            "rayClusterSpec": cluster_spec,
        },
    }


def schema_problems(doc: dict) -> list[Problem]:
    """The manifest against the project's schema of the RayJob API: built from checked knobs, any line here is the
    project's own fault."""
    return [Problem("cluster.kuberay", "manifest", f"{line} ({api.RELEASE})", "report it: the project writes a "
                    "field its schema of the RayJob API does not hold") for line in api.check(doc)]


def apply(path: Path, namespace: str) -> tuple[bool, str]:
    """kubectl apply -f path, bounded (vrun.launch.kubectl.run): (applied, kubectl's last line, terminal-safe)."""
    from vrun.launch import kubectl

    a = kubectl.run(["apply", "-n", namespace, "-f", str(path)], KUBECTL_TIMEOUT_S)
    if a.code == 0:
        lines = [x for x in a.out.decode("utf-8", "replace").splitlines() if x.strip()]
        return True, kubectl.shown(lines[-1]) if lines else "applied"
    return False, ("kubectl is not on PATH" if a.why == "kubectl is not on PATH" else
                   f"kubectl apply {a.why}" if a.why else kubectl.said(a))


def apply_command(namespace: str, path) -> str:
    from vrun.launch.kubectl import command

    return command(["kubectl", "apply", "-n", namespace, "-f", str(path)])


# ==================================================================== the launcher
def launch(sweep) -> list:
    import yaml

    from vrun.config import cli_errors
    from vrun.config.schema import Mode
    from vrun.core import writer
    from vrun.launch import points as planned
    from vrun.launch import rayjobs
    from vrun.launch.kuberay_checks import missing, problems
    from vrun.rundir import records as rundir

    docs = {}

    def check(point) -> list:
        p = point.plan
        found = problems(p)
        # a manifest only from knobs that passed (a refused one is its own line, never the schema's) and are all given
        if not any(not x.warning for x in found) and not missing(p):
            docs[point.idx] = manifest(job_of_plan(p))
            found += schema_problems(docs[point.idx])
        return found + (rayjobs.login_problems(p) if p.config.mode != Mode.plan else [])

    planned.verdict(sweep, check, "refused before the manifest was written; nothing was applied")
    for point in sweep.points:
        planned.write(point)
        p, k = point.plan, point.plan.config.cluster.kuberay
        doc = docs.get(point.idx)
        if doc is None:  # plan mode without image or claim: the plan, and no manifest that could not be applied
            gone = missing(p)
            print(f"plan only: no RayJob manifest written in {p.run_dir}: {', '.join(gone)} not given; give "
                  f"{'it' if len(gone) == 1 else 'them'} and plan again to write one", flush=True)
            continue
        path = Path(p.run_dir) / MANIFEST
        writer.write_text(path, yaml.safe_dump(doc, sort_keys=False), root=p.run_dir)
        name = doc["metadata"]["name"]
        if p.config.mode != Mode.train or not k.apply:
            how = "plan only" if p.config.mode == Mode.plan else ("preflight: all checks passed here"
                                                                   if p.config.mode == Mode.preflight else "train")
            print(f"{how}: RayJob {name} in {path}; {apply_command(k.namespace, path)} starts it", flush=True)
            continue
        ok, said = apply(path, k.namespace)
        if not ok:
            cli_errors.emit([Problem("cluster.kuberay.apply", True, f"{said}; the manifest is in {path}, nothing was "
                                     "applied", f"{apply_command(k.namespace, path)} where kubectl reaches the "
                                     "cluster, or cluster.kuberay.apply=false").line()])
        rundir.record(p.run_dir, "submitted", attempt=0, cluster="kuberay", rayjob=name)
        from vrun.launch.kubectl import command

        print(f"applied RayJob {name} ({said}); {command(['kubectl', 'get', 'rayjob', '-n', k.namespace, name])}",
              flush=True)
    return []

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
pod is BestEffort; the operator mounts a memory-backed /dev/shm itself, sized by that limit.

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
import math
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vrun.core.problems import Problem
from vrun.launch import kuberay_schema as api

MANIFEST = "rayjob.yaml"
LABEL, SUBDOMAIN = api.LABEL, api.SUBDOMAIN
# the operator derives service and pod names from the RayJob's name: it keeps it short
NAME_MAX = api.NAME_MAX
VOLUME = "run-dir"
KUBECTL_TIMEOUT_S = 120
RUN_ID_LABEL = "vrun/run-id"
# a pod's share of the node when cluster.cpus_per_task is not set
CPUS_PER_GPU = 8
# host memory per GPU beside the offloaded states: its worker process (torch and CUDA's host side, the rollout
# engine's), and the head's driver, task runner and Ray's own processes (assumptions, overridden by cluster.mem_gb)
PROCESS_GIB_PER_GPU = 12
HEAD_GIB = 8
# Ray's object store takes this share of the memory it sees (ray_constants' default), in the operator's /dev/shm,
# which counts against the pod's memory limit
OBJECT_STORE_SHARE = 0.3
OBJECT_STORE_MAX_GIB = 200e9 / 2 ** 30  # and at most 200 GB
UID_MAX = 2 ** 31 - 1
TIME_MIN_MAX = api.INT32 // 60  # activeDeadlineSeconds is an int32


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


def host_gib_per_gpu(memory: dict) -> float:
    """The busiest stage's states on the host, GiB per GPU: the optimizer the plan offloads, and what leaves the GPU
    while the rollout runs (params, grads, optimizer but the actor's residents). 0 without an estimate."""
    best = 0.0
    for st in (memory.get("stages") if isinstance(memory, dict) else None) or []:
        try:
            states = float(st["params_gib"]) + float(st["grads_gib"]) + float(st["optimizer_gib"])
            here = float(st["optimizer_host_gib"]) + max(states - float(st["rollout_residents_gib"]), 0.0)
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(here):
            best = max(best, here)
    return best


def pod_memory_gib(host_per_gpu: float, gpus: int, head: bool) -> int:
    """A pod's memory (request = limit), GiB: its GPUs' host states and workers (and the head's own processes),
    with Ray's object store beside them in /dev/shm (the operator sizes it by this limit; Ray takes
    OBJECT_STORE_SHARE of the limit, at most OBJECT_STORE_MAX_GIB)."""
    need = gpus * (host_per_gpu + PROCESS_GIB_PER_GPU) + (HEAD_GIB if head else 0)
    limit = need / (1 - OBJECT_STORE_SHARE)
    return int(math.ceil(limit if limit * OBJECT_STORE_SHARE <= OBJECT_STORE_MAX_GIB else need + OBJECT_STORE_MAX_GIB))


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
    env = [{"name": n, "valueFrom": {"secretKeyRef": {"name": k["env_from"], "key": n, "optional": True}}}
           for n in job.pass_env] if k.get("env_from") else []
    mem = f"{pod_memory(job, head)}Gi"
    container: dict = {"name": f"ray-{role}", "image": k["image"],
                       "resources": {"requests": {"cpu": pod_cpus(job), "memory": mem},
                                     "limits": {k["gpu_resource"]: g, "memory": mem}}}
    if env:
        container["env"] = env
    uid, gid = run_as(job)
    container["volumeMounts"] = [{"name": VOLUME, "mountPath": k["mount_path"]}]
    spec: dict = {"securityContext": {"runAsUser": uid, "runAsGroup": gid, "fsGroup": gid},
                  "containers": [container],
                  "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": k["claim"]}}]}
    return {"spec": spec}


def manifest(job: Job) -> dict:
    """The RayJob of one planned point (its knobs checked by problems() first)."""
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


def _under(path: str, base: str) -> bool:
    p, b = os.path.normpath(os.path.abspath(path)), os.path.normpath(base)
    return p == b or p.startswith(b.rstrip("/") + "/")


def read_paths(plan) -> list[tuple[str, str]]:
    """Every path the job reads, as (key, path): the data files, the model, and where the plan uses them a critic's
    or reward model's checkpoint and a custom reward function's file."""
    from vrun.core import dotted
    from vrun.launch.preflight import data_files

    v = plan.verl
    out = list(data_files(v))
    if plan.model_path:
        out.append(("model.path", str(plan.model_path)))
    critic = dotted.get(v, "critic.enable", None)
    wanted = {"critic.model.path": critic if critic is not None else
              dotted.get(v, "algorithm.adv_estimator", None) == "gae",
              "reward_model.model.path": bool(dotted.get(v, "reward_model.enable", False)),
              "custom_reward_function.path": True}
    for key, used in wanted.items():
        p = dotted.get(v, key, None)
        if used and isinstance(p, str) and p:
            out.append((key, p))
    return out


def path_problems(plan, mount: str) -> list[Problem]:
    """A warning naming each path the job reads that is not on the claim (the pods see their image and the claim)."""
    out = []
    for key, p in read_paths(plan):
        if "://" in p or (p.startswith("/") and _under(p, mount)):
            continue
        where = ("expands from the pod's home, not this machine's" if p.startswith("~") else
                 "relative: the pods resolve it from their own working dir" if not p.startswith("/") else
                 f"outside the claim's mount {mount}: the pods see only their image and the claim")
        out.append(Problem(key, p, where, f"put it under {mount} (and give that path), unless the image holds it "
                           "at that path", warning=True))
    if len(out) > 6:
        out = out[:5] + [Problem("paths", f"{len(out) - 5} more", "further paths the job reads are off the claim",
                                 f"put them under {mount}, unless the image holds them", warning=True)]
    return out


def _cut(v, most: int = 80):
    """A value as a refusal quotes it: long strings cut (a 5,000-character image is said by its length)."""
    return v if not isinstance(v, str) or len(v) <= most else f"{v[:most - 1]}…"


def knob_problems(plan) -> list[Problem]:
    """cluster.kuberay's knobs by the grammars and ranges of the fields they become (errors in every mode: a
    manifest is built from them)."""
    k, c = plan.config.cluster.kuberay, plan.config.cluster
    out = []
    if k.image is not None:
        why = api.image_why(k.image)
        if why:
            out.append(Problem("cluster.kuberay.image", _cut(k.image), why,
                               "cluster.kuberay.image=<registry>/<path>:<tag>"))
    for key, v, kind in (("cluster.kuberay.namespace", k.namespace, "label"),
                         ("cluster.kuberay.claim", k.claim, "subdomain"),
                         ("cluster.kuberay.env_from", k.env_from, "subdomain")):
        why = api.name_why(v, kind) if v is not None or key.endswith("namespace") else ""
        if why:
            out.append(Problem(key, _cut(v), f"a Kubernetes name: {why}", f"{key}=<an RFC 1123 {kind}, e.g. "
                               f"{'ml-jobs' if kind == 'label' else 'train-runs'}>"))
    why = api.resource_why(k.gpu_resource)
    if why:
        out.append(Problem("cluster.kuberay.gpu_resource", _cut(k.gpu_resource), f"a GPU's resource name in a pod's "
                           f"limits: {why}", "cluster.kuberay.gpu_resource=nvidia.com/gpu (or your device "
                           "plugin's, e.g. amd.com/gpu)"))
    mp = k.mount_path
    if mp is not None:
        if not isinstance(mp, str) or not mp.startswith("/") or ":" in mp or "\0" in mp:
            out.append(Problem("cluster.kuberay.mount_path", _cut(mp), "the claim's mount point in the pods: an absolute "
                               "path (no ':'), the same as this machine's", "cluster.kuberay.mount_path=/<path>"))
        elif os.path.normpath(mp) in ("/", "/dev", "/dev/shm", "/proc", "/sys", "/tmp/ray"):
            out.append(Problem("cluster.kuberay.mount_path", mp, f"{os.path.normpath(mp)} is the pods' own (the "
                               "root, the operator's /dev/shm, Ray's session dir): a claim mounted there hides it",
                               "cluster.kuberay.mount_path=<the dir the claim is mounted at here, e.g. /mnt/runs>"))
    if isinstance(k.ttl_s, bool) or not isinstance(k.ttl_s, int) or not 0 <= k.ttl_s <= 7 * 86400:
        out.append(Problem("cluster.kuberay.ttl_s", k.ttl_s, "seconds the finished job's cluster is kept: a whole "
                           "number in [0, 604800]", "cluster.kuberay.ttl_s=600"))
    for key, v in (("cluster.kuberay.run_as_uid", k.run_as_uid), ("cluster.kuberay.run_as_gid", k.run_as_gid)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= UID_MAX):
            out.append(Problem(key, v, f"a pod's {key[-3:]}: a whole number in [0, {UID_MAX}]",
                               f"{key}=null (the planner's own, {os.getuid() if key.endswith('uid') else os.getgid()})"))
    t = c.time_min
    if isinstance(t, int) and not isinstance(t, bool) and t > TIME_MIN_MAX:
        out.append(Problem("cluster.time_min", t, f"the RayJob's activeDeadlineSeconds is an int32: at most "
                           f"{TIME_MIN_MAX} minutes", f"cluster.time_min=<at most {TIME_MIN_MAX}>"))
    return out


def problems(plan) -> list[Problem]:
    """What the pods need, checked here: errors for a job that would be applied or checked (mode=train or
    preflight), warnings for a plan (which then writes no manifest: missing() says what it lacks)."""
    from vrun.config.schema import Mode

    k = plan.config.cluster.kuberay
    hard = plan.config.mode != Mode.plan
    if not plan.entrypoint.uses_ray:
        return [Problem("cluster", "kuberay", "SFT runs under torchrun on every node, not as a Ray job",
                        "cluster=slurm (or cluster=local) for algo=sft")]
    out = knob_problems(plan)
    if k.image is None or (isinstance(k.image, str) and not k.image.strip()):
        out.append(Problem("cluster.kuberay.image", k.image, "the pods' image (it holds this project, verl, "
                           "verl_mlite and vLLM at the plan's stack; the job's entry checks it first)",
                           "cluster.kuberay.image=<registry>/<image>:<tag>", warning=not hard))
    if not k.claim or not k.mount_path:
        missing = "cluster.kuberay.claim" if not k.claim else "cluster.kuberay.mount_path"
        out.append(Problem(missing, None, "the pods would not see the run dir (plan.json, verl_config.yaml) nor "
                           "keep its checkpoints and progress: a claim every pod mounts holds it",
                           "cluster.kuberay.claim=<a ReadWriteMany claim> cluster.kuberay.mount_path=<where this "
                           "machine has it mounted>", warning=not hard))
    elif isinstance(k.mount_path, str) and k.mount_path.startswith("/") and not any(
            p.key == "cluster.kuberay.mount_path" for p in out):
        if not _under(plan.run_dir, k.mount_path):
            out.append(Problem("hydra.run.dir", plan.run_dir, f"outside the claim's mount {k.mount_path}: the pods "
                               "would not find the plan nor keep the checkpoints", f"hydra.run.dir={k.mount_path}"
                               "/<dir> (or hydra.sweep.dir=...)", warning=not hard))
        out += path_problems(plan, k.mount_path)
    if plan.config.pass_env and not k.env_from:
        out.append(Problem("cluster.kuberay.env_from", None, f"pass_env names {', '.join(plan.config.pass_env)}: "
                           "the pods get them from a Secret by name (their values never enter the manifest); "
                           "without one they are unset in the job", "cluster.kuberay.env_from=<a Secret with those "
                           "keys> (a key it lacks stays unset)", warning=True))
    uid = k.run_as_uid
    if isinstance(uid, int) and not isinstance(uid, bool) and 0 <= uid <= UID_MAX and uid != os.getuid():
        out.append(Problem("cluster.kuberay.run_as_uid", uid, f"the pods run as uid {uid}, not as the run dir's "
                           f"owner ({os.getuid()}): the job's entry trusts uid {os.getuid()}'s files there "
                           f"(VRUN_TRUST_UID), and the run dir must be writable by uid {uid} (its checkpoints and "
                           "progress)", f"make {plan.run_dir} writable by uid {uid} (or group-writable by "
                           "cluster.kuberay.run_as_gid), or cluster.kuberay.run_as_uid=null", warning=True))
    mem = plan.config.cluster.mem_gb
    if isinstance(mem, int) and not isinstance(mem, bool) and mem > 0 and plan.memory is not None:
        host = host_gib_per_gpu(plan.memory.summary())
        need = pod_memory_gib(host, plan.mesh.gpus_per_node, False)
        if mem < need:
            out.append(Problem("cluster.mem_gb", mem, f"each pod's memory limit; the plan puts {host:.1f} GiB of "
                               f"offloaded states per GPU on the host ({host * plan.mesh.gpus_per_node:.0f} GiB a "
                               f"pod), with the workers and Ray's object store about {need} GiB: the pods may be "
                               "OOM-killed", f"cluster.mem_gb={need} (or null: sized from the plan)", warning=True))
    return out


def missing(plan) -> list[str]:
    """The knobs a manifest cannot be written without (plan mode: the table, then these, and no file)."""
    k = plan.config.cluster.kuberay
    return [key for key, v in (("cluster.kuberay.image", k.image), ("cluster.kuberay.claim", k.claim),
                               ("cluster.kuberay.mount_path", k.mount_path)) if not v]


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
            print(f"plan only: no RayJob manifest written in {p.run_dir}: {', '.join(missing(p))} not given; plan "
                  "again with them to write one", flush=True)
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

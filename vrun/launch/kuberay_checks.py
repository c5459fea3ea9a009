"""cluster=kuberay's checks before a manifest is built (vrun.launch.kuberay): the knobs by the grammars and ranges of
the RayJob fields they become (kuberay_schema), the claim and the run dir on it, every path the job reads on the
claim or said off it, a Secret for pass_env, the pods' uid and memory against the plan. Errors for a job that
would be applied or checked (mode=train or preflight); in a plan the missing image or claim are warnings, and no
manifest is written (missing)."""
from __future__ import annotations

import math
import os

from vrun.core.problems import Problem
from vrun.launch import kuberay_schema as api

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
# the pods' uid and gid (Kubernetes' securityContext range)
UID_MAX = 2 ** 31 - 1
TIME_MIN_MAX = api.INT32 // 60  # activeDeadlineSeconds is an int32


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
        elif os.path.normpath(mp) != (mp.rstrip("/") or "/"):
            out.append(Problem("cluster.kuberay.mount_path", _cut(mp), "the claim's mount point in the pods: a path "
                               "without '.', '..' or doubled '/' parts (the pods take it as written)",
                               f"cluster.kuberay.mount_path={os.path.normpath(mp)}"))
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

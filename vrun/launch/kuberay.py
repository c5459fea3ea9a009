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

Checked before anything is written, as the other clusters check theirs: the image, the claim and its mount path
(the run dir under it: the pods read the plan there and write checkpoints and progress there), a Secret for
pass_env, Kubernetes names, and the preflight checks that need no GPU. With cluster.kuberay.apply=true the
manifest is applied with kubectl (on PATH, its own context and credentials); otherwise it is the hand-off, and the
command that applies it is printed.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from vrun.core.problems import Problem

MANIFEST = "rayjob.yaml"
# Kubernetes names: an RFC 1123 label (namespaces, volume names) and subdomain (claims, secrets)
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
# the operator derives service and pod names from the RayJob's name: it keeps it short
NAME_MAX = 47
VOLUME = "run-dir"
KUBECTL_TIMEOUT_S = 120


def job_name(plan) -> str:
    """metadata.name: vrun-<model>-<run id>, lower case, at most NAME_MAX characters."""
    from vrun.rundir.records import run_id

    model = re.sub(r"[^a-z0-9]+", "-", str(plan.config.model.name).lower()).strip("-")
    rid = run_id(plan.run_dir)[:10]
    return f"vrun-{model[:NAME_MAX - 16]}-{rid}".strip("-")


def entrypoint(plan) -> str:
    """The plan's argv as the job runs it: the image's python, the config in the run dir on the claim."""
    return " ".join(shlex.quote(a) for a in ["python"] + list(plan.argv[1:]))


def _pod(plan, role: str, gpus: int) -> dict:
    k = plan.config.cluster.kuberay
    # optional: a variable the Secret lacks stays unset, as one this machine lacks is not passed
    env = [{"name": n, "valueFrom": {"secretKeyRef": {"name": k.env_from, "key": n, "optional": True}}}
           for n in plan.config.pass_env] if k.env_from else []
    container: dict = {"name": f"ray-{role}", "image": k.image or "<cluster.kuberay.image>",
                       "resources": {"limits": {k.gpu_resource: gpus}}}
    if env:
        container["env"] = env
    spec: dict = {"containers": [container]}
    if k.claim and k.mount_path:
        container["volumeMounts"] = [{"name": VOLUME, "mountPath": k.mount_path}]
        spec["volumes"] = [{"name": VOLUME, "persistentVolumeClaim": {"claimName": k.claim}}]
    return {"spec": spec}


def manifest(plan) -> dict:
    """The RayJob of one planned point."""
    import yaml

    from vrun.launch import rayjobs
    from vrun.rundir.records import run_id

    k, m = plan.config.cluster.kuberay, plan.mesh
    g = m.gpus_per_node
    cluster_spec: dict = {
        "rayVersion": rayjobs.here()["ray"],
        "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": str(g)},
                          "template": _pod(plan, "head", g)},
    }
    if m.nnodes > 1:
        n = m.nnodes - 1
        cluster_spec["workerGroupSpecs"] = [{"groupName": "gpu", "replicas": n, "minReplicas": n, "maxReplicas": n,
                                             "rayStartParams": {"num-gpus": str(g)},
                                             "template": _pod(plan, "worker", g)}]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": job_name(plan), "namespace": k.namespace,
                     "labels": {"app.kubernetes.io/managed-by": "vrun", "vrun/run-id": run_id(plan.run_dir)[:63]}},
        "spec": {
            "entrypoint": entrypoint(plan),
            "runtimeEnvYAML": yaml.safe_dump({"env_vars": rayjobs.job_env(plan)}, sort_keys=True),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": int(k.ttl_s),
            "activeDeadlineSeconds": int(plan.config.cluster.time_min) * 60,
            "submissionMode": "K8sJobMode",
            "rayClusterSpec": cluster_spec,
        },
    }


def _under(path: str, base: str) -> bool:
    import os

    p, b = os.path.normpath(os.path.abspath(path)), os.path.normpath(base)
    return p == b or p.startswith(b.rstrip("/") + "/")


def problems(plan) -> list[Problem]:
    """What the pods need, checked here: errors for a job that would be applied or checked (mode=train or
    preflight), warnings for a plan."""
    from vrun.config.schema import Mode

    k = plan.config.cluster.kuberay
    hard = plan.config.mode != Mode.plan
    out = []
    if not plan.entrypoint.uses_ray:
        return [Problem("cluster", "kuberay", "SFT runs under torchrun on every node, not as a Ray job",
                        "cluster=slurm (or cluster=local) for algo=sft")]
    if not isinstance(k.image, str) or not k.image.strip() or re.search(r"\s", k.image):
        out.append(Problem("cluster.kuberay.image", k.image, "the pods' image (it holds this project, verl, "
                           "verl_mlite and vLLM at the plan's stack; the job's entry checks it first)",
                           "cluster.kuberay.image=<registry>/<image>:<tag>", warning=not hard))
    for key, v, rule, what in (("cluster.kuberay.namespace", k.namespace, LABEL, "an RFC 1123 label"),
                               ("cluster.kuberay.claim", k.claim, SUBDOMAIN, "an RFC 1123 subdomain"),
                               ("cluster.kuberay.env_from", k.env_from, SUBDOMAIN, "an RFC 1123 subdomain")):
        if v is not None and (not isinstance(v, str) or len(v) > 253 or not rule.match(v)):
            out.append(Problem(key, v, f"a Kubernetes name: {what} (lower-case letters, digits, '-')",
                               f"{key}=<{what.split(' ')[-1]}>"))
    if not k.claim or not k.mount_path:
        missing = "cluster.kuberay.claim" if not k.claim else "cluster.kuberay.mount_path"
        out.append(Problem(missing, None, "the pods would not see the run dir (plan.json, verl_config.yaml) nor "
                           "keep its checkpoints and progress: a claim every pod mounts holds it",
                           "cluster.kuberay.claim=<a ReadWriteMany claim> cluster.kuberay.mount_path=<where this "
                           "machine has it mounted>", warning=not hard))
    elif not str(k.mount_path).startswith("/"):
        out.append(Problem("cluster.kuberay.mount_path", k.mount_path, "the claim's mount point in the pods: an "
                           "absolute path, the same as this machine's", "cluster.kuberay.mount_path=/<path>"))
    elif not _under(plan.run_dir, k.mount_path):
        out.append(Problem("hydra.run.dir", plan.run_dir, f"outside the claim's mount {k.mount_path}: the pods "
                           "would not find the plan nor keep the checkpoints", f"hydra.run.dir={k.mount_path}/<dir>"
                           f" (or hydra.sweep.dir=...)", warning=not hard))
    if plan.config.pass_env and not k.env_from:
        out.append(Problem("cluster.kuberay.env_from", None, f"pass_env names {', '.join(plan.config.pass_env)}: "
                           "the pods get them from a Secret by name (their values never enter the manifest); "
                           "without one they are unset in the job", "cluster.kuberay.env_from=<a Secret with those "
                           "keys> (a key it lacks stays unset)", warning=True))
    if isinstance(k.ttl_s, bool) or not isinstance(k.ttl_s, int) or not 0 <= k.ttl_s <= 7 * 86400:
        out.append(Problem("cluster.kuberay.ttl_s", k.ttl_s, "seconds the finished job's cluster is kept: a whole "
                           "number in [0, 604800]", "cluster.kuberay.ttl_s=600"))
    if k.mount_path and plan.model_path and str(plan.model_path).startswith("/") and \
            not _under(str(plan.model_path), k.mount_path):
        out.append(Problem("model.path", plan.model_path, f"outside the claim's mount {k.mount_path}: the pods see "
                           "only their image and the claim", f"a checkpoint under {k.mount_path}, or in the image "
                           "at that path", warning=True))
    return out


def schema_problems(doc: dict) -> list[Problem]:
    from vrun.launch import kuberay_schema

    return [Problem("cluster.kuberay", "manifest", f"{line} ({kuberay_schema.RELEASE})", "report it: the project "
                    "writes a field its schema of the RayJob API does not hold") for line in kuberay_schema.check(doc)]


def apply(path: Path, namespace: str) -> tuple[bool, str]:
    """kubectl apply -f path: (applied, kubectl's last line)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return False, "kubectl is not on PATH"
    try:
        p = subprocess.run([kubectl, "apply", "-n", namespace, "-f", str(path)], capture_output=True, text=True,
                           timeout=KUBECTL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"kubectl apply did not answer within {KUBECTL_TIMEOUT_S} s"
    last = ((p.stdout if p.returncode == 0 else p.stderr) or p.stdout or "").strip().splitlines()
    return p.returncode == 0, (last[-1] if last else f"kubectl exited {p.returncode}")


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
        docs[point.idx] = manifest(p)
        found = problems(p) + schema_problems(docs[point.idx])
        return found + (rayjobs.login_problems(p) if p.config.mode != Mode.plan else [])

    planned.verdict(sweep, check, "refused before the manifest was written; nothing was applied")
    for point in sweep.points:
        doc = docs[point.idx]
        planned.write(point)
        path = Path(point.plan.run_dir) / MANIFEST
        writer.write_text(path, yaml.safe_dump(doc, sort_keys=False), root=point.plan.run_dir)
        p, k = point.plan, point.plan.config.cluster.kuberay
        if p.config.mode != Mode.train or not k.apply:
            how = "plan only" if p.config.mode == Mode.plan else ("preflight: all checks passed here"
                                                                   if p.config.mode == Mode.preflight else "train")
            print(f"{how}: RayJob {doc['metadata']['name']} in {path}; kubectl apply -n {k.namespace} -f {path} "
                  "starts it", flush=True)
            continue
        ok, said = apply(path, k.namespace)
        if not ok:
            cli_errors.emit([Problem("cluster.kuberay.apply", True, f"{said}; the manifest is in {path}, nothing was "
                                     "applied", f"kubectl apply -n {k.namespace} -f {path} where kubectl reaches "
                                     "the cluster, or cluster.kuberay.apply=false").line()])
        rundir.record(p.run_dir, "submitted", attempt=0, cluster="kuberay", rayjob=doc["metadata"]["name"])
        print(f"applied RayJob {doc['metadata']['name']} ({said}); kubectl get rayjob -n {k.namespace} "
              f"{doc['metadata']['name']}", flush=True)
    return []

"""The fields of KubeRay's RayJob API (ray.io/v1) that cluster=kuberay writes, at one pinned operator release: each
with its type and the file of the operator's API that defines it. `check(doc)` names every field of a manifest
that is not here or not of its type: the manifest vrun/launch/kuberay.py renders is checked before it is written.

Types: string, integer, boolean, object (a struct: its fields listed here), map (string keys, string values),
quantity (Kubernetes int-or-string), array (its items under `path[]`). A PodTemplateSpec is core/v1's, embedded
by the CRD: only the paths the project writes are listed.
"""
from __future__ import annotations

from typing import Any

RELEASE = "KubeRay v1.4.2"
RAYJOB = "ray-operator/apis/ray/v1/rayjob_types.go"
RAYCLUSTER = "ray-operator/apis/ray/v1/raycluster_types.go"
CRD = "ray-operator/config/crd/bases/ray.io_rayjobs.yaml"
KINDS = ("string", "integer", "boolean", "object", "map", "quantity", "array")

# the submission modes RayJobSpec.SubmissionMode takes (JobSubmissionMode)
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode")


def _pod(prefix: str) -> dict:
    """The PodTemplateSpec paths the project writes (core/v1, embedded in the CRD)."""
    return {
        prefix: ("object", CRD),
        f"{prefix}.spec": ("object", CRD),
        f"{prefix}.spec.containers": ("array", CRD),
        f"{prefix}.spec.containers[]": ("object", CRD),
        f"{prefix}.spec.containers[].name": ("string", CRD),
        f"{prefix}.spec.containers[].image": ("string", CRD),
        f"{prefix}.spec.containers[].resources": ("object", CRD),
        f"{prefix}.spec.containers[].resources.limits": ("quantity", CRD),
        f"{prefix}.spec.containers[].env": ("array", CRD),
        f"{prefix}.spec.containers[].env[]": ("object", CRD),
        f"{prefix}.spec.containers[].env[].name": ("string", CRD),
        f"{prefix}.spec.containers[].env[].value": ("string", CRD),
        f"{prefix}.spec.containers[].env[].valueFrom": ("object", CRD),
        f"{prefix}.spec.containers[].env[].valueFrom.secretKeyRef": ("object", CRD),
        f"{prefix}.spec.containers[].env[].valueFrom.secretKeyRef.name": ("string", CRD),
        f"{prefix}.spec.containers[].env[].valueFrom.secretKeyRef.key": ("string", CRD),
        f"{prefix}.spec.containers[].env[].valueFrom.secretKeyRef.optional": ("boolean", CRD),
        f"{prefix}.spec.containers[].volumeMounts": ("array", CRD),
        f"{prefix}.spec.containers[].volumeMounts[]": ("object", CRD),
        f"{prefix}.spec.containers[].volumeMounts[].name": ("string", CRD),
        f"{prefix}.spec.containers[].volumeMounts[].mountPath": ("string", CRD),
        f"{prefix}.spec.volumes": ("array", CRD),
        f"{prefix}.spec.volumes[]": ("object", CRD),
        f"{prefix}.spec.volumes[].name": ("string", CRD),
        f"{prefix}.spec.volumes[].persistentVolumeClaim": ("object", CRD),
        f"{prefix}.spec.volumes[].persistentVolumeClaim.claimName": ("string", CRD),
    }


FIELDS: dict[str, tuple[str, str]] = {
    "apiVersion": ("string", CRD),
    "kind": ("string", CRD),
    "metadata": ("object", CRD),
    "metadata.name": ("string", CRD),
    "metadata.namespace": ("string", CRD),
    "metadata.labels": ("map", CRD),
    "spec": ("object", RAYJOB),
    "spec.entrypoint": ("string", RAYJOB),
    "spec.runtimeEnvYAML": ("string", RAYJOB),
    "spec.shutdownAfterJobFinishes": ("boolean", RAYJOB),
    "spec.ttlSecondsAfterFinished": ("integer", RAYJOB),
    "spec.activeDeadlineSeconds": ("integer", RAYJOB),
    "spec.submissionMode": ("string", RAYJOB),
    "spec.rayClusterSpec": ("object", RAYJOB),
    "spec.rayClusterSpec.rayVersion": ("string", RAYCLUSTER),
    "spec.rayClusterSpec.headGroupSpec": ("object", RAYCLUSTER),
    "spec.rayClusterSpec.headGroupSpec.rayStartParams": ("map", RAYCLUSTER),
    **_pod("spec.rayClusterSpec.headGroupSpec.template"),
    "spec.rayClusterSpec.workerGroupSpecs": ("array", RAYCLUSTER),
    "spec.rayClusterSpec.workerGroupSpecs[]": ("object", RAYCLUSTER),
    "spec.rayClusterSpec.workerGroupSpecs[].groupName": ("string", RAYCLUSTER),
    "spec.rayClusterSpec.workerGroupSpecs[].replicas": ("integer", RAYCLUSTER),
    "spec.rayClusterSpec.workerGroupSpecs[].minReplicas": ("integer", RAYCLUSTER),
    "spec.rayClusterSpec.workerGroupSpecs[].maxReplicas": ("integer", RAYCLUSTER),
    "spec.rayClusterSpec.workerGroupSpecs[].rayStartParams": ("map", RAYCLUSTER),
    **_pod("spec.rayClusterSpec.workerGroupSpecs[].template"),
}

# values the API constrains beyond their type
ENUMS = {"apiVersion": ("ray.io/v1",), "kind": ("RayJob",), "spec.submissionMode": SUBMISSION_MODES}
REQUIRED = ("apiVersion", "kind", "metadata.name", "spec")
INT32 = 2 ** 31 - 1


def _kind_ok(kind: str, v: Any) -> bool:
    if kind == "string":
        return isinstance(v, str)
    if kind == "integer":
        return isinstance(v, int) and not isinstance(v, bool) and -INT32 - 1 <= v <= INT32
    if kind == "boolean":
        return isinstance(v, bool)
    if kind == "object":
        return isinstance(v, dict)
    if kind == "array":
        return isinstance(v, list)
    if kind == "map":
        return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())
    if kind == "quantity":
        return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, (int, str)) and
                                           not isinstance(x, bool) for k, x in v.items())
    return False


def check(doc: Any) -> list[str]:
    """Every field of `doc` not in FIELDS or not of its type, every enum value outside its set, every required
    field missing: one line each (none: the manifest is the API's)."""
    out: list[str] = []

    def walk(path: str, v: Any) -> None:
        spec = FIELDS.get(path)
        if spec is None:
            out.append(f"{path}: not a field of the RayJob API the project writes")
            return
        kind = spec[0]
        if not _kind_ok(kind, v):
            out.append(f"{path}: {type(v).__name__} {str(v)[:40]!r} where the API has {kind}")
            return
        if path in ENUMS and v not in ENUMS[path]:
            out.append(f"{path}: {v!r} is not one of {', '.join(ENUMS[path])}")
        if kind == "object":
            for k, x in v.items():
                walk(f"{path}.{k}" if path else str(k), x)
        elif kind == "array":
            for x in v:
                walk(f"{path}[]", x)

    if not isinstance(doc, dict):
        return ["the manifest is not an object"]
    for k, x in doc.items():
        walk(str(k), x)
    for path in REQUIRED:
        node: Any = doc
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node in (None, ""):
            out.append(f"{path}: required by the API, missing")
    return out

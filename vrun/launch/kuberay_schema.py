"""The fields of KubeRay's RayJob API (ray.io/v1) that cluster=kuberay writes, at one pinned operator release, each
with its type and where that release defines it: the generated CRD's openAPIV3Schema
(ray-operator/config/crd/bases/ray.io_rayjobs.yaml, by line), and for the rules the schema does not carry, the
operator's own validation (ray-operator/controllers/ray/utils/validation.go) and Go types
(ray-operator/apis/ray/v1/rayjob_types.go). `check(doc)` names every field of a manifest that is not here, not of
its type, missing where required, or against one of those rules: the manifest vrun/launch/kuberay.py renders is
checked before it is written.

Types: string, integer (int32), boolean, object (its fields listed here), map (string values: the CRD's
`additionalProperties: {type: string}`), quantity (a map of int-or-string: resources.limits), array (its items
under `path[]`). The pod templates are core/v1 PodTemplateSpecs the CRD writes out in full: only the paths the
project writes are listed, head and worker apart (their schemas sit at different lines).
"""
from __future__ import annotations

import re
from typing import Any

RELEASE = "KubeRay v1.4.2"  # tag v1.4.2, commit 34ea80e0f51f
# the CRD's openAPIV3Schema at that tag, as data, for the tests' validation (tests/test_kuberay_crd.py)
PUBLISHED = "tests/support/kuberay/rayjob-v1.4.2-openapi.json"
CRD = "ray-operator/config/crd/bases/ray.io_rayjobs.yaml"
RAYJOB = "ray-operator/apis/ray/v1/rayjob_types.go"
VALIDATION = "ray-operator/controllers/ray/utils/validation.go"
KINDS = ("string", "integer", "boolean", "object", "map", "quantity", "array")

# the pod template's paths: (type, line in the head's schema, line in the worker's)
_POD = {
    "": ("object", 666, 4390),
    ".spec": ("object", 687, 4411),
    ".spec.containers": ("array", 1133, 4857),
    ".spec.containers[]": ("object", 1133, 4857),
    ".spec.containers[].name": ("string", 1451, 5175),
    ".spec.containers[].image": ("string", 1241, 4965),
    ".spec.containers[].resources": ("object", 1571, 5295),
    ".spec.containers[].resources.limits": ("quantity", 1587, 5311),
    ".spec.containers[].resources.requests": ("quantity", 1595, 5319),
    ".spec.containers[].env": ("array", 1146, 4870),
    ".spec.containers[].env[]": ("object", 1146, 4870),
    ".spec.containers[].env[].name": ("string", 1149, 4873),
    ".spec.containers[].env[].value": ("string", 1151, 4875),
    ".spec.containers[].env[].valueFrom": ("object", 1153, 4877),
    ".spec.containers[].env[].valueFrom.secretKeyRef": ("object", 1194, 4918),
    ".spec.containers[].env[].valueFrom.secretKeyRef.name": ("string", 1198, 4922),
    ".spec.containers[].env[].valueFrom.secretKeyRef.key": ("string", 1196, 4920),
    ".spec.containers[].env[].valueFrom.secretKeyRef.optional": ("boolean", 1201, 4925),
    ".spec.containers[].volumeMounts": ("array", 1784, 5508),
    ".spec.containers[].volumeMounts[]": ("object", 1784, 5508),
    ".spec.containers[].volumeMounts[].name": ("string", 1791, 5515),
    ".spec.containers[].volumeMounts[].mountPath": ("string", 1787, 5511),
    ".spec.securityContext": ("object", 3362, 7086),
    ".spec.securityContext.runAsUser": ("integer", 3383, 7107),
    ".spec.securityContext.runAsGroup": ("integer", 3378, 7102),
    ".spec.securityContext.fsGroup": ("integer", 3373, 7097),
    ".spec.volumes": ("array", 3529, 7253),
    ".spec.volumes[]": ("object", 3529, 7253),
    ".spec.volumes[].name": ("string", 3983, 7707),
    ".spec.volumes[].persistentVolumeClaim": ("object", 3997, 7721),
    ".spec.volumes[].persistentVolumeClaim.claimName": ("string", 3999, 7723),
}
HEAD = "spec.rayClusterSpec.headGroupSpec.template"
WORKER = "spec.rayClusterSpec.workerGroupSpecs[].template"

FIELDS: dict[str, tuple[str, str]] = {
    "apiVersion": ("string", f"{CRD}:42"),
    "kind": ("string", f"{CRD}:44"),
    # ObjectMeta: the CRD has `metadata: {type: object}`; the API server reads the rest
    "metadata": ("object", f"{CRD}:46"),
    "metadata.name": ("string", f"{VALIDATION}:129"),
    "metadata.namespace": ("string", f"{CRD}:46"),
    "metadata.labels": ("map", f"{CRD}:46"),
    "spec": ("object", f"{CRD}:48"),
    "spec.entrypoint": ("string", f"{CRD}:67"),
    "spec.runtimeEnvYAML": ("string", f"{CRD}:8068"),
    "spec.shutdownAfterJobFinishes": ("boolean", f"{CRD}:8070"),
    "spec.ttlSecondsAfterFinished": ("integer", f"{CRD}:11751"),
    "spec.activeDeadlineSeconds": ("integer", f"{CRD}:50"),
    "spec.submissionMode": ("string", f"{CRD}:8072"),
    "spec.rayClusterSpec": ("object", f"{CRD}:89"),
    "spec.rayClusterSpec.rayVersion": ("string", f"{CRD}:4349"),
    "spec.rayClusterSpec.headGroupSpec": ("object", f"{CRD}:461"),
    "spec.rayClusterSpec.headGroupSpec.rayStartParams": ("map", f"{CRD}:660"),
    "spec.rayClusterSpec.workerGroupSpecs": ("array", f"{CRD}:4353"),
    "spec.rayClusterSpec.workerGroupSpecs[]": ("object", f"{CRD}:4353"),
    "spec.rayClusterSpec.workerGroupSpecs[].groupName": ("string", f"{CRD}:4356"),
    "spec.rayClusterSpec.workerGroupSpecs[].replicas": ("integer", f"{CRD}:4377"),
    "spec.rayClusterSpec.workerGroupSpecs[].minReplicas": ("integer", f"{CRD}:4365"),
    "spec.rayClusterSpec.workerGroupSpecs[].maxReplicas": ("integer", f"{CRD}:4361"),
    "spec.rayClusterSpec.workerGroupSpecs[].rayStartParams": ("map", f"{CRD}:4373"),
    **{HEAD + sub: (kind, f"{CRD}:{head}") for sub, (kind, head, _) in _POD.items()},
    **{WORKER + sub: (kind, f"{CRD}:{worker}") for sub, (kind, _, worker) in _POD.items()},
}

# an object's children the CRD lists as required (minReplicas/maxReplicas have defaults the API server fills)
REQUIRED = {
    "": ("apiVersion", "kind", "metadata"),
    "metadata": ("name",),
    "spec.rayClusterSpec": ("headGroupSpec",),
    "spec.rayClusterSpec.headGroupSpec": ("template",),
    "spec.rayClusterSpec.workerGroupSpecs[]": ("groupName", "template"),
    **{f"{t}.spec": ("containers",) for t in (HEAD, WORKER)},
    **{f"{t}.spec.containers[]": ("name",) for t in (HEAD, WORKER)},
    **{f"{t}.spec.containers[].env[]": ("name",) for t in (HEAD, WORKER)},
    **{f"{t}.spec.containers[].env[].valueFrom.secretKeyRef": ("key",) for t in (HEAD, WORKER)},
    **{f"{t}.spec.containers[].volumeMounts[]": ("name", "mountPath") for t in (HEAD, WORKER)},
    **{f"{t}.spec.volumes[]": ("name",) for t in (HEAD, WORKER)},
    **{f"{t}.spec.volumes[].persistentVolumeClaim": ("claimName",) for t in (HEAD, WORKER)},
}
# values fixed by the API: the group/version and kind the API server serves; the submission modes are the Go
# constants of JobSubmissionMode (the CRD has no enum; the operator acts on these three)
ENUMS = {"apiVersion": ("ray.io/v1",), "kind": ("RayJob",),
         "spec.submissionMode": ("K8sJobMode", "HTTPMode", "InteractiveMode")}
SUBMISSION_MODES_SOURCE = f"{RAYJOB}:79"
# the operator's name rule (validation.go:129-136): a DNS-1035 label of at most 47 characters
NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")
NAME_MAX = 47
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
    """Every field of `doc` not in FIELDS or not of its type, every required child missing, every value outside
    its set, and the operator's own rules (its name; a TTL only with shutdown; a deadline above 0; runtimeEnvYAML
    that parses): one line each (none: the manifest is the API's)."""
    import yaml

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
            required(path, v)
            for k, x in v.items():
                walk(f"{path}.{k}", x)
        elif kind == "array":
            for x in v:
                walk(f"{path}[]", x)

    def required(path: str, v: dict) -> None:
        for child in REQUIRED.get(path, ()):
            if v.get(child) in (None, ""):
                out.append(f"{path + '.' if path else ''}{child}: required by the API, missing")

    if not isinstance(doc, dict):
        return ["the manifest is not an object"]
    required("", doc)
    for k, x in doc.items():
        walk(str(k), x)
    name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
    if isinstance(name, str) and (len(name) > NAME_MAX or not NAME.match(name)):
        out.append(f"metadata.name: {name!r} is not a DNS-1035 label of at most {NAME_MAX} characters")
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    ttl = spec.get("ttlSecondsAfterFinished")
    if isinstance(ttl, int) and (ttl < 0 or (ttl > 0 and spec.get("shutdownAfterJobFinishes") is not True)):
        out.append("spec.ttlSecondsAfterFinished: negative, or above 0 without shutdownAfterJobFinishes")
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline <= 0:
        out.append("spec.activeDeadlineSeconds: must be above 0")
    if isinstance(spec.get("runtimeEnvYAML"), str):
        try:
            yaml.safe_load(spec["runtimeEnvYAML"])
        except yaml.YAMLError:
            out.append("spec.runtimeEnvYAML: does not parse as YAML")
    return out


# ==================================================================== the names the project writes, by their grammars
# Kubernetes' names (k8s.io/apimachinery validation): an RFC 1123 label (namespaces, volume names) of at most 63
# characters, a subdomain (claims, Secrets) of at most 253; a qualified name (a resource's) is an optional subdomain
# prefix and '/', then at most 63 of [A-Za-z0-9._-] starting and ending alphanumeric
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
LABEL_MAX = 63
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
SUBDOMAIN_MAX = 253
QUALIFIED = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
# a container image reference (the distribution project's grammar): [host[:port]/]path[:tag][@algorithm:hex]; the
# path's components lower-case alphanumerics joined by '.', '_', '__' or dashes; the whole name at most 255
# characters, a tag at most 128
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE = re.compile(rf"(?P<name>(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*)"
                   r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
                   r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?\Z")
IMAGE_NAME_MAX = 255
IMAGE_MAX = 512  # a name (255), a tag (128) and a sha512 digest (135) fit


def name_why(value, kind: str) -> str:
    """Why `value` is not a Kubernetes name of `kind` ("label" or "subdomain"); "" when it is one."""
    rule, most = (LABEL, LABEL_MAX) if kind == "label" else (SUBDOMAIN, SUBDOMAIN_MAX)
    if not isinstance(value, str) or not value:
        return f"not a name: an RFC 1123 {kind} is lower-case letters, digits and '-'"
    if len(value) > most:
        return f"{len(value)} characters: an RFC 1123 {kind} has at most {most}"
    if not rule.match(value):
        return (f"not an RFC 1123 {kind}: lower-case letters, digits and '-'" + (", '.' between labels" if kind ==
                "subdomain" else "") + ", starting and ending with a letter or digit")
    return ""


def image_why(value) -> str:
    """Why `value` is not a container image reference; "" when it is one (a registry's own rules may be stricter)."""
    if not isinstance(value, str) or not value.strip():
        return "no image"
    if len(value) > IMAGE_MAX:
        return f"{len(value)} characters: an image reference is a name of at most {IMAGE_NAME_MAX}, a tag and a digest"
    m = IMAGE.match(value)
    if m is None:
        return ("not an image reference: [registry[:port]/]path[:tag][@sha256:<hex>], the path's parts lower-case "
                "letters and digits joined by '.', '_' or '-', no spaces or quotes")
    if len(m.group("name")) > IMAGE_NAME_MAX:
        return f"a repository name of {len(m.group('name'))} characters: at most {IMAGE_NAME_MAX}"
    return ""


def resource_why(value) -> str:
    """Why `value` is not an extended resource's name (a pod's GPU: `<domain>/<name>`, e.g. nvidia.com/gpu,
    amd.com/gpu): a qualified name whose prefix is a domain outside kubernetes.io; "" when it is one."""
    if not isinstance(value, str) or value.count("/") != 1:
        return "not an extended resource name: <domain>/<name>, e.g. nvidia.com/gpu"
    domain, name = value.split("/")
    if name_why(domain, "subdomain"):
        return f"its domain {domain!r} is not an RFC 1123 subdomain"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return "the kubernetes.io domain holds Kubernetes' own resources, not a device's"
    if len(name) > LABEL_MAX or not QUALIFIED.match(name):
        return f"its name {name!r} is not a qualified name (at most 63 of letters, digits, '-', '_', '.')"
    return ""

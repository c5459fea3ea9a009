"""The RayJob manifests cluster=kuberay writes, validated against the schema KubeRay publishes, not a retyped one.

tests/support/kuberay/rayjob-v1.4.2-openapi.json is the `openAPIV3Schema` of the v1 version in KubeRay's
ray-operator/config/crd/bases/ray.io_rayjobs.yaml at tag v1.4.2 (commit 34ea80e0f51f, the file's sha256 in the
data's `source`), converted from YAML to JSON with every `description` dropped, nothing else changed. The API
server's structural validation is applied here as Kubernetes applies it to a custom resource: types and formats,
properties (a field the schema does not hold is an error here, where the API server would silently prune it and
the pods would lack it), required children, enums, patterns, int-or-string quantities, minimum and lengths; the
CEL rules (x-kubernetes-validations) are on fields the project never writes. No Kubernetes API server exists
here: this is the schema it would apply.
"""
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, runner
from vrun.launch import kuberay_schema

pytestmark = pytest.mark.stack_free

DATA = Path(ROOT) / kuberay_schema.PUBLISHED
INT = {"int32": 2 ** 31 - 1, "int64": 2 ** 63 - 1}


@pytest.fixture(scope="module")
def schema():
    data = json.loads(DATA.read_text())
    assert data["source"]["tag"] == "v1.4.2" and data["source"]["commit"].startswith("34ea80e0f51f")
    return data["openAPIV3Schema"]


def validate(s: dict, v, path: str = "") -> list:
    """Every place `v` breaks the structural schema `s`, one line each."""
    out = []
    if v is None:
        return [] if s.get("nullable") else [f"{path}: null"]
    if s.get("x-kubernetes-int-or-string"):
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            return [f"{path}: {v!r} is neither an integer nor a string"]
        if isinstance(v, str) and "pattern" in s and not re.search(s["pattern"], v):
            out.append(f"{path}: {v!r} does not match {s['pattern']}")
        return out
    t = s.get("type")
    checks = {"object": lambda x: isinstance(x, dict), "array": lambda x: isinstance(x, list),
              "string": lambda x: isinstance(x, str), "boolean": lambda x: isinstance(x, bool),
              "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
              "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)}
    if t and not checks[t](v):
        return [f"{path}: {type(v).__name__} where the schema has {t}"]
    if t == "integer" and s.get("format") in INT and not -INT[s["format"]] - 1 <= v <= INT[s["format"]]:
        out.append(f"{path}: {v} outside {s['format']}")
    if "minimum" in s and isinstance(v, (int, float)) and v < s["minimum"]:
        out.append(f"{path}: {v} below {s['minimum']}")
    if "enum" in s and v not in s["enum"]:
        out.append(f"{path}: {v!r} not one of {s['enum']}")
    if isinstance(v, str):
        if "pattern" in s and not re.search(s["pattern"], v):
            out.append(f"{path}: {v!r} does not match {s['pattern']}")
        if len(v) > s.get("maxLength", len(v)) or len(v) < s.get("minLength", 0):
            out.append(f"{path}: length {len(v)} outside the schema's")
    if isinstance(v, dict):
        props, extra = s.get("properties"), s.get("additionalProperties")
        for req in s.get("required", []):
            if req not in v:
                out.append(f"{path}.{req}: required, missing")
        for k, x in v.items():
            if props is not None and k in props:
                out += validate(props[k], x, f"{path}.{k}")
            elif isinstance(extra, dict):
                out += validate(extra, x, f"{path}.{k}")
            elif props is not None or extra is False:
                if not s.get("x-kubernetes-preserve-unknown-fields"):
                    out.append(f"{path}.{k}: not in the schema")
    if isinstance(v, list) and "items" in s:
        for i, x in enumerate(v):
            out += validate(s["items"], x, f"{path}[{i}]")
    return out


def _plan(tmp_path, *overrides):
    mount = tmp_path / "claim"
    mount.mkdir(exist_ok=True)
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.endswith("MODEL_PATH")}
    env["HOME"] = str(tmp_path / "home")
    return runner("cluster=kuberay", "mode=plan", "cluster.kuberay.image=registry.example:5000/ml/verl:0.9.1-py312",
                  "cluster.kuberay.claim=runs", f"cluster.kuberay.mount_path={mount}", f"hydra.run.dir={mount}/r",
                  "run.allow_memory_overrun=true", *overrides, env=env, cwd=tmp_path)


def test_the_validator_catches_what_the_api_server_refuses(schema):
    """The validator is not a formality: a wrong type, an unknown field, a missing required child, a bad
    quantity and an out-of-range int32 are each named."""
    doc = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "x"},
           "spec": {"entrypoint": 3, "suspendd": True, "activeDeadlineSeconds": 2 ** 31,
                    "rayClusterSpec": {"headGroupSpec": {"template": {"spec": {"containers": [
                        {"image": "i", "resources": {"limits": {"memory": "12 GiB"}}}]}}}}}}
    found = "\n".join(validate(schema, doc))
    for needle in ("spec.entrypoint: int", "spec.suspendd: not in the schema", "activeDeadlineSeconds: 2147483648",
                   "containers[0].name: required", "'12 GiB' does not match"):
        assert needle in found, (needle, found)


@pytest.mark.parametrize("model,extra", [
    ("qwen3_5_35b", []),
    ("glm5_1", ["pass_env=[WANDB_API_KEY]", "cluster.kuberay.env_from=train-keys", "cluster.kuberay.run_as_uid=4242",
                "cluster.kuberay.run_as_gid=4343", "cluster.cpus_per_task=96", "cluster.mem_gb=1800"]),
    ("kimi_k2_6", ["cluster.kuberay.gpu_resource=amd.com/gpu", "cluster.kuberay.namespace=" + "n" * 63]),
])
def test_manifests_validate_against_the_published_crd(tmp_path, schema, model, extra):
    proc = _plan(tmp_path, f"model={model}", *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = yaml.safe_load((tmp_path / "claim" / "r" / "rayjob.yaml").read_text())
    assert validate(schema, doc) == []
    assert kuberay_schema.check(doc) == []


def test_every_field_the_project_lists_is_the_published_schemas(schema):
    """kuberay_schema.FIELDS (the launcher's own check) holds only paths the published schema has, of its type
    (metadata's are Kubernetes' ObjectMeta, which the CRD leaves to the API server)."""
    kinds = {"string": {"string"}, "integer": {"integer"}, "boolean": {"boolean"}, "object": {"object"},
             "map": {"object"}, "array": {"array"}, "quantity": {"object"}}
    for path, (kind, _) in kuberay_schema.FIELDS.items():
        if path.startswith("metadata."):  # ObjectMeta: the API server's own, `metadata: {type: object}` in the CRD
            continue
        s = schema
        for part in path.replace("[]", ".[]").split("."):
            if part == "[]":
                s = s["items"]
            elif part:
                assert part in s.get("properties", {}), (path, part)
                s = s["properties"][part]
        assert s.get("type") in kinds[kind], (path, kind, s.get("type"))

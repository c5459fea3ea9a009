"""cluster=kuberay: the plan as a RayJob manifest a KubeRay operator takes.

Through the real command line: the manifest written into the run dir for every model at its mesh, each field
checked against the project's schema of the RayJob API at its pinned KubeRay release (vrun/launch/kuberay_schema.py),
the head and worker groups sized from the mesh with the GPUs in each pod's limits, the entry the other clusters run,
secrets by name only; the refusals before anything is written (no image, no claim, a run dir off the claim, SFT,
pass_env without a Secret, Kubernetes names); and kubectl apply where cluster.kuberay.apply=true.

No Kubernetes cluster exists here: `kubectl` in the apply test is a stand-in script on PATH that records its
arguments and checks the file parses; users' kubectl applies the same file.
"""
import json
import os
import stat

import pytest
import yaml

from conftest import runner
from vrun.launch import kuberay_schema

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

SECRET = "kuberay-secret-value-4711"


def _env(tmp_path, **extra):
    e = {k: v for k, v in os.environ.items() if not k.endswith("MODEL_PATH")}
    e.update(HOME=str(tmp_path / "home"), WANDB_API_KEY=SECRET, **extra)
    return e


def _plan(tmp_path, *overrides, mode="plan", env=None):
    mount = tmp_path / "claim"
    mount.mkdir(exist_ok=True)
    (tmp_path / "home").mkdir(exist_ok=True)
    args = ["cluster=kuberay", f"mode={mode}", "cluster.kuberay.image=registry.example/verl:1", "cluster.kuberay.claim=runs",
            f"cluster.kuberay.mount_path={mount}", *overrides]
    if not any(a.startswith(("hydra.run.dir", "hydra.sweep.dir")) for a in overrides):
        args.append(f"hydra.run.dir={mount}/r")
    return runner(*args, env=env or _env(tmp_path), cwd=tmp_path)


# DeepSeek-V4-Pro's rollout replica at its launcher's TP8 does not hold vLLM's weights: the plan's own fix
ROLLOUT = {"deepseek_v4_pro": ["verl.actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                               "verl.actor_rollout_ref.rollout.data_parallel_size=16"]}


@pytest.mark.parametrize("model", ["glm5_1", "kimi_k2_6", "qwen3_5_35b", "deepseek_v4_flash", "deepseek_v4_pro"])
def test_every_models_manifest_matches_the_pinned_schema(tmp_path, model):
    proc = _plan(tmp_path, f"model={model}", "run.allow_memory_overrun=true", *ROLLOUT.get(model, []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "claim" / "r"
    doc = yaml.safe_load((run / "rayjob.yaml").read_text())
    assert kuberay_schema.check(doc) == []
    plan = json.loads((run / "plan.json").read_text())
    nodes, gpus = plan["mesh"]["nnodes"], plan["mesh"]["gpus_per_node"]
    spec = doc["spec"]["rayClusterSpec"]
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["resources"]["limits"]["nvidia.com/gpu"] == gpus and head["image"] == "registry.example/verl:1"
    workers = spec.get("workerGroupSpecs", [])
    assert sum(w["replicas"] for w in workers) == nodes - 1 and all(w["minReplicas"] == w["maxReplicas"] ==
                                                                    w["replicas"] for w in workers)
    for w in workers:
        assert w["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert w["rayStartParams"]["num-gpus"] == str(gpus)
    for pod in [spec["headGroupSpec"]["template"]] + [w["template"] for w in workers]:
        (mount,) = pod["spec"]["containers"][0]["volumeMounts"]
        assert mount["mountPath"] == str(tmp_path / "claim")
        assert pod["spec"]["volumes"] == [{"name": mount["name"], "persistentVolumeClaim": {"claimName": "runs"}}]
    assert doc["spec"]["entrypoint"].startswith("python -m vrun.launch.entry ppo --config ")
    assert f"{run}/verl_config.yaml" in doc["spec"]["entrypoint"]
    env_vars = yaml.safe_load(doc["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env_vars["VRUN_RUN_ID"] and env_vars["WANDB_RUN_ID"] == f"vrun-{env_vars['VRUN_RUN_ID']}"
    assert env_vars["WANDB_RESUME"] == "allow"
    assert doc["spec"]["activeDeadlineSeconds"] == 240 * 60 and doc["spec"]["submissionMode"] == "K8sJobMode"
    assert len(doc["metadata"]["name"]) <= 47 and doc["metadata"]["namespace"] == "default"
    assert SECRET not in (run / "rayjob.yaml").read_text()


def test_secrets_by_name_from_a_secret(tmp_path):
    proc = _plan(tmp_path, "model=qwen3_5_35b", "pass_env=[WANDB_API_KEY]", "cluster.kuberay.env_from=train-keys")
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (tmp_path / "claim" / "r" / "rayjob.yaml").read_text()
    doc = yaml.safe_load(text)
    env = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "train-keys",
                                                                            "key": "WANDB_API_KEY", "optional": True}}}]
    assert "--pass-env WANDB_API_KEY" in doc["spec"]["entrypoint"] and SECRET not in text
    assert kuberay_schema.check(doc) == []
    # without a Secret: said, naming the variables, and none of them in the pods
    proc = _plan(tmp_path, "model=qwen3_5_35b", "pass_env=[WANDB_API_KEY]", "hydra.run.dir=" + str(tmp_path / "claim" / "r2"))
    assert proc.returncode == 0 and "warning: cluster.kuberay.env_from=null: pass_env names WANDB_API_KEY" in \
        proc.stderr + proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("overrides,key,text", [
    (["cluster.kuberay.image=null"], "cluster.kuberay.image", "the pods' image"),
    (["cluster.kuberay.claim=null"], "cluster.kuberay.claim", "would not see the run dir"),
    (["cluster.kuberay.claim=Runs_1"], "cluster.kuberay.claim", "RFC 1123"),
    (["cluster.kuberay.namespace=Prod"], "cluster.kuberay.namespace", "RFC 1123"),
    (["cluster.kuberay.mount_path=rel/dir"], "cluster.kuberay.mount_path", "absolute"),
    (["cluster.kuberay.ttl_s=-1"], "cluster.kuberay.ttl_s", "[0, 604800]"),
    (["algo=sft", "mesh=8gpu"], "cluster", "torchrun"),
    (["OFFCLAIM"], "hydra.run.dir", "outside the claim's mount"),
])
def test_refused_before_anything_is_written(tmp_path, overrides, key, text):
    run = tmp_path / "claim" / "r"
    overrides = [f"hydra.run.dir={tmp_path}/elsewhere" if o == "OFFCLAIM" else o for o in overrides]
    proc = _plan(tmp_path, "model=qwen3_5_35b", *overrides, mode="train")
    errors = [line for line in proc.stderr.splitlines() if "error: " in line]
    assert proc.returncode == 2 and errors and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    first = errors[0][errors[0].index("error: "):]
    assert first.startswith(f"error: {key}=") and text in first and "; fix: " in first, first
    assert not run.exists() and not (tmp_path / "elsewhere").exists()
    assert SECRET not in proc.stdout + proc.stderr


def test_applied_with_kubectl_when_asked(tmp_path, monkeypatch):
    """`kubectl apply -n <namespace> -f <run dir>/rayjob.yaml` on the plan's own manifest (kubectl here is a
    stand-in on PATH recording its arguments and parsing the file); a kubectl that refuses is its last line; none
    on PATH is one line. (cluster.kuberay.apply=true applies in mode=train once its login preflight passed, which
    needs verl_mlite and vLLM importable: not on this machine, where mode=train is refused before the apply.)"""
    from pathlib import Path

    from vrun.launch import kuberay

    proc = _plan(tmp_path, "model=qwen3_5_35b", "cluster.kuberay.namespace=ml")
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = Path(tmp_path / "claim" / "r" / "rayjob.yaml")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "kubectl.log"
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f"""#!/bin/sh
echo "$@" >> {log}
for f; do :; done
{os.sys.executable} -c "import sys, yaml; assert yaml.safe_load(open(sys.argv[1]))['kind'] == 'RayJob'" "$f" || exit 3
[ -n "$KUBECTL_REFUSE" ] && {{ echo 'error: the server rejected it' >&2; exit 1; }}
echo "rayjob.ray.io/x created"
""")
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert kuberay.apply(manifest, "ml") == (True, "rayjob.ray.io/x created")
    assert log.read_text().split() == ["apply", "-n", "ml", "-f", str(manifest)]
    monkeypatch.setenv("KUBECTL_REFUSE", "1")
    assert kuberay.apply(manifest, "ml") == (False, "error: the server rejected it")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert kuberay.apply(manifest, "ml") == (False, "kubectl is not on PATH")


def test_every_schema_field_names_its_source():
    assert kuberay_schema.RELEASE.startswith("KubeRay v1.")
    for path, (kind, source) in kuberay_schema.FIELDS.items():
        assert kind in kuberay_schema.KINDS and source.startswith("ray-operator/"), (path, kind, source)
    # a field the schema does not hold, or of another type, is named
    bad = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "x"},
           "spec": {"entrypoint": 3, "suspendd": True}}
    found = kuberay_schema.check(bad)
    assert any("spec.entrypoint" in f for f in found) and any("spec.suspendd" in f for f in found), found
    # the operator's own rules and the CRD's required children
    bad = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "9-" + "x" * 50},
           "spec": {"ttlSecondsAfterFinished": 60, "activeDeadlineSeconds": 0, "submissionMode": "Batch",
                    "rayClusterSpec": {"headGroupSpec": {"template": {"spec": {"containers": [{"image": "i"}]}}},
                                       "workerGroupSpecs": [{"replicas": 1}]}}}
    found = "\n".join(kuberay_schema.check(bad))
    for needle in ("metadata.name: ", "DNS-1035", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                   "'Batch' is not one of", "containers[].name: required", "workerGroupSpecs[].groupName: required",
                   "workerGroupSpecs[].template: required"):
        assert needle in found, (needle, found)


def test_runs_verbs_name_the_kubectl_command(tmp_path):
    """A plan-only kuberay run dir is `planned` to every verb; an applied one (its plan's mode train, its
    `submitted` line as the launcher writes it) gets logs/cancel/resubmit as the one kubectl command that does it."""
    import subprocess

    from conftest import PY, ROOT
    from vrun.rundir import records

    proc = _plan(tmp_path, "model=qwen3_5_35b", "cluster.kuberay.namespace=ml")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "claim" / "r"

    def verb(*args):
        p = subprocess.run([PY, "-m", "vrun", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout + p.stderr

    code, out = verb("logs", str(run))
    assert code == 2 and "planned, not run (mode=plan, cluster=kuberay)" in out, out
    plan = json.loads((run / "plan.json").read_text())
    (run / "plan.json").write_text(json.dumps({**plan, "mode": "train"}))
    name = yaml.safe_load((run / "rayjob.yaml").read_text())["metadata"]["name"]
    records.record(str(run), "submitted", attempt=0, cluster="kuberay", rayjob=name)
    code, out = verb("status", str(run))
    assert code == 0 and "state    pending" in out, out
    for args, fix in ((("logs",), f"kubectl logs -n ml job/{name}"), (("cancel", "--yes"), f"kubectl delete rayjob -n "
                      f"ml {name}"), (("resubmit",), f"kubectl apply -n ml -f {run}/rayjob.yaml")):
        code, out = verb(args[0], str(run), *args[1:])
        assert code == 2 and out.startswith(f"error: run={run}: a RayJob on Kubernetes") and fix in out, out

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
    from vrun.launch import kuberay

    host = kuberay.host_gib_per_gpu(plan["memory"])
    for pod in [spec["headGroupSpec"]["template"]] + [w["template"] for w in workers]:
        (mount,) = pod["spec"]["containers"][0]["volumeMounts"]
        assert mount["mountPath"] == str(tmp_path / "claim")
        assert pod["spec"]["volumes"] == [{"name": mount["name"], "persistentVolumeClaim": {"claimName": "runs"}}]
        # the planner's uid and gid, who own the run dir the entry reads
        assert pod["spec"]["securityContext"] == {"runAsUser": os.getuid(), "runAsGroup": os.getgid(),
                                                  "fsGroup": os.getgid()}
        # not BestEffort: CPUs and memory requested, the memory limit the request (the operator sizes /dev/shm by
        # it and adds that volume itself: none here)
        res = pod["spec"]["containers"][0]["resources"]
        assert res["requests"]["cpu"] == 8 * gpus and res["requests"]["memory"] == res["limits"]["memory"]
        head = pod is spec["headGroupSpec"]["template"]
        assert res["limits"]["memory"] == f"{kuberay.pod_memory_gib(host, gpus, head)}Gi"
        assert int(res["limits"]["memory"][:-2]) >= gpus * host
    # the offloaded states are in the memory: optimizer on the host, params and grads off the GPU while rolling out
    stage = max(plan["memory"]["stages"], key=lambda st: st["optimizer_host_gib"])
    assert host >= stage["optimizer_host_gib"] > 0
    assert "VRUN_TRUST_UID" not in yaml.safe_load(doc["spec"]["runtimeEnvYAML"])["env_vars"]
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
    # HOME writable by the pods' uid; the secret by name
    assert env == [{"name": "HOME", "value": "/tmp/vrun-home"},
                   {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "train-keys", "key": "WANDB_API_KEY",
                                                                            "optional": True}}}]
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
    (['cluster.kuberay.image=\'reg.example/a"b:1\''], "cluster.kuberay.image", "not an image reference"),
    (["cluster.kuberay.image=reg.example/" + "a" * 5000], "cluster.kuberay.image", "5012 characters"),
    (["cluster.kuberay.image='reg.example/verl:1 --privileged'"], "cluster.kuberay.image", "no spaces"),
    (["cluster.kuberay.namespace=" + "n" * 100], "cluster.kuberay.namespace", "at most 63"),
    (["cluster.kuberay.namespace=-all"], "cluster.kuberay.namespace", "RFC 1123 label"),
    (["cluster.kuberay.gpu_resource=gpu"], "cluster.kuberay.gpu_resource", "<domain>/<name>"),
    (["cluster.kuberay.gpu_resource=kubernetes.io/gpu"], "cluster.kuberay.gpu_resource", "kubernetes.io"),
    (["cluster.kuberay.mount_path=/"], "cluster.kuberay.mount_path", "hides it"),
    (["cluster.kuberay.mount_path=/dev/shm"], "cluster.kuberay.mount_path", "hides it"),
    (["cluster.kuberay.run_as_uid=-1"], "cluster.kuberay.run_as_uid", "[0, 2147483647]"),
    # every cluster's range (a year) comes before the RayJob's int32 deadline
    (["cluster.time_min=1000000000000"], "cluster.time_min", "[1, 525,600]"),
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
    assert "report it" not in proc.stderr and len(proc.stderr) < 6000, proc.stderr[-2000:]


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
    `submitted` line as the launcher writes it) gets logs/cancel/resubmit as the one kubectl command that does it
    where no kubectl is on PATH (with one: tests/test_kuberay_kubectl.py)."""
    import subprocess

    from conftest import PY, ROOT
    from vrun.rundir import records

    proc = _plan(tmp_path, "model=qwen3_5_35b", "cluster.kuberay.namespace=ml")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "claim" / "r"

    bare = tmp_path / "no-kubectl"  # PATH without kubectl (this machine may have one)
    bare.mkdir()

    def verb(*args):
        p = subprocess.run([PY, "-m", "vrun", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PATH": str(bare)})
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


def test_plan_without_image_or_claim_writes_no_manifest(tmp_path):
    """mode=plan without the image or the claim: the plan's table and what is missing, and no rayjob.yaml (a
    manifest with a placeholder image or no volume could not run)."""
    for missing in ("cluster.kuberay.image=null", "cluster.kuberay.claim=null"):
        run = tmp_path / "claim" / missing.split(".")[2].split("=")[0]
        proc = _plan(tmp_path, "model=qwen3_5_35b", missing, f"hydra.run.dir={run}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "memory  per GPU" in proc.stdout and (run / "plan.json").exists()
        assert not (run / "rayjob.yaml").exists()
        assert f"no RayJob manifest written in {run}: {missing.split('=')[0]} not given" in proc.stdout, proc.stdout
        assert "kubectl apply" not in proc.stdout + proc.stderr


def test_paths_the_job_reads_off_the_claim_are_named(tmp_path):
    """Data (expanded from this machine's $HOME, off the claim), the model and a custom reward function's file:
    a warning naming each, saying the image may hold it; paths on the claim are not named."""
    claim = tmp_path / "claim"
    claim.mkdir(exist_ok=True)
    (claim / "reward.py").write_text("def f(*a): return 0\n")
    proc = _plan(tmp_path, "model=qwen3_5_35b", "verl.custom_reward_function.path=/opt/rewards/r.py",
                 f"verl.data.val_files={claim}/val.parquet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    home = tmp_path / "home"
    for key, path in (("data.train_files", f"{home}/data/"), ("model.path", ""),
                      ("custom_reward_function.path", "/opt/rewards/r.py")):
        line = next((x for x in out.splitlines() if x.startswith(f"warning: {key}={path}")), None)
        assert line and "outside the claim's mount" in line and "unless the image holds it" in line, (key, out)
    assert "warning: data.val_files=" not in out


def test_another_uid_for_the_pods_is_trusted_by_the_entry(tmp_path):
    """cluster.kuberay.run_as_uid/run_as_gid: the pods run as them, the job's env names the planner's uid as the
    one whose run dir files the entry trusts, and the plan says what the run dir then needs."""
    proc = _plan(tmp_path, "model=qwen3_5_35b", "cluster.kuberay.run_as_uid=4242", "cluster.kuberay.run_as_gid=4343")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = yaml.safe_load((tmp_path / "claim" / "r" / "rayjob.yaml").read_text())
    pod = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsUser": 4242, "runAsGroup": 4343, "fsGroup": 4343}
    assert yaml.safe_load(doc["spec"]["runtimeEnvYAML"])["env_vars"]["VRUN_TRUST_UID"] == str(os.getuid())
    assert "warning: cluster.kuberay.run_as_uid=4242: the pods run as uid 4242" in proc.stdout + proc.stderr


def test_the_entry_trusts_the_planners_files_where_told(tmp_path, monkeypatch):
    """The ownership check the entry's reads make (vrun.core.fs.read_checked, own=True): a file of another uid is
    refused, unless VRUN_TRUST_UID names that uid (a pod running as a site's uid reading the planner's plan)."""
    from vrun.core import fs

    if os.getuid() != 0:
        pytest.skip("giving a file to another uid needs root here")
    f = tmp_path / "plan.json"
    f.write_text("{}")
    os.chown(f, 4242, 4242)
    os.chown(tmp_path, 4242, 4242)
    monkeypatch.delenv("VRUN_TRUST_UID", raising=False)
    assert fs.read_checked(f, own=True) == (None, f"owned by uid 4242, not by this user ({os.getuid()})")
    monkeypatch.setenv("VRUN_TRUST_UID", "4242")
    assert fs.read_checked(f, own=True) == ("{}", None)
    monkeypatch.setenv("VRUN_TRUST_UID", "4243")
    assert fs.read_checked(f, own=True)[0] is None


def test_the_entry_refuses_an_image_of_another_ray_or_python(tmp_path):
    """The plan records the planner's Ray and Python (plan.json stack.runtime); the job's entry, in the image, checks
    them with the rest of the stack before any Ray work: a mismatch is one line in the job's log and exit 2."""
    import subprocess

    from conftest import PY, ROOT
    from vrun.compose import stack

    proc = _plan(tmp_path, "model=qwen3_5_35b")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "claim" / "r"
    plan = json.loads((run / "plan.json").read_text())
    assert plan["stack"]["runtime"] == stack.runtime()
    here = stack.runtime()
    plan["stack"]["runtime"] = {"ray": "1.13.0", "python": "2.7.18"}
    (run / "plan.json").write_text(json.dumps(plan))
    p = subprocess.run([PY, "-m", "vrun.launch.entry", "ppo", "--config", str(run / "verl_config.yaml")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 2 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"error: ray={here['ray']}: the plan was made with Ray 1.13.0") and "; fix: " in lines[0]
    assert lines[1].startswith(f"error: python={here['python']}: the plan was made with Python 2.7.18")
    # a patch release of the same Python, or a plan of an older vrun that records none, is not refused
    assert stack.runtime_mismatch({"ray": here["ray"], "python": here["python"].rsplit(".", 1)[0] + ".99"}, here) == []
    assert stack.runtime_mismatch(None, here) == [] and stack.mismatch(plan["stack"]) == []


def test_site_sizes_for_the_pods(tmp_path):
    """cluster.cpus_per_task and cluster.mem_gb size each pod where the site knows better; a memory below what the
    plan offloads to the host is said, with the size the plan would give."""
    from vrun.launch import kuberay

    proc = _plan(tmp_path, "model=qwen3_5_35b", "cluster.cpus_per_task=96", "cluster.mem_gb=64")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "claim" / "r"
    res = yaml.safe_load((run / "rayjob.yaml").read_text())["spec"]["rayClusterSpec"]["headGroupSpec"]["template"][
        "spec"]["containers"][0]["resources"]
    assert res["requests"] == {"cpu": 96, "memory": "64Gi"} and res["limits"]["memory"] == "64Gi"
    plan = json.loads((run / "plan.json").read_text())
    need = kuberay.pod_memory_gib(kuberay.host_gib_per_gpu(plan["memory"]), 8, False)
    assert "warning: cluster.mem_gb=64: each pod's memory limit" in proc.stdout + proc.stderr
    assert f"fix: cluster.mem_gb={need} " in proc.stdout + proc.stderr


def test_pod_memory_holds_the_object_store_beside_the_states():
    """Ray's object store (30% of the limit, at most 200 GB) lives in the operator's /dev/shm, inside the limit."""
    from vrun.launch import kuberay, kuberay_checks

    for host, gpus in ((0.0, 1), (10.0, 8), (80.6, 8), (400.0, 8)):
        limit = kuberay.pod_memory_gib(host, gpus, False)
        states = gpus * (host + kuberay_checks.PROCESS_GIB_PER_GPU)
        store = min(0.3 * limit, 200e9 / 2 ** 30)
        assert states + store <= limit + 1 and limit - states - store < 2, (host, gpus, limit)

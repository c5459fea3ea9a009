"""cluster=ray against a real standing Ray cluster: a head and a worker started here as separate `ray start`
processes (their own temp dir and ports; GPUs and the accelerator type declared, no hardware), the plan checked
against the shape read from the dashboard, a real job submitted through the Job Submission API reaching the
project's entry (stack check, then verl's run_ppo with the probe task runner, tests/support/vrun_probe.py), and
status, logs and cancel through it. Only the processes started here are stopped (by their
pids; no `ray stop`)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PY, ROOT, runner
from test_handoff import grpo_env

pytestmark = pytest.mark.stack_free  # one CI leg: the hand-off per verl is test_handoff's

RAY = str(Path(PY).parent / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ports(n: int) -> list:
    out = set()
    while len(out) < n:
        out.add(free_port())
    return sorted(out)


def node_flags(p: list) -> list:
    return ["--node-ip-address", "127.0.0.1", "--disable-usage-stats", "--block", "--node-manager-port", str(p[0]),
            "--object-manager-port", str(p[1]), "--metrics-export-port", str(p[2]),
            "--dashboard-agent-grpc-port", str(p[3]), "--dashboard-agent-listen-port", str(p[4]),
            "--runtime-env-agent-port", str(p[5]), "--min-worker-port", str(p[6]), "--max-worker-port", str(p[6] + 40)]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """http address of a head (no GPUs) with one worker of 8 declared H100s; the pids are stopped at the end."""
    tmp = tmp_path_factory.mktemp("raycluster")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PATH=f"{Path(PY).parent}:{env['PATH']}",
               PYTHONPATH=str(ROOT / "tests" / "support"), CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    gcs, dash, client, *rest = ports(12)
    temp = Path("/tmp") / f"vr{os.getpid()}"  # Ray's socket paths must stay short
    head = subprocess.Popen([RAY, "start", "--head", "--port", str(gcs), "--dashboard-port", str(dash),
                             "--dashboard-host", "127.0.0.1", "--ray-client-server-port", str(client),
                             "--include-dashboard=true", "--num-cpus", "1", "--num-gpus", "0",
                             "--temp-dir", str(temp), *node_flags(rest[:7])],
                            env=env, start_new_session=True, stdout=open(tmp / "head.log", "wb"), stderr=subprocess.STDOUT)
    procs = [head]
    url = f"http://127.0.0.1:{dash}"
    try:
        wait(lambda: _get(url, "/api/version"), 90, "the head's dashboard")
        worker_ports = ports(7)
        procs.append(subprocess.Popen([RAY, "start", "--address", f"127.0.0.1:{gcs}", "--num-cpus", "2",
                                       "--num-gpus", "8", "--resources", json.dumps({"accelerator_type:H100": 1}),
                                       *node_flags(worker_ports)], env=env, start_new_session=True,
                                      stdout=open(tmp / "worker.log", "wb"), stderr=subprocess.STDOUT))
        from vrun.launch import rayjobs

        wait(lambda: len(rayjobs.read_shape(url, 5).nodes) == 2, 90, "the worker joining")
        yield url
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(temp)])


def _get(url, path):
    import urllib.request

    try:
        with urllib.request.urlopen(url + path, timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def wait(cond, seconds, what):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if cond():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(1)
    raise AssertionError(f"{what} did not come up within {seconds}s")


def test_shape_read_from_the_live_cluster(ray_cluster):
    from vrun.launch import rayjobs

    s = rayjobs.read_shape(ray_cluster, 5)
    import ray

    assert s.ray_version == ray.__version__ and s.python_version.split(".")[:2] == sys.version.split(".")[:2]
    assert sorted(n["gpus"] for n in s.nodes) == [0, 8]
    assert [n["gpu_type"] for n in s.nodes if n["gpus"]] == ["H100"]


@pytest.mark.parametrize("mesh,needs", [(["mesh.nnodes=2", "mesh.gpus_per_node=8"], "2 node(s) of 8 GPUs"),
                                        (["mesh.nnodes=4", "mesh.gpus_per_node=4"], "4 node(s) of 4 GPUs"),
                                        (["mesh=256gpu"], "32 node(s) of 8 GPUs")])
def test_too_small_a_cluster_is_refused_in_one_line(ray_cluster, tmp_path, mesh, needs):
    run = tmp_path / "r"
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", f"cluster.ray.address={ray_cluster}", *mesh,
                  "run.task_runner=vrun_probe.ProbeTaskRunner", f"hydra.run.dir={run}", env=grpo_env(tmp_path),
                  timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(errors) == 1 and needs in errors[0] and "the Ray cluster has" in errors[0], proc.stderr
    assert not (run / "ray_job.json").exists() and not (run / "plan.json").exists()


@pytest.mark.parametrize("other", [{"ray": "2.9.3"}, {"python": "3.9.18"}, {"ray": "3.0.0", "python": "3.13.1"}])
def test_another_ray_or_python_is_refused_naming_both(ray_cluster, other):
    """The live cluster's versions against a plan stack that differs (this environment's own would pass)."""
    import platform

    import ray

    from conftest import plan
    from vrun.launch import rayjobs

    p = plan(["model=qwen3_5_35b", "algo=grpo", "mesh=8gpu", "mode=plan"])
    s = rayjobs.read_shape(ray_cluster, 5)
    assert not rayjobs.shape_problems(p, s)
    stack = {"ray": ray.__version__, "python": platform.python_version(), **other}
    found = [x for x in rayjobs.shape_problems(p, s, stack) if not x.warning]
    assert len(found) == len(other)
    for x in found:
        line = x.line()
        assert "\n" not in line and other[x.key] in line
        assert (s.ray_version if x.key == "ray" else s.python_version) in line


@pytest.mark.parametrize("address", ["http://127.0.0.1:1", "127.0.0.1:1", "http://10.255.255.1:8265"])
def test_a_lost_dashboard_is_one_line(tmp_path, address):
    run = tmp_path / "r"
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", f"cluster.ray.address={address}",
                  "cluster.ray.dashboard_timeout_s=3", "mesh=8gpu",
                  f"hydra.run.dir={run}", env=grpo_env(tmp_path), timeout=200)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert errors[0].startswith("error: cluster.ray.address=") and "nothing was submitted" in errors[0]


@pytest.mark.parametrize("address", ["ray://head:10001", "local", "http://", "head", "http://h:80/x y"])
def test_an_address_that_is_no_dashboard(tmp_path, address):
    proc = runner("model=qwen3_5_35b", "cluster=ray", f"cluster.ray.address={address}", "mode=plan",
                  f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert any(line.startswith("error: cluster.ray.address=") for line in proc.stderr.splitlines()), proc.stderr


def test_auto_without_ray_address(tmp_path):
    env = {k: v for k, v in grpo_env(tmp_path).items() if k != "RAY_ADDRESS"}
    proc = runner("model=qwen3_5_35b", "cluster=ray", "mesh=8gpu",
                  f"hydra.run.dir={tmp_path}/r", env=env, timeout=200)
    assert proc.returncode == 2 and "RAY_ADDRESS is not set" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.ray
def test_a_job_reaches_the_entry_and_the_verbs_work(ray_cluster, tmp_path):
    """plan → checks against the live cluster → submit → the entry's stack check and run_ppo in the job, the probe
    task runner inside a Ray worker of the cluster; status, logs and cancel through the API."""
    env = dict(grpo_env(tmp_path), RAY_ADDRESS=ray_cluster)
    run = tmp_path / "run"
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "mesh=8gpu",
                  "run.task_runner=vrun_probe.ProbeTaskRunner", f"hydra.run.dir={run}", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job = json.loads((run / "ray_job.json").read_text())
    assert job["address"] == ray_cluster and job["job_id"] in proc.stdout
    vr = lambda *a: subprocess.run([PY, "-m", "vrun", *a], cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=120)
    try:
        wait(lambda: (run / "probe.json").exists(), 240, "the probe's report")
    except AssertionError:
        raise AssertionError(vr("status", str(run)).stdout + vr("logs", str(run)).stdout[-4000:]) from None
    report = json.loads((run / "probe.json").read_text())
    assert report["in_ray_worker"] and report["config"]["ray_kwargs"]["ray_init"]["address"] == "auto"
    from vrun.rundir import records

    # the job's entry checked the checkpoint (no launcher before it did): none yet, recorded in the run dir
    (back,) = [e for e in records.events(str(run)) if e["event"] == "resumed"]
    assert back["step"] is None and back["line"] == "resume: no checkpoint yet: starts from step 0", back
    assert report["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    # the tracker's run id, as a SLURM node's processes get it: a job submitted again continues the same run
    from vrun.rundir.records import run_id

    assert (report["env"]["WANDB_RUN_ID"], report["env"]["WANDB_RESUME"]) == (f"vrun-{run_id(str(run))}", "allow")
    vr = lambda *a: subprocess.run([PY, "-m", "vrun", *a], cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=120)
    wait(lambda: "SUCCEEDED" in vr("status", str(run)).stdout, 120, "the job's end")
    (row,) = json.loads(vr("runs", str(run), "--json").stdout)  # `runs` reads the job's state from the dashboard
    assert row["state"] == "completed" and row["phase"].startswith("ray job SUCCEEDED"), row
    logs = vr("logs", str(run))
    assert logs.returncode == 0 and "planned against" not in logs.stdout
    assert "wandb-test-secret" not in logs.stdout + "".join(f.read_text(errors="ignore") for f in run.rglob("*")
                                                              if f.is_file())
    gone = vr("cancel", str(run))
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "SUCCEEDED" in gone.stderr


@pytest.mark.ray
def test_a_job_refuses_another_plans_checkpoint_before_ray_starts(ray_cluster, tmp_path):
    """run.resume=true into a run dir whose checkpoint another model saved: the job's entry refuses it in one line
    before verl starts, the job fails, and `logs` shows the line."""
    from conftest import another_models_checkpoint

    env = dict(grpo_env(tmp_path), RAY_ADDRESS=ray_cluster)
    run = tmp_path / "run"
    base = ["model=qwen3_5_35b", "algo=grpo", "cluster=ray", "mesh=8gpu", "run.task_runner=vrun_probe.ProbeTaskRunner",
            f"hydra.run.dir={run}"]
    first = runner(*base, "mode=plan", env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    another_models_checkpoint(run)
    proc = runner(*base, "run.resume=true", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    vr = lambda *a: subprocess.run([PY, "-m", "vrun", *a], cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=120)
    wait(lambda: "FAILED" in vr("status", str(run)).stdout, 240, "the job's failure")
    logs = vr("logs", str(run)).stdout
    assert "vrun: resume: refused" in logs and "saved by model glm5_1" in logs, logs[-3000:]
    assert not (run / "probe.json").exists()


@pytest.mark.ray
def test_cancel_stops_a_running_job_and_logs_follow(ray_cluster, tmp_path):
    """A held job (tests/support/vrun_hold.py) is RUNNING; logs show the entry reached the worker; cancel stops it
    and a second cancel is refused in one line; resubmit runs it again as a new job id in the same run dir."""
    env = dict(grpo_env(tmp_path), RAY_ADDRESS=ray_cluster)
    run = tmp_path / "held"
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "mesh=8gpu",
                  "run.task_runner=vrun_hold.HoldTaskRunner", f"hydra.run.dir={run}", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = json.loads((run / "ray_job.json").read_text())["job_id"]
    vr = lambda *a: subprocess.run([PY, "-m", "vrun", *a], cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=120)
    wait(lambda: (run / "hold.json").exists(), 240, "the held task runner")
    assert "RUNNING" in vr("status", str(run)).stdout
    wait(lambda: "hold: holding on" in vr("logs", str(run)).stdout, 60, "the job's log")
    refused = vr("resubmit", str(run))
    assert refused.returncode == 2 and "RUNNING" in refused.stderr and refused.stderr.count("\n") == 1
    stopped = vr("cancel", str(run))
    assert stopped.returncode == 0, stopped.stderr
    wait(lambda: "STOPPED" in vr("status", str(run)).stdout, 60, "the job stopping")
    (row,) = json.loads(vr("runs", str(run), "--json").stdout)
    assert row["state"] == "cancelled" and row["phase"].startswith("ray job STOPPED"), row
    again = vr("cancel", str(run))
    assert again.returncode == 2 and "STOPPED" in again.stderr and again.stderr.count("\n") == 1
    (run / "hold.json").unlink()
    re = vr("resubmit", str(run))
    assert re.returncode == 0, re.stderr
    second = json.loads((run / "ray_job.json").read_text())
    assert second["job_id"] != first and second["replaces"] == first
    wait(lambda: (run / "hold.json").exists(), 240, "the resubmitted job")
    assert vr("cancel", str(run)).returncode == 0


def test_lost_dashboard_in_the_verbs_is_one_line(tmp_path):
    """A run dir whose cluster has gone: each verb answers in one line within the timeout."""
    run = tmp_path / "gone"
    run.mkdir()
    (run / "ray_job.json").write_text(json.dumps({"address": "http://127.0.0.1:1", "job_id": "raysubmit_x",
                                                  "entrypoint": "true", "runtime_env": {}}))
    for verb in ("status", "logs", "cancel", "resubmit"):
        t0 = time.monotonic()
        p = subprocess.run([PY, "-m", "vrun", verb, str(run)], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, (verb, p.stderr)
        assert p.stderr.startswith("error: cluster.ray.address=http://127.0.0.1:1") and time.monotonic() - t0 < 40


def test_runs_with_a_lost_dashboard_keeps_the_row_and_says_why(tmp_path):
    """`runs` asks each dashboard once (GET /api/jobs/), within 5 s: one that does not answer leaves the row's
    state as the run dir says and names why."""
    from types import SimpleNamespace

    from vrun.runs import rayjobs as ray_runs

    run = tmp_path / "gone"
    run.mkdir()
    (run / "ray_job.json").write_text(json.dumps({"address": "http://127.0.0.1:1", "job_id": "raysubmit_x",
                                                  "entrypoint": "true", "runtime_env": {}}))
    row = SimpleNamespace(dir=run, state="pending", phase="submitted", reason="")
    t0 = time.monotonic()
    ray_runs.refresh([row])
    assert time.monotonic() - t0 < 10 and row.state == "pending" and row.reason == "Ray dashboard unreachable"

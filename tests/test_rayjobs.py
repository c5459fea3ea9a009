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


def cluster_env(gpus: int = 8) -> dict:
    """The environment of a test Ray node: no inherited RAY_ settings, this venv first on PATH, the stand-in packages
    importable, `gpus` devices visible."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PATH=f"{Path(PY).parent}:{env['PATH']}",
               PYTHONPATH=str(ROOT / "tests" / "support"), CUDA_VISIBLE_DEVICES=",".join(map(str, range(gpus))))
    return env


def _ray_start(flags: list, log: Path, cpus: int, gpus: int, h100: bool) -> subprocess.Popen:
    """One `ray start` (head or worker) in its own process group, its output appended to `log`; `h100`: the node
    declares its accelerator type. It sees as many devices as it declares, eight when it declares none."""
    extra = ["--resources", json.dumps({"accelerator_type:H100": 1})] if h100 else []
    return subprocess.Popen([RAY, "start", *flags, "--num-cpus", str(cpus), "--num-gpus", str(gpus), *extra],
                            env=cluster_env(gpus or 8), start_new_session=True, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)


def start_head(p: list, temp: Path, log: Path, gpus: int = 0, cpus: int = 0, h100: bool = True) -> subprocess.Popen:
    """`ray start --head` on the ports p (gcs, dashboard, client, then the node's seven) and its own temp dir;
    gpus > 0: the head itself holds that many declared GPUs (of type H100 unless h100=False); cpus: 2 with GPUs,
    else 1, unless given."""
    gcs, dash, client, *rest = p
    return _ray_start(["--head", "--port", str(gcs), "--dashboard-port", str(dash), "--dashboard-host", "127.0.0.1",
                       "--ray-client-server-port", str(client), "--include-dashboard=true", "--temp-dir", str(temp),
                       *node_flags(rest[:7])], log, cpus or (2 if gpus else 1), gpus, h100 and gpus > 0)


def start_worker(gcs: int, log: Path, cpus: int, gpus: int, h100: bool = True) -> subprocess.Popen:
    """`ray start --address` joining the head at 127.0.0.1:gcs on seven fresh ports, holding `gpus` declared GPUs."""
    return _ray_start(["--address", f"127.0.0.1:{gcs}", *node_flags(ports(7))], log, cpus, gpus, h100)


def stop(procs: list, sig=signal.SIGTERM) -> None:
    """The process groups started here, by pid: TERM (or `sig`), then KILL to what is left after 1 s (a test cluster
    keeps nothing worth a clean shutdown; `ray start --block` may take 30 s to end its children, and every Ray
    process of a node stays in its `ray start`'s group)."""
    for p in reversed(procs):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
    end = time.monotonic() + 1
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(30)


def dashboard_pid(url: str) -> int:
    """The pid of the dashboard serving `url` (its command line: dashboard.py --port=<port>)."""
    port = url.rsplit(":", 1)[1]
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"dashboard.py") for a in argv) and f"--port={port}".encode() in argv:
            return int(d.name)
    raise AssertionError(f"no dashboard process for {url}")


GCS: dict = {}  # the module cluster's GCS port (the address `ray start` prints for joining)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """http address of a head (no GPUs) with one worker of 8 declared H100s; the pids are stopped at the end."""
    tmp = tmp_path_factory.mktemp("raycluster")
    p = ports(12)
    temp = Path("/tmp") / f"vr{os.getpid()}"  # Ray's socket paths must stay short
    head = start_head(p, temp, tmp / "head.log")
    gcs, dash = p[0], p[1]
    GCS["port"] = gcs
    procs = [head]
    url = f"http://127.0.0.1:{dash}"
    try:
        wait(lambda: _get(url, "/api/version"), 90, "the head's dashboard")
        procs.append(start_worker(gcs, tmp / "worker.log", cpus=2, gpus=8))
        from vrun.launch import rayjobs

        wait(lambda: len(rayjobs.read_shape(url, 5).nodes) == 2, 90, "the worker joining")
        yield url
    finally:
        stop(procs)
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


@pytest.mark.parametrize("how", ["knob", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"])
def test_the_gcs_address_is_refused_naming_the_dashboard_form(ray_cluster, tmp_path, how):
    """The address Ray prints for joining (<head>:<gcs port>) answers an HTTP request in binary: one line naming the
    dashboard's form, no NUL byte printed, nothing written."""
    gcs = f"127.0.0.1:{GCS['port']}"
    env = {k: v for k, v in grpo_env(tmp_path).items() if not k.startswith("RAY_")}
    if how != "knob":
        env[how] = gcs
    run = tmp_path / "r"
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "mesh=8gpu", "mode=preflight",
                  f"cluster.ray.address={gcs if how == 'knob' else 'auto'}", f"hydra.run.dir={run}", env=env,
                  timeout=200)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "\x00" not in proc.stderr + proc.stdout, proc.stderr
    assert "GCS address" in errors[0] and "http://<head>:8265" in errors[0] and not (run / "plan.json").exists()


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
    # the submitter follows the job to its end (cluster.detach=false): one line per change, then its state
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "mesh=8gpu",
                  "run.task_runner=vrun_probe.ProbeTaskRunner", f"hydra.run.dir={run}", env=env, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job = json.loads((run / "ray_job.json").read_text())
    assert set(job) == {"address", "job_id"} and job["address"] == ray_cluster and job["job_id"] in proc.stdout
    from vrun.rundir.records import run_id

    assert job["job_id"] == f"vrun-{run_id(str(run))}-0"
    follow = [x for x in proc.stdout.splitlines() if x.startswith(f"job {job['job_id']}")]
    assert follow[-1] == f"job {job['job_id']}: completed" and len(follow) == len(set(follow)), proc.stdout
    assert "detached" not in proc.stderr
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
    # the job's own entry recorded its start and its end and kept its log (the run dir is shared here); the read
    # verbs show what the dashboard says and write nothing
    own = [e for e in records.events(str(run)) if e["event"] in ("ray_running", "ray_ended")]
    assert [e["event"] for e in own] == ["ray_running", "ray_ended"] and own[1]["state"] == "completed", own
    assert all(e["ray_job"] == job["job_id"] and e["attempt"] == 0 for e in own), own
    kept = (run / "job.log").read_text()
    from test_read_verbs import unchanged_by_the_read_verbs

    done = unchanged_by_the_read_verbs(run, vr)
    assert kept.strip() and kept.strip().splitlines()[0] in done["logs"].stdout, (kept[-2000:], done["logs"].stdout[-2000:])
    st = done["status"]
    assert "state    completed" in st.stdout and f"ray job  {job['job_id']} at {ray_cluster}" in st.stdout, st.stdout
    (row,) = json.loads(vr("runs", str(run), "--json").stdout)  # `runs` reads the job's state from the dashboard
    assert row["state"] == "completed" and row["phase"] == "completed (ray job SUCCEEDED)", row
    assert row["elapsed_s"] > 0 and row["attempt"] == 0 and row["job_id"] == job["job_id"], row
    logs = vr("logs", str(run))
    assert logs.returncode == 0 and "planned against" not in logs.stdout
    assert "wandb-test-secret" not in logs.stdout + "".join(f.read_text(errors="ignore") for f in run.rglob("*")
                                                              if f.is_file())
    gone = vr("cancel", str(run))
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "completed" in gone.stderr, gone.stderr


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
    proc = runner(*base, "run.resume=true", env=env, timeout=420)
    # the submitter followed it to its failure: one line, the job's own cause
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "failed" in errors[0], proc.stdout[-3000:] + proc.stderr
    vr = lambda *a: subprocess.run([PY, "-m", "vrun", *a], cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=120)
    assert "state    failed" in vr("status", str(run)).stdout
    logs = vr("logs", str(run)).stdout
    assert "vrun: resume: refused" in logs and "saved by model glm5_1" in logs, logs[-3000:]
    assert not (run / "probe.json").exists()


@pytest.mark.ray
def test_cancel_stops_a_running_job_and_a_frozen_dashboard_holds_no_verb(ray_cluster, tmp_path):
    """A held job (tests/support/vrun_hold.py) is running; logs show the entry reached the worker. The dashboard
    frozen (SIGSTOP): every verb answers in one line within its timeout (3 s), naming the address and the run's last
    known state. Thawed: cancel stops it, a second cancel is refused in one line, runs says cancelled even with the
    dashboard frozen again; resubmit runs the plan's job again as the run's next attempt."""
    env = dict(grpo_env(tmp_path), RAY_API_SERVER_ADDRESS=ray_cluster, RAY_ADDRESS="http://127.0.0.1:1")
    run = tmp_path / "held"
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "cluster.ray.address=auto", "mesh=8gpu",
                  "cluster.detach=true", "cluster.ray.dashboard_timeout_s=3",
                  "run.task_runner=vrun_hold.HoldTaskRunner", f"hydra.run.dir={run}", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = json.loads((run / "ray_job.json").read_text())["job_id"]
    assert first.endswith("-0") and json.loads((run / "ray_job.json").read_text())["address"] == ray_cluster

    def vr(*a, timeout=120):
        t0 = time.monotonic()
        p = subprocess.run([PY, "-m", "vrun", *a], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout)
        p.seconds = time.monotonic() - t0
        return p

    wait(lambda: (run / "hold.json").exists(), 240, "the held task runner")
    wait(lambda: "state    running" in vr("status", str(run)).stdout, 60, "the job running")
    wait(lambda: "hold: holding on" in vr("logs", str(run)).stdout, 60, "the job's log")
    # the entry recorded its start before any verb read the run; the verbs, the dashboard answering, write nothing
    from vrun.rundir import records

    assert [e["ray_job"] for e in records.events(str(run)) if e["event"] == "ray_running"] == [first]
    log = run / "job.log"  # kept by the entry as its output grows (the held job prints nothing after this line)
    wait(lambda: log.exists() and "hold: holding on" in log.read_text(), 60, "the job's log kept by its entry")
    from test_read_verbs import unchanged_by_the_read_verbs

    done = unchanged_by_the_read_verbs(run, vr)
    assert "state    running" in done["status"].stdout and json.loads(done["runs --json"].stdout)[0]["state"] == "running"
    assert "hold: holding on" in done["logs"].stdout
    pid = dashboard_pid(ray_cluster)
    os.kill(pid, signal.SIGSTOP)
    try:
        for verb in ("status", "logs", "cancel", "resubmit"):
            p = vr(verb, str(run), timeout=60)
            assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.seconds < 30, (verb, p.seconds, p.stderr)
            assert ray_cluster in p.stderr and "last known state: running" in p.stderr, p.stderr
        p = vr("runs", str(run), "--json", timeout=60)
        assert p.returncode == 0 and p.seconds < 30 and json.loads(p.stdout)[0]["state"] == "running"
    finally:
        os.kill(pid, signal.SIGCONT)
    refused = vr("resubmit", str(run))
    assert refused.returncode == 2 and "still running" in refused.stderr and refused.stderr.count("\n") == 1
    stopped = vr("cancel", str(run))
    assert stopped.returncode == 0, stopped.stderr
    assert "cancelled with python -m vrun cancel" in vr("status", str(run)).stdout
    again = vr("cancel", str(run))
    assert again.returncode == 2 and "cancelled" in again.stderr and again.stderr.count("\n") == 1
    os.kill(pid, signal.SIGSTOP)
    try:
        (row,) = json.loads(vr("runs", str(run), "--json").stdout)
        assert row["state"] == "cancelled", row
    finally:
        os.kill(pid, signal.SIGCONT)
    (run / "hold.json").unlink()
    re = vr("resubmit", str(run), "--detach")
    assert re.returncode == 0, re.stderr
    second = json.loads((run / "ray_job.json").read_text())
    assert second["job_id"] == first[:-1] + "1", second
    wait(lambda: (run / "hold.json").exists(), 240, "the resubmitted job")
    (row,) = json.loads(vr("runs", str(run), "--json").stdout)
    assert row["attempt"] == 1 and row["restarts"] >= 0 and row["job_id"] == second["job_id"], row
    assert vr("cancel", str(run)).returncode == 0


def test_lost_dashboard_in_the_verbs_is_one_line(tmp_path):
    """A run dir whose cluster has gone: each verb answers in one line within the timeout."""
    from test_ray_doors import planned, submitted

    run, env = planned(tmp_path)
    gone = type("Gone", (), {"url": "http://127.0.0.1:1", "jobs": {}})()
    submitted(run, gone)
    for verb in ("status", "logs", "cancel", "resubmit"):
        t0 = time.monotonic()
        p = subprocess.run([PY, "-m", "vrun", verb, str(run)], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, (verb, p.stderr)
        assert p.stderr.startswith("error: cluster.ray.address=http://127.0.0.1:1") and time.monotonic() - t0 < 40
        assert "refused the connection" in p.stderr and "last known state: pending" in p.stderr, p.stderr


def test_runs_with_a_lost_dashboard_keeps_the_row_and_says_why(tmp_path):
    """`runs` asks each dashboard once (GET /api/jobs/), within 5 s: one that does not answer leaves the row's
    state as the run dir says and names why."""
    from test_ray_doors import planned, submitted
    from vrun.rundir import rayjob, state

    run, env = planned(tmp_path)
    gone = type("Gone", (), {"url": "http://127.0.0.1:1", "jobs": {}})()
    submitted(run, gone)
    row = state.load(run)
    t0 = time.monotonic()
    rayjob.refresh([row, state.load(run)])
    assert time.monotonic() - t0 < 10 and row.state == "pending" and row.reason == "dashboard unreachable: refused"
    assert "refused the connection" in row.ray_error


@pytest.mark.ray
def test_a_restarted_head_leaves_the_run_lost_and_resubmit_resumes_it(tmp_path):
    """A one-node cluster of its own runs the stand-in trainer (verl's step lines, checkpoints in verl's layout);
    once a checkpoint is whole the head is stopped and started again on the same ports: the new head knows no job.
    status and runs say lost with why, cancel has nothing to stop, logs print the log kept in the run dir, and
    resubmit submits the plan's job again: it resumes from the last whole checkpoint under the same tracker id."""
    from conftest import processes_of
    from vrun.launch import rayjobs
    from vrun.rundir import records

    p = ports(12)
    temp = Path("/tmp") / f"vl{os.getpid()}"
    url = f"http://127.0.0.1:{p[1]}"
    procs = [start_head(p, temp, tmp_path / "head.log", gpus=8)]
    run = tmp_path / "run"
    rid = records.run_id(str(run))

    def vr(*a):
        return subprocess.run([PY, "-m", "vrun", *a], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    try:
        wait(lambda: len(rayjobs.read_shape(url, 5).nodes) == 1, 120, "the one-node cluster")
        env = dict(grpo_env(tmp_path), RAY_API_SERVER_ADDRESS=url)
        base = ["model=qwen3_5_35b", "algo=grpo", "cluster=ray", "cluster.ray.address=auto", "mesh=8gpu",
                "run.task_runner=vrun_standin.StandinTaskRunner", "verl.trainer.save_freq=1", f"hydra.run.dir={run}"]
        first = runner(*base, "mode=plan", env=env, timeout=300)
        assert first.returncode == 0, first.stderr[-2000:]
        (run / "standin.json").write_text(json.dumps({"steps": 1000, "step_s": 0.5, "save_freq": 1}))
        proc = runner(*base, "run.resume=true", "cluster.detach=true", env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        tracker = run / "checkpoints" / "latest_checkpointed_iteration.txt"
        wait(lambda: int(tracker.read_text()) >= 1, 300, "a whole checkpoint")
        st = vr("status", str(run)).stdout
        assert "state    running: step" in st and "measured step" in st, st
        saved = int(tracker.read_text())
        # the job's entry keeps its log in the run dir as it grows (the read verbs keep nothing)
        wait(lambda: "step:1 - " in ((run / "job.log").exists() and (run / "job.log").read_text() or ""), 60,
             "the job's log kept by its entry")
        stop(procs, signal.SIGKILL)  # the head dies (its job history with it)
        procs.clear()
        for line in processes_of(".", f"VRUN_RUN_ID={rid}"):  # what the old head left of the job, if anything
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        procs.append(start_head(p, temp, tmp_path / "head.log", gpus=8))
        wait(lambda: len(rayjobs.read_shape(url, 5).nodes) == 1, 120, "the head started again")
        job = json.loads((run / "ray_job.json").read_text())["job_id"]
        st = vr("status", str(run))
        assert st.returncode == 0 and "state    lost" in st.stdout and f"no longer knows job {job}" in st.stdout, \
            st.stdout + st.stderr
        (row,) = json.loads(vr("runs", str(run), "--json").stdout)
        assert row["state"] == "lost" and "resubmit" in row["phase"], row
        gone = vr("cancel", str(run))
        assert gone.returncode == 2 and "nothing to stop" in gone.stderr and gone.stderr.count("\n") == 1
        kept = vr("logs", str(run))
        assert kept.returncode == 0 and "step:1 - " in kept.stdout and "as last read" in kept.stderr, kept.stderr
        again = vr("resubmit", str(run), "--detach")
        assert again.returncode == 0, again.stderr
        assert json.loads((run / "ray_job.json").read_text())["job_id"] == f"vrun-{rid}-1"

        def resumed():
            return [e for e in records.events(str(run)) if e["event"] == "resumed"]

        wait(lambda: len(resumed()) == 2, 240, "the resubmitted job's resume check")
        assert isinstance(resumed()[-1]["step"], int) and resumed()[-1]["step"] >= saved, resumed()
        wait(lambda: f"step:{resumed()[-1]['step'] + 1} - " in vr("logs", str(run)).stdout, 240,
             "the step after the checkpoint")
        info = json.loads(subprocess.run(["curl", "-s", f"{url}/api/jobs/vrun-{rid}-1"], capture_output=True,
                                         text=True).stdout or "{}")
        envs = (info.get("runtime_env") or {}).get("env_vars") or {}
        if envs:  # the dashboard may redact the runtime env
            assert envs.get("WANDB_RUN_ID") == f"vrun-{rid}", envs
        assert vr("cancel", str(run)).returncode == 0
    finally:
        stop(procs, signal.SIGKILL)
        for line in processes_of(".", f"VRUN_RUN_ID={rid}"):
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["rm", "-rf", str(temp)])

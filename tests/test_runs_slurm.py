"""`python -m vrun <verb>` on a real SLURM cluster (the CI harness, or the cluster sinfo reaches when
VRUN_TEST_SLURM=1 says so; see tests/test_slurm.py, whose helpers these tests use): two runs submitted and
listed, one followed and cancelled while it trains (its Ray processes end), one failing on a node (status names
the node and the error), the two diffed and one exported; a sweep cancelled after one confirmation; a waiting
submission's progress lines; resubmit under `python -m vrun`. Needs 3 nodes of 4 GPUs (the harness declares them).
"""
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import PY, ROOT
from test_runs import one_error_line
from test_slurm import NOT_SHARED, TWO_NODES, WRAP, run, shared, slurm  # noqa: F401 - shared is a fixture

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(WRAP is None, reason="no test SLURM cluster: set VRUN_SLURM_WRAPPER (the CI harness's "
                                 "slx), or VRUN_TEST_SLURM=1 to submit test jobs to the cluster sinfo reaches"),
              pytest.mark.skipif(bool(NOT_SHARED), reason=f"the SLURM nodes cannot run {PY} in {ROOT}: {NOT_SHARED}")]


@pytest.fixture(autouse=True)
def own_index(tmp_path, monkeypatch):
    """This test's runs only: its own index (the runner and `python -m vrun` inherit it)."""
    monkeypatch.setenv("VRUN_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture(autouse=True)
def cancel_leftovers(shared):
    """A test that fails half-way leaves no job behind for the next one (only this test's jobs)."""
    yield
    ids = set()
    for f in shared.rglob("progress.jsonl"):
        ids |= {str(json.loads(line).get("job_id")) for line in f.read_text().splitlines() if '"job_id"' in line}
    if ids - {"None", ""}:
        slurm("scancel", *sorted(ids - {"None", ""}))
        wait_for("the test's jobs to leave the queue",
                 lambda: not slurm("squeue", "-h", "-j", ",".join(sorted(ids - {"None", ""}))).stdout.strip(),
                 timeout=120)


def vrun(*args, timeout=300, stdin=subprocess.DEVNULL):
    """`python -m vrun` where SLURM's clients reach the cluster (through the harness's wrapper)."""
    return subprocess.run(WRAP + [PY, "-m", "vrun", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, stdin=stdin)


def status(d) -> dict:
    p = vrun("status", str(d), "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def wait_for(what, pred, timeout=240, every=1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)




def ray_of_job(job_id: str) -> list:
    """Processes of this job's Ray cluster still alive (its ports come from the job id)."""
    from vrun.launch.slurm.procs import ports

    pt = ports(job_id)
    out = subprocess.run(["pgrep", "-af", f"(port|PORT)[=_ -]+({pt['gcs']}|{pt['node_manager']})\\b|HoldTaskRunner"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line and "<defunct>" not in line]


def test_two_runs_listed_followed_cancelled_failed_diffed_exported(shared, tmp_path):
    """A (2 nodes) trains with a task runner that holds; B (2 nodes) waits for nodes, then fails on its node 1.
    runs/status show A training and B pending with SLURM's reason; logs -f follows A until it is cancelled;
    A's Ray processes end; B's status names the node and the error; diff and export work on both."""
    a = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=train", "cluster.detach=true",
            "run.task_runner=vrun_hold.HoldTaskRunner", "hydra.sweep.subdir=a")
    assert a.returncode == 0, a.stdout[-2000:] + a.stderr[-2000:]
    b = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=preflight", "cluster.detach=true",
            "cluster.ray.join_timeout_s=30", "hydra.sweep.subdir=b",
            "+cluster.node_setup=['if [ \"$SLURM_NODEID\" = 1 ]; then echo node setup broke >&2; exit 3; fi']",
            sweep="sweep_b")  # a sweep dir is one sweep's: B is its own
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    da, db = shared / "sweep" / "a", shared / "sweep_b" / "b"
    wait_for("A's task runner", lambda: (da / "hold.json").exists())

    rows = {Path(r["run_dir"]).name: r for r in json.loads(vrun("runs", "--json").stdout)}
    assert rows["a"]["state"] == "running" and rows["a"]["phase"] == "training started"
    assert rows["a"]["gpus"] == 8 and rows["a"]["job_id"] and rows["a"]["elapsed_s"] > 0
    assert rows["b"]["state"] == "pending" and rows["b"]["reason"] == "Resources", rows["b"]
    table = vrun("runs").stdout
    assert re.search(r"running: training started\s+\d+\s+0\s+\d+m\d\ds", table) and \
        "pending (Resources: waiting for nodes to free up)" in table
    st = vrun("status", str(da)).stdout
    assert "state    running: training started" in st and "(attempt 0; restarts 0;" in st
    assert "nodes joined 2/2" in st and "ray_up" in st and "logs     python -m vrun logs" in st

    follow = subprocess.Popen(WRAP + [PY, "-m", "vrun", "logs", str(da), "-f"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(180, follow.kill)  # a missing line fails the test instead of hanging it
    watchdog.start()
    seen = []
    for line in follow.stdout:
        seen.append(line)
        if "hold: holding" in line:
            break
    assert any(line.startswith(("n0 out| ", "n1 out| ", "n2 out| ")) and "node(s) alive" in line for line in seen)
    job_a = rows["a"]["job_id"]
    assert ray_of_job(job_a), "A's Ray processes should be running"
    c = vrun("cancel", str(da))
    assert c.returncode == 0 and f"cancelled job {job_a}: {da}" in c.stdout and f"stopped: {da}" in c.stdout, \
        c.stdout + c.stderr
    rest = follow.communicate(timeout=60)[0]  # logs -f ends by itself once the run has ended
    watchdog.cancel()
    assert follow.returncode == 0 and f"-- job {job_a}: cancelled" in rest, rest[-2000:]
    wait_for("A's Ray processes to end", lambda: not ray_of_job(job_a), timeout=60)
    assert status(da)["state"] == "cancelled"
    one_error_line(vrun("cancel", str(da)), "has ended: cancelled", "nothing to cancel")

    # B gets the nodes now; its node 1 fails in its setup lines
    sb = wait_for("B to fail", lambda: (lambda s: s if s["state"] == "failed" else None)(status(db)), timeout=180)
    node1 = sb["hosts"][1]
    assert sb["failure"]["node"] == node1
    assert sb["failure"]["error"] == f"cluster.node_setup failed on node 1 ({node1}) with exit code 3"
    text = vrun("status", str(db)).stdout
    assert f"failed   on {node1}: cluster.node_setup failed on node 1 ({node1}) with exit code 3" in text
    errs = vrun("logs", str(db), "--node", node1, "--stream", "err").stdout
    assert f"{node1} err| node setup broke" in errs
    wait_for("B's job to leave the queue", lambda: not slurm("squeue", "-h", "-j", sb["job_id"]).stdout.strip(),
             timeout=120)
    one_error_line(vrun("cancel", str(db)), "has ended: failed")

    d = vrun("diff", str(da), str(db))
    assert d.returncode == 0, d.stderr
    assert "  mode: train → preflight" in d.stdout and "  run.task_runner: vrun_hold.HoldTaskRunner → (absent)" \
        in d.stdout and "  cluster.detach: true → true" not in d.stdout and "mesh: same" in d.stdout
    script = tmp_path / "a.sh"
    assert vrun("export", str(da), "-o", str(script)).returncode == 0
    text = script.read_text()
    assert "ray_kwargs.ray_init.address=auto: start Ray first" in text and "vrun_hold.HoldTaskRunner" in text
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(PY).parent}:{env['PATH']}"
    out = subprocess.run(["bash", str(script), "--cfg", "job"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    saved = yaml.safe_load((da / "verl_config.yaml").read_text())
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{next(iter(saved))}:"))
    assert yaml.safe_load("\n".join(lines[start:])) == saved
    listed = json.loads(vrun("runs", "--state", "cancelled,failed", "--json").stdout)
    assert sorted((Path(r["run_dir"]).name, r["state"]) for r in listed) == [("a", "cancelled"), ("b", "failed")]


def test_sweep_dir_cancelled_after_one_confirmation(shared):
    """A 2-point sweep (one point running, one pending for nodes): cancelling the sweep dir needs --yes without
    a terminal; with it every point is cancelled and its processes end."""
    p = run(shared, "-m", "model=qwen3_5_35b", "verl.trainer.save_freq=5,10", *TWO_NODES, "mode=preflight",
            "cluster.detach=true", "+cluster.node_setup=['sleep 600']")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    sweep = shared / "sweep"
    points = sorted(d for d in sweep.iterdir() if (d / "plan.json").exists())
    assert len(points) == 2
    wait_for("one point to start", lambda: any(status(d)["state"] == "running" for d in points), timeout=120)
    states = sorted(status(d)["state"] for d in points)
    assert states == ["pending", "running"], states
    one_error_line(vrun("cancel", str(sweep)), "needs confirmation", "--yes")
    c = vrun("cancel", str(sweep), "--yes")
    assert c.returncode == 0, c.stdout + c.stderr
    assert c.stdout.count("cancelled job ") == 2 and c.stdout.count("stopped: ") == 2
    assert [status(d)["state"] for d in points] == ["cancelled", "cancelled"]
    one_error_line(vrun("cancel", str(sweep), "--yes"), "none of the 2 runs is pending or running")


def test_waiting_submission_shows_progress_then_resubmit(shared):
    """cluster.detach=false without a terminal: one line per change, in order — pending/started → nodes joined
    → Ray up → preflight started → completed; `python -m vrun resubmit` runs it again as attempt 1."""
    p = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=preflight", "cluster.ray.join_timeout_s=120",
            "run.task_runner=vrun_probe.ProbeTaskRunner")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = [line for line in p.stdout.splitlines() if line.startswith("job ")]
    order = ["nodes joined", "Ray up", "preflight started", "completed"]
    at = [next(i for i, line in enumerate(lines) if k in line) for k in order]
    assert at == sorted(at), lines
    assert len(lines) == len(set(lines)), "a line repeated without a change"
    (d,) = [x for x in (shared / "sweep").iterdir() if (x / "plan.json").exists()]
    s = status(d)
    assert s["state"] == "completed" and s["attempt"] == 0 and s["gpu_hours"] > 0
    again = vrun("resubmit", str(d))
    assert again.returncode == 0, again.stdout + again.stderr
    s = status(d)
    assert s["state"] == "completed" and s["attempt"] == 1 and len(s["job_ids"]) == 2


def decoy(name: str, chdir) -> str:
    """A job of this user that is not the run's (or is, when name and dir are the run's): sleeps, cancelled after."""
    p = slurm("sbatch", "--parsable", "-J", name, f"--chdir={chdir}", "--output=/dev/null", "-t", "5", "--wrap", "sleep 300")
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def listed(job: str) -> str:
    return slurm("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()


def test_cancel_scancels_only_jobs_squeue_confirms_as_the_runs(shared):
    """A run dir recording a job id (as the submitter records it: slurm_job.json and a `submitted` line with the dir
    sbatch ran in) that SLURM lists under another job name, another work dir or both: cancel refuses in one line
    and the job keeps running; a job with the run's name and dir is cancelled."""
    from vrun.rundir import records

    p = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=plan", "hydra.sweep.subdir=a")
    assert p.returncode == 0, p.stderr[-2000:]
    d = shared / "sweep" / "a"
    name = json.loads((d / "plan.json").read_text())["slurm"]["parameters"]["job_name"]
    # the dirs sbatch runs in: SLURM writes a cancelled job's slurmstepd line there (never the checkout)
    own, elsewhere = shared / "own", shared / "elsewhere"
    own.mkdir()
    elsewhere.mkdir()
    cases = {"another name": ("someone_elses_job", own), "another dir": (name, elsewhere),
             "another name and dir": ("someone_elses_job", elsewhere), "the run's own": (name, own)}
    for case, (job_name, chdir) in cases.items():
        job = decoy(job_name, chdir)
        (d / "slurm_job.json").write_text(json.dumps({"job_id": job, "stdout": "x", "stderr": "y",
                                                      "folder": str(shared / "sweep" / ".submitit" / job)}))
        (d / "progress.jsonl").unlink(missing_ok=True)
        records.record(str(d), "submitted", job_id=job, restart=0, attempt=0, work_dir=str(own))
        wait_for("the job to be listed", lambda: listed(job) in ("PENDING", "RUNNING"), timeout=60)
        c = vrun("cancel", str(d), timeout=180)
        if case == "the run's own":
            assert c.returncode == 0 and f"cancelled job {job}: {d}" in c.stdout and f"stopped: {d}" in c.stdout, \
                c.stdout + c.stderr
            assert listed(job) not in ("PENDING", "RUNNING")
            continue
        line = one_error_line(c, f"run={d}: job {job} ", "nothing cancelled", f"squeue -j {job} -O JobID,Name,WorkDir")
        assert (f"is named 'someone_elses_job' in squeue, not {name!r}" in line) == ("name" in case), (case, line)
        if case == "another dir":
            assert f"runs in {elsewhere} in squeue, not {own}" in line, line
        time.sleep(2)
        assert listed(job) in ("PENDING", "RUNNING"), f"{case}: a job that is not the run's was cancelled"
        assert [e["event"] for e in records.events(str(d))] == ["submitted"]
        slurm("scancel", job)

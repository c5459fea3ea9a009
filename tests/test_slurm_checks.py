"""On a real SLURM cluster (see tests/test_slurm.py): what is caught before sbatch, and a submitter that never
hangs. An incomplete checkpoint refused before sbatch (and, with the login preflight skipped, on the node first
thing); a run dir on node-local storage refused (and, let through, explained when the job writes nothing); a
request larger than the partition refused; sbatch's own refusal mapped and recorded as failed; cancel, a job lost
outside vrun and Ctrl-C returning within seconds without accounting (the harness keeps none; a cluster with
accounting takes the same path: the outcome comes from the run dir and squeue); a failing job's root cause in
`status` and the submitter's last line.
"""
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import PY, ROOT
from test_runs_slurm import cancel_leftovers, own_index, status, vrun, wait_for  # noqa: F401 - fixtures
from test_slurm import NOT_SHARED, TWO_NODES, WRAP, run, shared, slurm  # noqa: F401 - shared is a fixture

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(WRAP is None, reason="no test SLURM cluster: set VRUN_SLURM_WRAPPER (the CI harness's "
                                 "slx), or VRUN_TEST_SLURM=1 to submit test jobs to the cluster sinfo reaches"),
              pytest.mark.skipif(bool(NOT_SHARED), reason=f"the SLURM nodes cannot run {PY} in {ROOT}: {NOT_SHARED}")]


def queue() -> str:
    return slurm("squeue", "-h", "-o", "%i").stdout


def errors(proc) -> list:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [line for line in proc.stderr.splitlines() if line.startswith("error: ")]


def env_of(shared) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MLITE", "RAY_", "HYDRA_FULL"))}
    e.update(HOME=str(shared / "home"), QWEN3_5_35B_MODEL_PATH=str(shared / "ckpt"),
             PYTHONPATH=str(ROOT / "tests" / "support"))
    return e


def submitter(shared, *overrides) -> subprocess.Popen:
    """A waiting submission (cluster.detach=false) in its own process group, output to files. Ctrl-C's default
    action restored in it: a test run in the background of a shell without job control (CI's legs) inherits
    SIGINT ignored, and Python then never turns it into KeyboardInterrupt."""
    out, err = open(shared / "submit.out", "w"), open(shared / "submit.err", "w")
    return subprocess.Popen(WRAP + [PY, str(ROOT / "runner.py"), "model=qwen3_5_35b", *TWO_NODES, *overrides,
                                    f"hydra.sweep.dir={shared}/sweep"], cwd=ROOT, env=env_of(shared), stdout=out,
                            stderr=err, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def holding_run(shared, *overrides):
    """A waiting submission whose job holds its nodes (their setup lines sleep), once it runs."""
    p = submitter(shared, "mode=preflight", "+cluster.node_setup=['sleep 600']", *overrides)
    d = wait_for("the run dir", lambda: next((x for x in (shared / "sweep").glob("*") if (x / "slurm_job.json")
                                              .exists()), None), timeout=120)
    wait_for("the job to run", lambda: status(d)["state"] == "running", timeout=120)
    return p, d


def ended_within(p: subprocess.Popen, seconds: float) -> float:
    t = time.monotonic()
    p.wait(timeout=seconds + 30)
    took = time.monotonic() - t
    assert took < seconds, f"the submitter took {took:.1f} s to return"
    return took


def test_incomplete_checkpoint_refused_before_sbatch_or_on_the_node(shared):
    """mode=train with a checkpoint dir without weights (and no verl_mlite here): refused before sbatch, one line
    each, nothing submitted or written. With cluster.login_preflight=false it is submitted and every node
    refuses it first thing, the submitter's last line naming the problem."""
    before = queue()
    proc = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=train")
    lines = errors(proc)
    assert proc.returncode == 2 and any(line.startswith(f"error: QWEN3_5_35B_MODEL_PATH={shared}/ckpt: config.json "
                                                        "but no weights") for line in lines), proc.stderr
    assert any("verl_mlite is not importable" in line for line in lines)
    assert all("cluster.login_preflight=false" in line for line in lines if "(checked on this machine" in line)
    assert queue() == before and not (shared / "sweep").exists()

    proc = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=train", "cluster.login_preflight=false",
               "cluster.ray.join_timeout_s=60")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = errors(proc)[-1]
    assert "preflight found" in last and "config.json but no weights" in last and "verl_mlite" in last, last
    d = next((shared / "sweep").glob("0_*"))
    assert status(d)["state"] == "failed"


def test_node_local_run_dir_refused_and_explained(shared):
    """A sweep dir under /tmp (private per node on the harness): refused before sbatch naming the path and the
    knob. Let through (cluster.node_local_paths=[]), the job cannot even open its log on the node: the submitter
    returns within seconds saying so, and `logs` names the path."""
    tmp = Path("/tmp") / f"vrun-local-{uuid.uuid4().hex[:8]}"
    before = queue()
    args = WRAP + [PY, str(ROOT / "runner.py"), "model=qwen3_5_35b", *TWO_NODES, "mode=preflight",
                   f"hydra.sweep.dir={tmp}"]
    try:
        proc = subprocess.run(args, cwd=ROOT, env=env_of(shared), capture_output=True, text=True, timeout=300)
        lines = errors(proc)
        assert proc.returncode == 2 and [line.split("=", 1)[0] for line in lines] == [
            "error: hydra.sweep.dir", "error: hydra.launcher.submitit_folder"], proc.stderr
        assert lines[0].startswith(f"error: hydra.sweep.dir={tmp}/0_") and \
            "under /tmp, storage private to each node (cluster.node_local_paths)" in lines[0], proc.stderr
        assert queue() == before and not tmp.exists()

        t = time.monotonic()
        proc = subprocess.run(args + ["cluster.node_local_paths=[]"], cwd=ROOT, env=env_of(shared),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and time.monotonic() - t < 120, proc.stdout[-2000:] + proc.stderr[-2000:]
        last = errors(proc)[-1]
        assert "without writing its log" in last and "the nodes likely cannot see" in last, last
        (d,) = [x for x in tmp.iterdir() if (x / "plan.json").exists()]
        logs = vrun("logs", str(d))
        assert "SLURM never wrote" in logs.stderr, logs.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_request_larger_than_the_partition_and_sbatch_refusals(shared):
    """4 nodes on the 3-node partition, 8 GPUs on 4-GPU nodes, an unknown partition: refused before sbatch with the
    partition's own numbers. sbatch's own refusal (a feature no node has) is one line, and the run is recorded as
    failed, not planned."""
    before = queue()
    four = ["mesh=8gpu", "mesh.nnodes=4", "mesh.gpus_per_node=2", "cluster=slurm", "hydra/launcher=submitit_slurm"]
    proc = run(shared, "model=qwen3_5_35b", *four, "mode=preflight", "mesh.tp=1")
    lines = errors(proc)
    assert proc.returncode == 2 and any(line.startswith("error: mesh.nnodes=4: partition debug has 3 node(s)")
                                        for line in lines), proc.stderr
    proc = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=preflight", "cluster.partition=nope")
    assert proc.returncode == 2 and "error: cluster.partition=nope: no such partition (this cluster has debug)" \
        in proc.stderr, proc.stderr
    assert queue() == before and not (shared / "sweep").exists()

    proc = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=preflight", "cluster.constraint=nosuchfeature")
    (line,) = errors(proc)
    assert proc.returncode == 2 and "sbatch" in line and "; fix: " in line, proc.stderr
    (row,) = json.loads(vrun("runs", str(shared / "sweep"), "--json").stdout)
    assert row["state"] == "failed" and "not submitted" in row["phase"], row


def test_cancel_lost_and_ctrl_c_return_within_seconds(shared):
    """A waiting submitter whose job is cancelled with `python -m vrun cancel`, or killed outside vrun (scancel),
    returns within 15 s with the state and the next command; Ctrl-C detaches in one line and the job keeps
    running. No accounting here: said once, in words."""
    p, d = holding_run(shared)
    assert vrun("cancel", str(d)).returncode == 0
    ended_within(p, 15)
    out, err = (shared / "submit.out").read_text(), (shared / "submit.err").read_text()
    assert p.returncode == 2 and f"cancelled with python -m vrun cancel; fix: python -m vrun resubmit {d}" in \
        err.splitlines()[-1], err
    assert out.count("keeps no job accounting") == 1 and "Bypassing sacct" not in out + err
    shutil.rmtree(shared / "sweep")

    p, d = holding_run(shared)
    slurm("scancel", status(d)["job_id"])
    ended_within(p, 15)
    last = (shared / "submit.err").read_text().splitlines()[-1]
    # SLURM's record (or, past MinJobAge, the job's own log) says it was cancelled from outside, never a failure
    assert p.returncode == 2 and "error: slurm=cancelled: job" in last and \
        "cancelled outside vrun (scancel) while running" in last, last
    shutil.rmtree(shared / "sweep")

    p, d = holding_run(shared)
    os.killpg(p.pid, signal.SIGINT)
    ended_within(p, 15)
    err = (shared / "submit.err").read_text()
    job = status(d)["job_id"]
    assert p.returncode == 130 and err.strip().splitlines() == [
        f"detached: job {job} keeps running; python -m vrun status {d} / python -m vrun cancel {d}"], err
    assert job in queue() and status(d)["state"] == "running"
    assert vrun("cancel", str(d)).returncode == 0


def test_failing_job_carries_its_root_cause(shared):
    """A driver that dies on a missing module: the submitter's last line, `status` and `runs` carry the
    ModuleNotFoundError from the node's log, not only the exit code."""
    proc = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=train", "run.task_runner=no_such_module.Runner")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    cause = "ModuleNotFoundError: No module named 'no_such_module'"
    assert cause in errors(proc)[-1], proc.stderr[-2000:]
    d = next((shared / "sweep").glob("0_*"))
    text = vrun("status", str(d)).stdout
    assert f"failed   on n0: the driver exited 1: {cause}" in text, text
    (row,) = json.loads(vrun("runs", str(d), "--json").stdout)
    assert cause in row["failure"]["error"]

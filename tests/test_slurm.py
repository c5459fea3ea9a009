"""Multi-node on a real SLURM cluster: submission through the submitit launcher, Ray brought up inside the
allocation, torchrun across nodes, a node that never joins, requeue, and a sweep with one bad point.

Runs against $VRUN_SLURM_WRAPPER (the CI harness's `slx`, which runs clients in its controller namespace), or the
cluster plain `sinfo` reaches when VRUN_TEST_SLURM=1 says so (these tests submit jobs: never to a user's cluster
by accident); skips with one line otherwise. The CI
harness declares 4 GPUs per node (GRES on stand-in devices): Ray is told the GPU count, nothing is detected.
Run dirs live under the checkout (<repo>/.slurm-test), which every node sees; /tmp is private per node.
"""
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import PY, ROOT, processes_of

SHARED = ROOT / ".slurm-test"


def _wrapper() -> list:
    w = os.environ.get("VRUN_SLURM_WRAPPER")
    if w and Path(w).exists():
        prefix = [w]
    elif shutil.which("sinfo") and os.environ.get("VRUN_TEST_SLURM") == "1":
        prefix = []
    else:
        return None
    try:
        ok = subprocess.run(prefix + ["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else None


def _nodes_see_checkout(prefix) -> str:
    """Jobs run this checkout's Python on the nodes: it must be on storage they share (not a private /tmp).
    Returns '' when they do, else why not (a cluster just started may need a few seconds)."""
    why = ""
    for _ in range(6):
        try:
            p = subprocess.run(prefix + ["srun", "-N1", "-t", "2", "test", "-x", PY, "-a", "-d", str(ROOT / "vrun")],
                               capture_output=True, text=True, timeout=60)
            if p.returncode == 0:
                return ""
            why = f"srun exited {p.returncode}: {p.stderr.strip()[-200:]}"
        except (OSError, subprocess.TimeoutExpired) as e:
            why = str(e)
        time.sleep(5)
    return why


WRAP = _wrapper()
NOT_SHARED = _nodes_see_checkout(WRAP) if WRAP is not None else ""
pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(WRAP is None, reason="no test SLURM cluster: set VRUN_SLURM_WRAPPER (the CI harness's slx), "
                                 "or VRUN_TEST_SLURM=1 to submit test jobs to the cluster sinfo reaches"),
              pytest.mark.skipif(bool(NOT_SHARED), reason=f"the SLURM nodes cannot run {PY} in {ROOT} "
                                 f"(a per-node /tmp?): {NOT_SHARED}")]


def slurm(*args, timeout=60):
    return subprocess.run(WRAP + list(args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def shared(request):
    d = SHARED / request.node.name
    shutil.rmtree(d, ignore_errors=True)
    (d / "home" / "data" / "geo3k").mkdir(parents=True)
    (d / "home" / "data" / "gsm8k").mkdir(parents=True)
    for f in ("geo3k/train", "geo3k/test", "gsm8k/train", "gsm8k/test"):
        (d / "home" / "data" / f"{f}.parquet").write_bytes(b"")
    (d / "ckpt").mkdir()
    (d / "ckpt" / "config.json").write_text("{}")
    yield d
    # the submitter returns once the job has said how it ended; the nodes stop their children within seconds
    # after. <defunct> entries are exited processes this container's init has not reaped: nothing runs
    # (the job's processes inherit HOME=<this test's dir>/home; another test's Ray on this machine is not counted)
    deadline = time.monotonic() + 60
    while True:
        left = processes_of("raylet|gcs_server|vrun_dist_probe|sleep 600", str(d))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not left, left


def run(shared, *overrides, env=None, timeout=400, sweep="sweep"):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MLITE", "RAY_"))}
    e.update(HOME=str(shared / "home"), QWEN3_5_35B_MODEL_PATH=str(shared / "ckpt"),
             FLASH_MODEL_PATH=str(shared / "ckpt"), PYTHONPATH=str(ROOT / "tests" / "support"))
    e.update(env or {})
    e.pop("HYDRA_FULL_ERROR", None)
    sweep_dir = f"hydra.sweep.dir={shared}/{sweep}" if " " not in sweep else f"hydra.sweep.dir='{shared}/{sweep}'"
    return subprocess.run(WRAP + [PY, str(ROOT / "runner.py"), *overrides, sweep_dir],
                          cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)


TWO_NODES = ["mesh=8gpu", "mesh.nnodes=2", "mesh.gpus_per_node=4", "cluster=slurm", "hydra/launcher=submitit_slurm",
             "cluster.time_min=15"]


# the harness tests bring-up, not memory: DeepSeek-V4-Flash SFT on 2×4 GPUs does not fit (the plan says so)
OVERRUN = ["run.allow_memory_overrun=true"]


def _logs(d) -> str:
    """The tail of every log under d (a sweep dir: its runs' files and submitit's per-node logs): what a failed
    assertion shows beside the submitter's output."""
    out = []
    for f in sorted(d.rglob("*")):
        if f.is_file() and f.suffix in (".out", ".err", ".log", ".jsonl"):
            out.append(f"\n--- {f.relative_to(d)}\n" + f.read_text(errors="replace")[-1500:])
    return "".join(out)


def only_dir(shared):
    (d,) = [p for p in (shared / "sweep").iterdir() if not p.name.startswith(".")]
    return d


def test_grpo_preflight_brings_up_ray_on_both_nodes(shared):
    """mode=preflight: Ray on both nodes, verl's run_ppo reached with the inspecting task runner, the config
    and the run's variables seen by a Ray worker on each node, ROCR unset where CUDA_VISIBLE_DEVICES is set.
    The harness's nodes cannot train (no GPU behind the GRES, no verl_mlite or vLLM in this environment): the
    preflight counts that as problems, fails the job and the submitter prints them."""
    proc = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=preflight", "cluster.ray.join_timeout_s=120")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    d = only_dir(shared)
    assert (d / "preflight.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:] + _logs(shared / "sweep")
    report = json.loads((d / "preflight.json").read_text())
    assert sorted(n["host"] for n in report["nodes"]) == ["n0", "n1"]
    for host in ("n0", "n1"):
        assert f"{host}: python module vllm is not importable (the run imports it)" in report["problems"]
        assert any(p.startswith(f"{host}: torch sees 0 GPU(s) of the 4 Ray gives (CUDA_VISIBLE_DEVICES=") and
                   p.endswith("): no usable GPU or driver") for p in report["problems"]), report["problems"]
        assert f"  {host}: python module vllm is not importable (the run imports it)" in proc.stdout
    assert f"preflight: {len(report['problems'])} problem(s) on the nodes:" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("error: slurm=failed: job ") and "Traceback" not in \
        proc.stderr, proc.stderr[-2000:]
    st = subprocess.run(WRAP + [PY, "-m", "vrun", "status", str(d)], cwd=ROOT, capture_output=True, text=True,
                        timeout=120).stdout
    assert f"preflight {len(report['problems'])} problem(s):" in st and "  n1: python module vllm" in st, st
    for node in report["nodes"]:
        assert node["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and node["env"]["VLLM_USE_V1"] == "1"
        assert len(node["ray_gpu_ids"]) == 4 and node["cuda_visible_devices"]
        assert "ROCR_VISIBLE_DEVICES" not in node["env"]
        assert all(p["readable"] for p in node["paths"].values())
    assert report["config"] == yaml.safe_load((d / "verl_config.yaml").read_text())
    bringup = json.loads(next((d / ".vrun").glob("*/bringup.json")).read_text())
    assert bringup["nodes"] == 2


def test_sft_torchrun_on_both_nodes(shared):
    """SFT: torchrun on each node with consistent ranks and master; a gloo all-reduce across the nodes. The sweep
    dir has a space and a non-ASCII letter: sbatch takes the job's quoted paths, and each rank's command line, read
    as verl's SFT CLI reads it, gives the run dir back unchanged."""
    proc = run(shared, "model=qwen3_5_35b", "algo=sft", *TWO_NODES, "mode=train",
               "run.sft_entry=[vrun_dist_probe]", *OVERRUN, sweep="sweep sp é")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (d,) = [p for p in (shared / "sweep sp é").iterdir() if not p.name.startswith(".")]
    ranks = [json.loads(p.read_text()) for p in sorted(d.glob("dist_rank*.json"))]
    assert {r["hydra_run_dir"] for r in ranks} == {f"{d}/sft"}
    assert len(ranks) == 8 and all(r["world"] == 8 and r["sum"] == 36.0 for r in ranks)
    assert {r["host"] for r in ranks} == {"n0", "n1"} and len({r["master"] for r in ranks}) == 1
    assert {r["node_rank"] for r in ranks if r["host"] == "n1"} == {1}


def test_worker_that_never_joins_fails_the_job(shared):
    """A node that never joins: the job fails within cluster.ray.join_timeout_s, naming it; nothing is left."""
    t = time.monotonic()
    proc = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=preflight", "cluster.ray.join_timeout_s=20",
               "+cluster.node_setup=['if [ \"$SLURM_NODEID\" = 1 ]; then sleep 600; fi']")
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "1 of 2 node(s) joined the Ray head; missing: n1" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - t < 200
    assert "Traceback" not in proc.stderr


def test_requeue_keeps_the_run_dir_and_resumes(shared):
    """A job signalled before its time limit is requeued: same run dir, attempt 1, verl set to resume."""
    proc = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=preflight", "cluster.detach=true",
               "run.task_runner=vrun_probe.ProbeTaskRunner",
               "+cluster.node_setup=['if [ \"$VRUN_ATTEMPT\" = 0 ]; then sleep 600; fi']")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    d = only_dir(shared)
    job = json.loads((d / "slurm_job.json").read_text())["job_id"]
    attempts = d / "slurm_attempts.jsonl"
    deadline = time.monotonic() + 120
    while not attempts.exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert attempts.exists(), "the job never started"
    time.sleep(3)
    slurm("scancel", "--signal=USR2", job)
    deadline = time.monotonic() + 240
    lines = []
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in attempts.read_text().splitlines()]
        if len(lines) >= 2 and (d / "probe.json").exists():
            break
        time.sleep(2)
    assert [x["attempt"] for x in lines][:2] == [0, 1] and {x["job_id"] for x in lines} == {job}
    assert yaml.safe_load((d / "verl_config.yaml").read_text())["trainer"]["resume_mode"] == "auto"
    for _ in range(90):
        if not slurm("squeue", "-h", "-j", job).stdout.strip():
            break
        time.sleep(2)
    # one command submits the run dir again: same config, same run dir, verl resumes
    again = subprocess.run(WRAP + [PY, "-m", "vrun.launch.slurm.submit", "resubmit", str(d)], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    lines = [json.loads(x) for x in attempts.read_text().splitlines()]
    assert lines[-1]["attempt"] == 2 and lines[-1]["job_id"] != job


def test_sweep_with_one_invalid_point_submits_nothing(shared):
    """A 3-point -m sweep with one invalid mesh: nothing submitted, the point named."""
    ids = lambda: set(slurm("squeue", "-h", "-o", "%i").stdout.split())  # noqa: E731 - other jobs may end meanwhile
    before = ids()
    proc = run(shared, "-m", "model=qwen3_5_35b", "mesh.cp=8,3,4", *TWO_NODES, "mode=train")
    assert proc.returncode == 2 and "1 of 3 point(s) do not plan; nothing was run" in proc.stderr
    assert any(line.startswith("point 1 [") and "mesh.cp=3" in line for line in proc.stderr.splitlines())
    assert not (shared / "sweep").exists() and not ids() - before


def test_a_node_that_fails_fails_the_job_at_once(shared):
    """A worker whose setup fails: the head stops waiting for it (well inside join_timeout_s=300) and the job
    fails naming that node's error; nothing is left behind."""
    t = time.monotonic()
    proc = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=preflight", "cluster.ray.join_timeout_s=300",
               "+cluster.node_setup=['if [ \"$SLURM_NODEID\" = 1 ]; then exit 3; fi']")
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "cluster.node_setup failed on node 1 (n1) with exit code 3" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - t < 200 and "Traceback" not in proc.stderr


def test_sft_master_that_fails_releases_the_other_nodes(shared):
    """SFT: node 0 fails before publishing its address; the other node stops waiting instead of holding the
    allocation until the time limit."""
    t = time.monotonic()
    proc = run(shared, "model=qwen3_5_35b", "algo=sft", *TWO_NODES, "mode=train",
               "run.sft_entry=[vrun_dist_probe]", *OVERRUN, "+cluster.node_setup=['if [ \"$SLURM_NODEID\" = 0 ]; then exit 4; fi']")
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "cluster.node_setup failed on node 0 (n0) with exit code 4" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - t < 200 and "Traceback" not in proc.stderr

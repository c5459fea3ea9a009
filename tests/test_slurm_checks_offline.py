"""What the SLURM checks decide without a cluster: SLURM's time and gres spellings, the request against a
partition as scontrol describes it, a log's decisive line, the storage refusal (before any SLURM client is
asked), and `python -m vrun` without a verb listing the verbs. The same paths against a real cluster:
tests/test_slurm_checks.py."""
import os
import subprocess
from pathlib import Path

import pytest

from conftest import PY, ROOT, runner

from vrun.rundir.cause import decisive_line, pending_words
from vrun.launch.slurm.submit import Submission
from vrun.launch.slurm.checks import Partition, gres_gpus, minutes, partition_problems

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml


def test_slurm_spellings():
    assert [minutes(t) for t in ("UNLIMITED", "30", "1:00:00", "2-00:00:00", "00:30", "1:00:01")] == \
        [None, 30, 60, 2880, 1, 61]  # minutes:seconds rounds up
    assert [gres_gpus(g) for g in ("gpu:4", "gpu:h100:8(S:0-1)", "gpu:a100:4,nic:1", "(null)")] == [4, 8, 4, 0]
    assert pending_words("PartitionNodeLimit").startswith("PartitionNodeLimit: more nodes than the partition")
    assert pending_words("SomethingNew") == "SomethingNew"


def test_request_against_the_partition():
    sub = Submission({"nodes": 4, "gpus_per_node": 8, "time": 600, "partition": "gpu"}, 0)
    parts = [Partition("debug", 3, None, 60, 4, default=True), Partition("gpu", 3, 2, 480, 4)]
    lines = [p.line() for p in partition_problems(sub, parts)]
    assert lines[0].startswith("error: mesh.nnodes=4: partition gpu has 2 node(s)")
    assert lines[1].startswith("error: mesh.gpus_per_node=8: the nodes of partition gpu have at most 4 GPU(s)")
    assert lines[2].startswith("error: cluster.time_min=600: partition gpu allows at most 480 min")
    other = Submission({"nodes": 1, "gpus_per_node": 4, "time": 30, "partition": "nope"}, 0)
    assert partition_problems(other, parts)[0].line().startswith(
        "error: cluster.partition=nope: no such partition (this cluster has debug, gpu)")
    fits = Submission({"nodes": 3, "gpus_per_node": 4, "time": 60}, 0)  # the default partition
    assert partition_problems(fits, parts) == []


def test_decisive_line_of_a_log():
    log = ["entry: verl's validate_config skipped (No module named 'verl_mlite')",
           "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
           "RuntimeError: the driver exited 1 (see the job log)",
           "(TaskRunner pid=12, ip=10.0.0.1) ValueError: bad batch",
           "ModuleNotFoundError: No module named 'fla'"]
    assert decisive_line(log) == "ModuleNotFoundError: No module named 'fla'"
    assert decisive_line(log[:5]) == "ValueError: bad batch"
    assert decisive_line(["slurmstepd: error: Detected 1 oom-kill event(s) in StepId=3.0", "ValueError: x"]) == \
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=3.0"
    assert decisive_line(["all good"]) is None


def test_node_local_run_dir_refused_before_any_slurm_client(tmp_path):
    """A run dir under /tmp (cluster.node_local_paths' default): the run dir, and the job's folder in it, are
    refused in one line each, and so are the checkout, the venv and the checkpoint where they are under it too (a
    clone in /tmp); nothing is written."""
    import sys

    from vrun.config.schema import Cluster

    local = Cluster().node_local_paths

    def node_local(p) -> bool:
        return any(str(p) == d or str(p).startswith(d + "/") for d in local)

    base = tmp_path if node_local(tmp_path) else Path("/tmp")  # pytest's tmp_path is under /tmp unless TMPDIR moves it
    sweep = base / f"vrun-node-local-{os.getpid()}"
    proc = runner("model=qwen3_5_35b", "cluster=slurm", "mode=preflight", f"hydra.sweep.dir={sweep}")
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    keys = [line.split("=", 1)[0].removeprefix("error: ") for line in lines]
    assert keys[:2] == ["hydra.sweep.dir", "hydra.launcher.submitit_folder"], lines
    # a checkout under /tmp: its own refusal, and its venv's and its default checkpoint path's where under it too
    assert ("checkout" in keys) == node_local(Path(ROOT).resolve()), lines
    assert ("venv" in keys) == node_local(Path(sys.prefix).resolve()), lines
    assert set(keys[2:]) <= {"checkout", "venv", "QWEN3_5_35B_MODEL_PATH"}, lines
    assert "storage private to each node (cluster.node_local_paths)" in lines[0]
    assert not sweep.exists()


def test_no_verb_lists_the_verbs():
    p = subprocess.run([PY, "-m", "vrun"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    for verb in ("runs", "status", "logs", "cancel", "diff", "export", "resubmit"):
        assert verb in p.stderr


def test_node_local_paths_given_with_tilde_or_relative(tmp_path):
    """`~/scratch` is expanded before the run dir is compared with it (a run dir there is refused before sbatch);
    a relative entry, which would never match an absolute path, is refused as the knob's own error; a run dir with
    a space outside every node-local path is legal beside them."""
    home = tmp_path / "home"
    (home / "scratch").mkdir(parents=True)
    env = {**os.environ, "HOME": str(home), "VRUN_STATE_DIR": str(tmp_path / "state")}
    proc = runner("model=qwen3_5_35b", "cluster=slurm", "mode=preflight", "cluster.node_local_paths=['~/scratch']",
                  f"hydra.sweep.dir={home}/scratch/run", env=env)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and lines and lines[0].startswith(f"error: hydra.sweep.dir={home}/scratch/run/"), \
        proc.stderr
    assert "under " + str(home / "scratch") in lines[0] and not (home / "scratch" / "run").exists()
    for given in ("scratch", "./scratch", "'~nosuchuser4711/x'"):
        proc = runner("model=qwen3_5_35b", "cluster=slurm", "mode=plan", f"cluster.node_local_paths=[{given}]",
                      f"hydra.sweep.dir={tmp_path}/r", env=env)
        assert proc.returncode == 2 and proc.stderr.startswith("error: cluster.node_local_paths[0]="), proc.stderr
        assert "a relative path" in proc.stderr and not (tmp_path / "r").exists()
    spaced = tmp_path / "shared dir" / "run"
    proc = runner("model=qwen3_5_35b", "cluster=slurm", "mode=plan", "cluster.node_local_paths=['~/scratch']",
                  f"hydra.sweep.dir='{spaced}'", env=env)
    assert proc.returncode == 0 and list(spaced.rglob("plan.json")), proc.stderr[-2000:]

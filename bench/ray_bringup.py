"""Ray bring-up inside a SLURM allocation (task start → every node alive), measured on whatever SLURM is
reachable ($VRUN_SLURM_WRAPPER or sinfo), next to the fixed sleeps of verl's ray_on_slurm.slurm for the same
node count (10 s after the head + 5 s per extra node, on top of Ray's own start). Goal: Ray's own start
(the 1-node figure) + at most 2 s, flat in the node count."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def wrapper():
    w = os.environ.get("VRUN_SLURM_WRAPPER", "/var/tmp/slurmci/bin/slx")
    # a user's own cluster only when asked (VRUN_TEST_SLURM=1): the bench submits jobs
    prefix = [w] if Path(w).exists() else ([] if shutil.which("sinfo") and os.environ.get("VRUN_TEST_SLURM") == "1"
                                           else None)
    if prefix is None:
        return None
    ok = subprocess.run(prefix + ["sinfo", "-h"], capture_output=True).returncode == 0
    return prefix if ok else None


def idle_nodes(prefix) -> int:
    out = subprocess.run(prefix + ["sinfo", "-h", "-N", "-t", "idle,mix", "-o", "%N"], capture_output=True, text=True)
    return len(set(out.stdout.split()))


def run_dir_env(d: Path) -> dict:
    """A fresh directory on shared storage for a qwen3_5_35b GRPO job (HOME with geo3k's files, a checkpoint dir) and
    the environment that points the plan at it."""
    shutil.rmtree(d, ignore_errors=True)
    (d / "home" / "data" / "geo3k").mkdir(parents=True)
    for f in ("train", "test"):
        (d / "home" / "data" / "geo3k" / f"{f}.parquet").write_bytes(b"")
    (d / "ckpt").mkdir()
    (d / "ckpt" / "config.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLITE", "RAY_"))}
    env.update(HOME=str(d / "home"), QWEN3_5_35B_MODEL_PATH=str(d / "ckpt"))
    return env


def bringup(prefix, nodes: int, base: Path) -> dict:
    d = base / f"n{nodes}"
    env = run_dir_env(d)
    cmd = prefix + [PY, "runner.py", "model=qwen3_5_35b", "mesh=8gpu", f"mesh.nnodes={nodes}", "mesh.gpus_per_node=4",
                    f"mesh.cp={4 * nodes}", "mesh.ep=4", "verl.actor_rollout_ref.rollout.tensor_model_parallel_size=4",
                    "cluster=slurm", "mode=preflight", "cluster.time_min=10", f"hydra.sweep.dir={d}/sweep"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    found = list((d / "sweep").glob("*/.vrun/*/bringup.json"))
    # the bring-up is timed before preflight's verdict: on a machine without the training stack (no verl_mlite,
    # vLLM or GPU on the nodes) the preflight refuses the run after Ray came up, and the timing still holds
    if len(found) != 1:
        raise SystemExit(f"bench: {nodes}-node bring-up not recorded (rc {proc.returncode}): {proc.stderr[-800:]}")
    return json.loads(found[0].read_text())


def main():
    prefix = wrapper()
    if prefix is None:
        print("ray bring-up: skipped (no SLURM reachable; CI's harness: NNODES=3 bash ../shared/tools/slurm-ci/setup_cluster.sh)")
        return
    n_max = min(3, idle_nodes(prefix))
    base = ROOT / ".slurm-test" / "bench"
    results = {n: bringup(prefix, n, base) for n in range(1, n_max + 1)}
    own = results[1]["task_start_to_all_alive_s"]
    print(f"ray bring-up, task start → all nodes alive (1 node = Ray's own start here: {own:.1f} s)")
    for n, r in results.items():
        t = r["task_start_to_all_alive_s"]
        verl = own + 10 + 5 * (n - 1)
        print(f"  {n} node(s): {t:5.1f} s   (+{t - own:4.1f} s over 1 node; goal <= +2 s)   verl ray_on_slurm "
              f"sleeps: >= {verl:5.1f} s   ratio {t / verl:.2f}x")


if __name__ == "__main__":
    main()

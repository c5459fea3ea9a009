"""make bench: timings measured side by side in one run on this machine (medians of repeated runs).

1. `runner.py model=glm5_1 mesh=256gpu algo=grpo mode=plan` vs `python -m verl.trainer.main_ppo --cfg job`
   with the same verl groups and overrides (what a launcher costs just to print its config). Goal <= 0.25x.
2. A 64-point plan-only --multirun sweep (every point planned, checked and written). Goal < 10 s.
"""
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def timed(cmd, cwd=ROOT):
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if proc.returncode:
        sys.exit(f"bench: {' '.join(cmd[:4])} … exited {proc.returncode}: {proc.stderr[-500:]}")
    return dt


def main():
    tmp = Path(tempfile.mkdtemp(prefix="vrun-bench-"))
    plan_cmd = [PY, "runner.py", "model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan", f"hydra.run.dir={tmp}/p"]
    timed(plan_cmd)  # warm the file cache
    plan = json.loads((tmp / "p" / "plan.json").read_text())
    verl_cmd = [PY, "-m", "verl.trainer.main_ppo", "--cfg", "job", "hydra.output_subdir=null",
                f"hydra.run.dir={tmp}/v"] + plan["verl_groups"] + plan["verl_overrides"]
    ours, theirs = [], []
    for _ in range(3):
        ours.append(timed(plan_cmd))
        theirs.append(timed(verl_cmd))
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"plan glm5_1/256gpu/grpo      {o:6.2f} s   verl main_ppo --cfg job (same overrides) {t:6.2f} s   "
          f"ratio {o / t:.2f}x (goal <= 0.25x)")

    sweep = [PY, "runner.py", "-m", "model=glm5_1,kimi_k2_6", "optimizer=fsdp2,dist_opt", "mesh.pp=1,2,4,8",
             "verl.data.train_batch_size=128,256,512,1024", "mode=plan"]
    runs = []
    for i in range(2):
        runs.append(timed(sweep + [f"hydra.sweep.dir={tmp}/s{i}"]))
    points = len(list((tmp / "s0").iterdir()))
    s = statistics.median(runs)
    print(f"plan sweep, {points} points      {s:6.2f} s   ({s / points * 1000:.0f} ms/point; goal < 10 s total)")


if __name__ == "__main__":
    main()

"""make bench: timings measured side by side in one run on this machine (medians of repeated runs).

1. `runner.py model=glm5_1 mesh=256gpu algo=grpo mode=plan` vs `python -m verl.trainer.main_ppo --cfg job`
   with the same verl groups and overrides (what a launcher costs just to print its config). Goal <= 0.15x.
   plan.svg is drawn by a background child after the plan exits: the time until it is there is printed too (the
   next command starts only once it is), then the drawing alone.
2. A 64-point plan-only --multirun sweep (every point planned, checked and written). Goal < 10 s and <= 3x one plan.
   A sweep of 100,000 points is refused up front. Goal < 2 s.
3. mesh=auto search time (every valid mesh, each with its memory estimate, and the rollout replica chosen
   beside it) for 8…1024 GPUs and each model. Goal: under 100 ms.
4. `python -m vrun runs` listing a 30-point plan-only sweep from the index (process start to exit). Goal < 1 s.
6. On the same SLURM: a hang's last step to its stall summary, and a stall's requeue to the new job's first
   resumed step (bench/watch.py).
5. Ray bring-up inside a SLURM allocation at 1-3 nodes vs verl's fixed sleeps (bench/ray_bringup.py; needs a
   reachable SLURM, e.g. the CI harness).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
# the same plans whatever the shell exports: no checkpoint paths (a 2-model sweep refuses one MODEL_PATH for both,
# and a checkpoint on disk would add header reads to the figures)
ENV = {k: v for k, v in os.environ.items() if not k.endswith("MODEL_PATH")}
# the bench's runs are indexed in its own state dir, never in the user's
ENV["VRUN_STATE_DIR"] = tempfile.mkdtemp(prefix="vrun-bench-state-")


def timed(cmd, cwd=ROOT):
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=ENV)
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
    ours, drawn, theirs = [], [], []
    for i in range(3):  # a new run dir each time: a dir holding a run is refused (run.resume=true continues it)
        t0 = time.perf_counter()
        ours.append(timed(plan_cmd[:-1] + [f"hydra.run.dir={tmp}/p{i}"]))
        drawn.append(until_drawn(tmp / f"p{i}" / "plan.svg", t0))
        theirs.append(timed(verl_cmd))
    o, d, t = statistics.median(ours), statistics.median(drawn), statistics.median(theirs)
    print(f"plan glm5_1/256gpu/grpo      {o:6.2f} s   verl main_ppo --cfg job (same overrides) {t:6.2f} s   "
          f"ratio {o / t:.2f}x (goal <= 0.15x)")
    print(f"  ... until plan.svg is there {d:6.2f} s   ratio {d / t:.2f}x")
    picture_time(tmp / "p" / "plan.json")

    sweep = [PY, "runner.py", "-m", "model=glm5_1,kimi_k2_6", "optimizer=fsdp2,dist_opt", "mesh.pp=1,2,4,8",
             "verl.data.train_batch_size=128,256,512,1024", "mode=plan",
             "run.allow_memory_overrun=true"]  # planning speed: the points whose estimate is over the GPU plan too
    runs = []
    for i in range(2):
        runs.append(timed(sweep + [f"hydra.sweep.dir={tmp}/s{i}"]))
    points = len(list((tmp / "s0").iterdir()))
    s = statistics.median(runs)
    print(f"plan sweep, {points} points      {s:6.2f} s   ({s / points * 1000:.0f} ms/point; goal < 10 s total); "
          f"{s / o:.1f}x one plan (goal <= 3x)")
    oversized_sweep(tmp)
    list_runs(tmp)
    mesh_search()
    subprocess.run([PY, str(ROOT / "bench" / "ray_bringup.py")], cwd=ROOT, env=ENV)
    subprocess.run([PY, str(ROOT / "bench" / "watch.py")], cwd=ROOT, env=ENV)


def until_drawn(svg: Path, t0: float, timeout: float = 120.0) -> float:
    """Seconds from t0 until the background child's plan.svg is there."""
    while not svg.exists():
        if time.perf_counter() - t0 > timeout:
            sys.exit(f"bench: {svg} not drawn in {timeout:g} s")
        time.sleep(0.02)
    return time.perf_counter() - t0


def picture_time(plan_json: Path) -> None:
    """plan.svg's drawing alone (the plan above waits for it; matplotlib's import runs beside the planning)."""
    code = ("import json, sys, time; from vrun.planning import picture; picture._figure(); "
            "import matplotlib.backends.backend_svg, matplotlib.collections; p = json.load(open(sys.argv[1])); "
            "ts = []\nfor _ in range(3):\n t = time.perf_counter(); picture.render(p, sys.argv[2]); "
            "ts.append(time.perf_counter() - t)\nprint(sorted(ts)[1])")
    out = subprocess.run([PY, "-c", code, str(plan_json), str(plan_json.with_name("bench.svg"))], cwd=ROOT,
                         capture_output=True, text=True, env=dict(ENV, PYTHONPATH=str(ROOT)))
    if out.returncode:
        print(f"plan.svg drawing: not measured ({(out.stderr.strip().splitlines() or ['failed'])[-1]})")
        return
    print(f"plan.svg drawing            {float(out.stdout):6.2f} s   (in the background child, after the plan)")


def oversized_sweep(tmp: Path) -> None:
    """A 100,000-point sweep is refused up front (vrun.checks.composed.MAX_SWEEP_POINTS), before any point is
    composed. Goal: under 2 s, process start to exit."""
    cmd = [PY, "runner.py", "-m", "model=qwen3_5_35b", "mode=plan", "verl.trainer.save_freq=range(0,100000)",
           f"hydra.sweep.dir={tmp}/big"]
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ENV)
    dt = time.perf_counter() - t
    if p.returncode != 2 or "100,000 points" not in p.stderr:
        sys.exit(f"bench: the 100,000-point sweep was not refused: {p.stderr[-500:]}")
    print(f"100,000-point sweep refused  {dt:6.2f} s   (goal < 2 s)")


def list_runs(tmp: Path) -> None:
    """`python -m vrun runs` over a 30-point plan-only sweep, from the index alone (a fresh state dir)."""
    env = dict(ENV, VRUN_STATE_DIR=str(tmp / "state"))
    sweep = [PY, "runner.py", "-m", "model=glm5_1,kimi_k2_6,qwen3_5_35b",
             "verl.trainer.save_freq=1,2,3,4,5,6,7,8,9,10", "mode=plan", "run.allow_memory_overrun=true", f"hydra.sweep.dir={tmp}/r30"]
    if subprocess.run(sweep, cwd=ROOT, capture_output=True, env=env).returncode:
        sys.exit("bench: the 30-point sweep did not plan")
    times = []
    for _ in range(5):
        t = time.perf_counter()
        p = subprocess.run([PY, "-m", "vrun", "runs"], cwd=ROOT, capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - t)
        rows = len(p.stdout.splitlines()) - 1
    if p.returncode or rows != 30:
        sys.exit(f"bench: python -m vrun runs listed {rows} runs, not 30: {p.stderr[-500:]}")
    print(f"vrun runs, 30-point sweep    {statistics.median(times):6.2f} s   (index, process start to exit; "
          f"goal < 1 s)")


def mesh_search():
    sys.path.insert(0, str(ROOT))
    from hydra import compose, initialize_config_dir

    from vrun.planning import plan as planning
    from vrun.config import schema
    from vrun.estimate.mesh import Mesh

    from hydra_plugins.vrun_launcher.vrun_launcher import register

    register()
    models = ["deepseek_v4_flash", "deepseek_v4_pro", "kimi_k2_6", "glm5_1", "qwen3_5_35b"]
    gpus = [8, 64, 256, 512, 1024]
    print("mesh search with the rollout replica (ms; valid meshes; rollout TP·DP chosen), goal < 100 ms")
    print("  " + " " * 30 + "  ".join(f"{g:>20}" for g in gpus))
    # the search itself is timed: meshes that do not fit are ranked, not refused (run.allow_memory_overrun), and
    # DeepSeek-V4-Pro gets a rollout replica that holds its weights (the launcher's TP8 is refused)
    extra = {"deepseek_v4_pro": ["verl.actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                                 "+verl.actor_rollout_ref.rollout.data_parallel_size=16"]}
    for model in models:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            config = schema.typed(compose("run", [f"model={model}", "mode=plan", "run.allow_memory_overrun=true"]
                                          + extra.get(model, [])))
        p = planning.make_plan(config, tempfile.mkdtemp(), environ=ENV)
        params, note, _, counts = planning.model_params(config, p.entrypoint, None, [], p.verl)
        rules = planning.rules_of(config, p.entrypoint, p.verl)
        cells = []
        for g in gpus:
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                _, _, found = planning.auto_mesh(config, p.entrypoint, rules, Mesh(g // 8, 8), p.verl, params, note,
                                                 counts, [])
                best = min(best, time.perf_counter() - t)
            r = found.rollout_tp_choices[0] if found.rollout_tp_choices else None
            cells.append(f"{best * 1000:5.1f}; {found.valid_meshes:5d}; "
                         + (f"TP{r['tp']}·DP{r['dp']}" if r else "-"))
        print(f"  {model:<30}" + "  ".join(f"{x:>20}" for x in cells))


if __name__ == "__main__":
    main()

"""A hang on the SLURM harness, timed: from the last step before the hang to the stall's summary in the run's
record (the bound run.stall_after_s, then the diagnosis on every node), and from the requeue (run.on_stall=requeue,
the odd rank's node excluded) to the first step the new job prints after resuming. Two nodes, the stand-in trainer
(tests/support/vrun_standin.py) hanging rank 5 in data loading at step 4. Needs a reachable SLURM (as
bench/ray_bringup.py)."""
import json
import subprocess
import sys
import time
from pathlib import Path

from ray_bringup import PY, ROOT, run_dir_env, wrapper

STALL_S = 15


def main():
    prefix = wrapper()
    if prefix is None:
        print("stall → summary, requeue → resumed step: skipped (no SLURM reachable)")
        return
    d = ROOT / ".slurm-test" / "bench-watch"
    env = run_dir_env(d)
    env.update(VRUN_STATE_DIR=str(d / "state"), PYTHONPATH=str(ROOT / "tests" / "support"))
    cmd = prefix + [PY, "runner.py", "model=qwen3_5_35b", "mesh=8gpu", "mesh.nnodes=2", "mesh.gpus_per_node=4",
                    "cluster=slurm", "mode=train", "cluster.detach=true", "cluster.time_min=15",
                    "run.task_runner=vrun_standin.StandinTaskRunner", f"run.stall_after_s={STALL_S}",
                    "run.stall_grace_s=0", "run.on_stall=requeue", f"hydra.sweep.dir={d}/sweep",
                    "hydra.sweep.subdir=run"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise SystemExit(f"bench: watch: submission failed: {p.stderr[-800:]}")
    run = d / "sweep" / "run"
    (run / "standin.json").write_text(json.dumps({"steps": 1000, "step_s": 1.0, "save_freq": 2,
                                                  "hang": {"rank": 5, "step": 4, "where": "data"}}))

    def events():
        try:
            return [json.loads(x) for x in (run / "progress.jsonl").read_text().splitlines()]
        except (OSError, ValueError):
            return []

    deadline = time.monotonic() + 600
    stalled = act = None
    resumed_step_s = None
    try:
        while time.monotonic() < deadline:
            evs = events()
            stalled = stalled or next((e for e in evs if e["event"] == "stalled"), None)
            act = act or next((e for e in evs if e["event"] == "stall_action"), None)
            if act:
                jobs = [e["job_id"] for e in evs if e["event"] == "submitted"]
                if len(jobs) > 1:
                    log = next(iter((run.parent / ".submitit").glob(f"{jobs[-1]}/*_0_log.out")), None)
                    if log is not None and " step:3 - " in log.read_text(errors="replace"):
                        resumed_step_s = time.time() - act["t"]
                        break
            time.sleep(0.5)
    finally:
        subprocess.run(prefix + [PY, "-m", "vrun", "cancel", str(run), "--yes"], cwd=ROOT, env=env,
                       capture_output=True, timeout=300)
    if stalled is None:
        raise SystemExit("bench: watch: no stall was reported")
    hang_to_summary = stalled["quiet_s"] + stalled["diagnosis_s"]
    print(f"stall → summary: {hang_to_summary:.1f} s after the last step (bound {STALL_S} s + diagnosis "
          f"{stalled['diagnosis_s']:.1f} s on 2 nodes; goal: bound + 60 s): {stalled['summary']}")
    if resumed_step_s is None:
        print("requeue → first resumed step: not reached within 10 min")
    else:
        print(f"requeue → first resumed step: {resumed_step_s:.1f} s (a new 2-node job without the odd node: queue, "
              f"Ray bring-up, the stand-in's start, the resume check)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()

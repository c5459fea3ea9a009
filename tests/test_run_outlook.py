"""A run's own ETA and cost on a real run: the stand-in trainer (tests/support/vrun_standin.py: rank actors in a real
local Ray instance, a gloo all_reduce per step, verl's own Tracking printing verl's step lines, checkpoints in
verl's layout) trains on this machine; `status` and `runs` read its run dir while it trains and after it ended:
step N of the plan's total, the ETA of the last step, GPU-hours spent and projected. Planned again into the same dir
(run.resume=true) at its last checkpoint, the stand-in resumes and exits 0 after 0 steps: failed, not completed."""
import json
import subprocess
import time

import pytest

from conftest import PY, ROOT, processes_of

pytestmark = [pytest.mark.ray, pytest.mark.stack_free]  # the project's outlook of a stand-in run: one CI leg

ARGS = ["model=qwen3_5_35b", "mesh=8gpu", "mesh.nnodes=1", "mesh.gpus_per_node=4", "mesh.cp=4", "mesh.ep=4",
        "verl.actor_rollout_ref.rollout.tensor_model_parallel_size=4", "mode=train", "cluster=local",
        "cluster.ray.num_gpus=4", "cluster.ray.num_cpus=2", "run.task_runner=vrun_standin.StandinTaskRunner",
        "verl.trainer.total_training_steps=20"]


def vrun(env, *args):
    return subprocess.run([PY, "-m", "vrun", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def train(env, run, cues, *extra):
    return subprocess.Popen([PY, str(ROOT / "runner.py"), *ARGS, *extra, f"hydra.run.dir={run}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_status_and_runs_show_the_step_eta_and_gpu_hours_of_a_real_run(tmp_path):
    from test_handoff import grpo_env

    pytest.importorskip("verl.utils.tracking")
    run = tmp_path / "run"
    env = dict(grpo_env(tmp_path), VRUN_STATE_DIR=str(tmp_path / "state"), CUDA_VISIBLE_DEVICES="0,1,2,3")
    env.pop("WANDB_API_KEY")
    cues = {"steps": 8, "step_s": 2.0, "save_freq": 4}
    proc = train(env, run, cues)
    seen = None
    try:
        deadline = time.monotonic() + 60
        while not run.is_dir():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        (run / "standin.json").write_text(json.dumps(cues))
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:  # read while it trains
            s = json.loads(vrun(env, "status", "--json", str(run)).stdout)
            o = s["outlook"]
            if s["state"] == "running" and (o["step"] or 0) >= 3:
                seen = (s, o, vrun(env, "status", str(run)).stdout, vrun(env, "runs", str(run)).stdout)
                break
            time.sleep(1)
        out = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert seen is not None, "status never saw the run training at step 3 or later"
    s, o, text, table = seen
    assert o["total"] == 20 and o["step"] >= 3 and o["pace_from"].startswith("measured over"), o
    assert o["eta"] is not None and o["eta"] > time.time() - 600 and o["pace_s"] >= 1.0, o
    assert 0 < o["spent_gpu_hours"] < o["projected_gpu_hours"], o
    line = next(x for x in text.splitlines() if x.startswith("progress "))
    assert line.startswith(f"progress step {o['step']} of 20 (") and "s/step (measured over" in line, text
    assert "the last step ≈" in line, line
    assert "gpu-h    " in text and "projected to step 20" in text and "phases   rollout" in text, text
    head, row = table.splitlines()[:2]
    assert "STEP" in head and "ETA" in head and "GPU-H (SPENT/PROJ)" in head, table
    assert f" {o['step']}/20 " in row or f" {o['step'] + 1}/20 " in row, table
    # ended: step 8 of 20 measured, the GPU-hours spent and the rest projected on the measured pace
    done = json.loads(vrun(env, "status", "--json", str(run)).stdout)
    assert done["state"] == "completed" and done["outlook"]["step"] == 8 and done["outlook"]["eta"] is None, done
    assert done["outlook"]["projected_gpu_hours"] > done["outlook"]["spent_gpu_hours"] > 0
    assert done["checkpoint_step"] == 8
    assert " 8/20 " in vrun(env, "runs", str(run)).stdout
    # the same run again: it resumes from global_step_8, where the stand-in has no step left, and exits 0; the
    # runner says it trained nothing and exits 1
    again = train(env, run, cues, "run.resume=true")
    out = again.communicate(timeout=400)[0]
    assert again.returncode == 1, out[-3000:]
    assert "Resuming from" in out, out[-3000:]
    assert "error: run=" in out and ": exited 0 after 0 steps (resumed from global_step_8" in out, out[-3000:]
    s = json.loads(vrun(env, "status", "--json", str(run)).stdout)
    assert s["state"] == "failed" and s["phase"].startswith("exited 0 after 0 steps (resumed from global_step_8 of 20")
    assert "failed   on " in vrun(env, "status", str(run)).stdout
    left = processes_of("vrun_standin|raylet|gcs_server", str(tmp_path))
    assert not left, left

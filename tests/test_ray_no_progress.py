"""Restarts that make no progress stop on cluster=ray: a real two-node Ray cluster (the session's ray4 in tests/conftest.py),
the stand-in trainer hanging rank 1 at step 2, before its first save, with run.on_stall=requeue and
cluster.max_requeues=5. With cluster.no_progress_attempts=1 the stall's resubmission is not made: the job's own entry
records `stopped` (`1 attempt ended before step 4's checkpoint; stopped`) and ends the job (FAILED, exit 3), and
status says so. Only the processes started here are stopped (by their pids)."""
import json
import subprocess

import pytest

from conftest import PY, ROOT, runner
from test_handoff import grpo_env
from test_ray_watch import events, jobs
from test_rayjobs import wait

pytestmark = [pytest.mark.stack_free, pytest.mark.ray]


def test_a_stalls_resubmission_without_progress_is_not_made(ray4, tmp_path):
    env = dict(grpo_env(tmp_path), RAY_ADDRESS=ray4, VRUN_STATE_DIR=str(tmp_path / "state"))
    run = tmp_path / "run"
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "mesh=8gpu", "mesh.nnodes=1", "mesh.gpus_per_node=4",
                  "mesh.cp=4", "mesh.ep=4", "verl.actor_rollout_ref.rollout.tensor_model_parallel_size=4",
                  "run.task_runner=vrun_standin.StandinTaskRunner", "run.stall_after_s=10", "run.stall_grace_s=2",
                  "run.on_stall=requeue", "cluster.max_requeues=5", "cluster.no_progress_attempts=1",
                  "verl.trainer.save_freq=4", "cluster.detach=true", f"hydra.run.dir={run}", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run / "standin.json").write_text(json.dumps({"steps": 1000, "step_s": 1.0,
                                                  "hang": {"rank": 1, "step": 2, "where": "data"}}))
    first = json.loads((run / "ray_job.json").read_text())["job_id"]
    wait(lambda: any(e["event"] == "stopped" for e in events(run)), 400, "the rule to stop the run")
    ev = events(run)
    stop = next(e for e in ev if e["event"] == "stopped")
    assert stop["why"].startswith("1 attempt ended before step 4's checkpoint; stopped (no whole checkpoint yet; "
                                  "cluster.no_progress_attempts=1"), stop
    acts = [e for e in ev if e["event"] == "stall_action"]
    assert [a["action"] for a in acts] == ["cancelled"] and acts[0]["why"] == stop["why"], acts
    assert not [e for e in ev if e["event"] == "submitted" and e.get("replaces")], ev   # not submitted again
    wait(lambda: jobs(ray4)[first]["status"] == "FAILED", 60, "the job to end")
    assert jobs(ray4)[first]["driver_exit_code"] == 3
    st = subprocess.run([PY, "-m", "vrun", "status", str(run)], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=120)
    assert st.returncode == 0 and stop["why"] in st.stdout, st.stdout + st.stderr

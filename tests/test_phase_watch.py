"""Each phase watched against its own bound on a real two-node Ray cluster (cluster=ray; the session's ray4 in
tests/conftest.py): the stand-in trainer (tests/support/vrun_standin.py) runs each step's log-prob,
update and weight sync as rank actor methods named as verl's fused worker names them, so Ray's state API lists them
as it lists verl's. Log-prob is cued at 5× its band for one step (recorded `slow`, shown by status and runs); then
rank 5 never returns from the weight sync: the job's own watchdog reports `stalled in weight sync …` within that
phase's bound + 60 s, far inside the whole step's bound, and cancels the job as any stall. Only the processes
started here are stopped (by their pids)."""
import json
import subprocess

import pytest

from conftest import PY, ROOT, runner
from test_handoff import grpo_env
from test_ray_watch import events
from test_rayjobs import wait
from vrun.planning import phase_bounds as pb

pytestmark = [pytest.mark.stack_free, pytest.mark.ray]


def test_a_hung_weight_sync_is_named_within_its_bound_and_a_slow_phase_shown(ray4, tmp_path):
    env = dict(grpo_env(tmp_path), RAY_ADDRESS=ray4, VRUN_STATE_DIR=str(tmp_path / "state"))
    run = tmp_path / "run"
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "mesh=8gpu", "mesh.nnodes=2",
                  "mesh.gpus_per_node=4", "run.task_runner=vrun_standin.StandinTaskRunner", "run.on_stall=cancel",
                  "run.stall_grace_s=2", "verl.trainer.save_freq=0", "cluster.detach=true", f"hydra.run.dir={run}",
                  env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    watch = json.loads((run / "plan.json").read_text())["watch"]
    sync, lp = watch["phases"]["sync"], watch["phases"]["log_prob"]
    assert watch["stall_after_s"] / sync["bound_s"] >= 5, watch  # minutes, not the whole step's bound
    row = next(x for x in proc.stdout.splitlines() if x.startswith("watch "))
    assert f"weight sync {pb.duration(sync['bound_s'])} (plan " in row, row
    (run / "standin.json").write_text(json.dumps({
        "steps": 1000, "step_s": 1.0, "save_freq": 0,
        "phases": {"old_log_prob": 0.2, "update_actor": 0.2, "update_weights": 0.2},
        "phase_slow": {"timer": "old_log_prob", "step": 6, "to": 6, "s": 5 * lp["high_s"]},
        "phase_hang": {"timer": "update_weights", "step": 7, "rank": 5}}))
    job = json.loads((run / "ray_job.json").read_text())["job_id"]

    def stalled():
        return [e for e in events(run) if e["event"] == "stalled"]

    try:
        wait(lambda: any(e["event"] == "stall_action" for e in events(run)), 240 + sync["bound_s"], "the stall")
    except AssertionError:
        import urllib.request

        with urllib.request.urlopen(f"{ray4}/api/jobs/{job}/logs", timeout=10) as r:
            raise AssertionError(json.dumps(events(run))[-3000:] + json.loads(r.read())["logs"][-4000:]) from None
    ev = events(run)
    slow = [e for e in ev if e["event"] == "slow"]
    assert len(slow) == 1 and slow[0]["phase"] == "log_prob" and slow[0]["step"] == 6, ev
    assert slow[0]["summary"].startswith(f"log-prob {slow[0]['ratio']:.1f}× its band, ") and slow[0]["ratio"] >= 4
    s = stalled()
    assert len(s) == 1 and s[0]["phase"] == "sync" and s[0]["step"] == 6, s
    summary = s[0]["summary"]
    assert summary.startswith("stalled in weight sync for ") and "in actor_rollout_update_weights, past its bound " \
        f"of {round(s[0]['phase_bound_s'])} s; stalled at step 6 for " in summary, summary
    assert f"(plan {pb.band_text(sync['low_s'], sync['high_s'])}, this run " in summary, summary
    assert "7 ranks in all_reduce" in summary and "→ stalls/1/" in summary, summary
    # within the phase's bound + 60 s of the sync's start (step 6's line, read when its slow log-prob was judged)
    assert s[0]["t"] - slow[0]["t"] <= s[0]["phase_bound_s"] + 60, (s[0], slow[0])
    assert s[0]["t"] - slow[0]["t"] < watch["stall_after_s"]
    act = [e for e in ev if e["event"] == "stall_action"]
    assert act[0]["action"] == "cancelled", act
    st = subprocess.run([PY, "-m", "vrun", "status", str(run)], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=120)
    assert f"slow     {slow[0]['summary']} (since step 6)" in st.stdout, st.stdout + st.stderr
    ls = subprocess.run([PY, "-m", "vrun", "runs", str(run)], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=120)
    assert f"slow: {slow[0]['summary']}" in ls.stdout, ls.stdout + ls.stderr

"""Restarts that make no progress stop, and a resume that trains nothing is no completion, on a real SLURM cluster
(the CI harness: tests/test_slurm.py says how it is reached) with the stand-in trainer (tests/support/vrun_standin.py)
and everything else real: SLURM's jobs, the node process, the watchdog, its requeue through resubmit, scancel.

- SLURM requeues the job (`scontrol requeue`, as a preemption does) once each attempt has resumed, with
  run.on_stall=requeue and cluster.max_requeues=10: the attempts are counted whatever ended each. (1) Three requeues
  before the first save: the fourth start is stopped on its node before anything starts, `3 attempts in a row ended
  before step 2's checkpoint; stopped`, recorded as `stopped`, in status and runs. (2) Two requeues, then a rank
  that hangs at step 2: the stall's requeue is not made (the third attempt in a row), the job is cancelled with the
  same line. While that attempt trains, status shows step N of the plan's 2,000 and where the 15-minute limit falls.
- A run whose last step is saved, submitted again: the stand-in resumes at its last step and exits 0 after 0 steps;
  status, runs and resubmit's own last line say failed, not completed.
"""
import json

import pytest

from test_runs_slurm import status, vrun, wait_for
from test_slurm import NOT_SHARED, WRAP, shared, slurm  # noqa: F401 - shared is a fixture
from test_slurm_lifecycle import ONE_NODE, cancel_leftovers, own_index, state_is, submit  # noqa: F401 - fixtures
from conftest import PY, ROOT

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(WRAP is None, reason="no test SLURM cluster: set VRUN_SLURM_WRAPPER (the CI harness's "
                                 "slx), or VRUN_TEST_SLURM=1 to submit test jobs to the cluster sinfo reaches"),
              pytest.mark.skipif(bool(NOT_SHARED), reason=f"the SLURM nodes cannot run {PY} in {ROOT}: {NOT_SHARED}")]


def events(d) -> list:
    f = d / "progress.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.startswith("{")] if f.exists() else []


def stopped_event(d):
    return next((e for e in events(d) if e["event"] == "stopped"), None)


def requeue_once_resumed(d, n):
    """SLURM requeues the job once attempt n has recorded where it resumed; the begin time SLURM gives a requeued
    job (now + 120 s) is set to now (scontrol update StartTime=now): the test does not wait it out."""
    wait_for(f"attempt {n} to resume", lambda: len([e for e in events(d) if e["event"] == "resumed"]) > n,
             timeout=240, every=0.5)
    job = str(next(e["job_id"] for e in events(d) if e["event"] == "submitted"))
    assert slurm("scontrol", "requeue", job).returncode == 0
    wait_for(f"job {job} to be pending again", lambda: slurm("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
             == "PENDING", timeout=120, every=0.5)
    wait_for(f"job {job}'s begin time set to now",
             lambda: slurm("scontrol", "update", f"JobId={job}", "StartTime=now").returncode == 0, timeout=30)
    return job


HANG = ["cluster.time_min=15", "run.stall_after_s=10", "run.stall_grace_s=2", "run.on_stall=requeue",
        "cluster.max_requeues=10", "verl.trainer.total_training_steps=2000"]
CUES = {"steps": 2000, "step_s": 1.0, "hang": {"rank": 1, "step": 2, "where": "data"}}
LINE = "3 attempts in a row ended before step 2's checkpoint; stopped (no whole checkpoint yet; " \
       "cluster.no_progress_attempts=3"


def test_the_fourth_start_after_three_requeues_without_progress_is_stopped(shared):
    d, _ = submit(shared, "np", *ONE_NODE, *HANG, cues=CUES)
    for n in range(3):
        job = requeue_once_resumed(d, n)
    stop = wait_for("the fourth start to be stopped", lambda: stopped_event(d), timeout=240, every=1)
    assert stop["why"].startswith(LINE) and stop["restart"] == 3, stop
    s = state_is(d, "failed", timeout=120)
    assert s["phase"] == stop["why"] and s["restarts"] == 3 and s["job_ids"] == [job], s
    assert len([e for e in events(d) if e["event"] == "resumed"]) == 3   # nothing started a fourth time
    assert f"state    failed: {LINE}" in vrun("status", str(d)).stdout
    assert f"↳ failed: {LINE}" in vrun("runs", str(d)).stdout


def test_a_stalls_requeue_after_two_requeues_without_progress_is_not_made(shared):
    d, _ = submit(shared, "ns", *ONE_NODE, *HANG, cues=CUES)
    for n in range(2):
        job = requeue_once_resumed(d, n)
    s = wait_for("the third attempt's first step in status",
                 lambda: (lambda s: s if s["state"] == "running" and s["outlook"]["step"] else None)(status(d)),
                 timeout=240, every=0.5)
    o = s["outlook"]
    assert o["step"] == 1 and o["total"] == 2000 and o["spent_gpu_hours"] > 0, o
    text = vrun("status", str(d)).stdout
    assert "progress step 1 of 2,000 (0%), 1,999 to go at " in text, text
    limit = [x for x in text.splitlines() if x.startswith("limit    on this pace the limit ends at step ")]
    assert limit and " of 2,000; the last save before it at " in limit[0], text
    stop = wait_for("the stall's requeue to be refused", lambda: stopped_event(d), timeout=180, every=1)
    assert stop["why"].startswith(LINE), stop
    s = state_is(d, "cancelled", timeout=120)
    assert stop["why"] in s["phase"] and s["job_ids"] == [job] and s["restarts"] == 2, s   # not submitted again
    assert not [e for e in events(d) if e["event"] == "stall_action" and e.get("action") == "requeued"]
    assert LINE in vrun("status", str(d)).stdout and LINE in vrun("runs", str(d)).stdout
    rows = json.loads(vrun("runs", "--json", str(d)).stdout)
    assert rows[0]["outlook"]["total"] == 2000 and rows[0]["outlook"]["spent_gpu_hours"] > 0


def test_a_resume_that_exits_0_after_0_steps_is_failed(shared):
    d, _ = submit(shared, "z", *ONE_NODE, "cluster.time_min=15", "verl.trainer.total_training_steps=20",
                  cues={"steps": 2, "step_s": 1.0, "save_freq": 2})
    s = state_is(d, "completed", timeout=300)
    assert s["checkpoint_step"] == 2 and s["outlook"]["step"] == 2, s
    again = vrun("resubmit", str(d), timeout=400)   # followed to its end: its own last line says how
    assert again.returncode == 2, again.stdout + again.stderr
    assert "exited 0 after 0 steps (resumed from global_step_2 of 20" in again.stderr, again.stdout + again.stderr
    s = status(d)
    assert s["state"] == "failed" and s["phase"].startswith("exited 0 after 0 steps (resumed from global_step_2"), s
    assert s["attempts"][0]["state"] == "completed"
    assert "state    failed: exited 0 after 0 steps" in vrun("status", str(d)).stdout
    assert "failed: exited 0 after 0 steps" in vrun("runs", str(d)).stdout

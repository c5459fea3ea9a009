"""A hang in one phase of the step on the real SLURM harness (tests/test_slurm_lifecycle.py's setup: 3 nodes of 4
declared GPUs, the stand-in trainer's rank actors on two of them): the stand-in runs each step's log-prob, update
and weight sync as rank actor methods named as verl's fused worker names them; rank 5 never returns from the weight
sync at step 6. Node 0's watchdog asks the allocation's Ray (its head's dashboard: the state API) which method each
worker runs, and reports `stalled in weight sync …` within that phase's bound (printed in the plan, at least 5×
below the whole step's) + 60 s, then cancels the job as any stall."""
import json
import time

import pytest

from test_runs_slurm import status, vrun, wait_for
from test_slurm import NOT_SHARED, WRAP, shared  # noqa: F401 - shared is a fixture
from test_slurm_lifecycle import TWO_NODES, cancel_leftovers, nodes_up, own_index, stepping, submit  # noqa: F401
from conftest import PY, ROOT
from vrun.planning import phase_bounds as pb

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(WRAP is None, reason="no test SLURM cluster: set VRUN_SLURM_WRAPPER (the CI harness's "
                                 "slx), or VRUN_TEST_SLURM=1 to submit test jobs to the cluster sinfo reaches"),
              pytest.mark.skipif(bool(NOT_SHARED), reason=f"the SLURM nodes cannot run {PY} in {ROOT}: {NOT_SHARED}")]


def test_a_hung_weight_sync_is_reported_within_its_own_bound(shared):  # noqa: F811
    d, p = submit(shared, "ph", *TWO_NODES, "cluster.time_min=15", "run.on_stall=cancel", "run.stall_grace_s=5",
                  "verl.trainer.save_freq=0",
                  cues={"steps": 1000, "step_s": 1.0, "save_freq": 0,
                        "phases": {"old_log_prob": 0.2, "update_actor": 0.2, "update_weights": 0.2},
                        "phase_hang": {"timer": "update_weights", "step": 6, "rank": 5}})
    watch = json.loads((d / "plan.json").read_text())["watch"]
    bound = watch["phases"]["sync"]["bound_s"]
    assert watch["stall_after_s"] / bound >= 5, watch
    row = next(x for x in p.stdout.splitlines() if x.startswith("watch "))
    assert f"weight sync {pb.duration(bound)} (plan " in row, row
    stepping(d, 5)
    t_hang = time.monotonic()
    s = wait_for("the phase's stall", lambda: (lambda s: s if s.get("stall") else None)(status(d)),
                 timeout=bound + 120)
    assert time.monotonic() - t_hang <= bound + 60 + 10, "reported later than the phase's bound + 60 s"
    stall = s["stall"]
    assert stall["phase"] == "sync" and stall["step"] == 5, stall
    summary = stall["summary"]
    assert summary.startswith("stalled in weight sync for ") and "(plan " in summary and ", this run " in summary
    assert "in actor_rollout_update_weights, past its bound of " in summary and "stalled at step 5 for " in summary
    assert "7 ranks in all_reduce" in summary and summary.endswith("→ stalls/1/"), summary
    assert "stalled in weight sync" in vrun("status", str(d)).stdout
    wait_for("the cancel", lambda: (lambda s: s if s["state"] == "cancelled" else None)(status(d)), timeout=120)

"""The run's hours guarded, on a real SLURM cluster (the CI harness: 3 nodes of 4 declared GPUs; see
tests/test_slurm.py for how it is reached). The training process is the stand-in trainer
(tests/support/vrun_standin.py: verl's console step lines, checkpoints in verl's and Megatron Lite's layout, real
gloo collectives across rank actors on every node, cues to hang, crash or be cut short mid-save); everything else is
real: SLURM's records, scancel, a node taken down, requeue and --exclude, py-spy on every node, the project's node
process, watchdog and submitter, and the installed verl's should_save_ckpt_esi under the environment the node sets.

- endings: a job at its time limit with no requeue left (`timeout`, the step verl's pre-deadline save kept), one
  cancelled from outside while running, one cancelled from outside while pending — each true in status, runs and
  the submitter's last line, with cancel and resubmit behaving accordingly;
- a node taken down: SLURM requeues the job; the run is `requeued` (not failed), cancel works on it, resubmit waits;
- a hang in one rank: reported within the stall bound + 60 s with a stack from every node and the odd rank named;
  run.on_stall=requeue submits it again without that node; the new job resumes from the last whole checkpoint (one
  cut short skipped, saying so), and the tracker's run id is the same in both.
"""
import json
import time
from pathlib import Path

import pytest

from conftest import PY, ROOT
from test_runs_slurm import status, vrun, wait_for
from test_slurm import NOT_SHARED, WRAP, run, shared, slurm  # noqa: F401 - shared is a fixture

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(WRAP is None, reason="no test SLURM cluster: set VRUN_SLURM_WRAPPER (the CI harness's "
                                 "slx), or VRUN_TEST_SLURM=1 to submit test jobs to the cluster sinfo reaches"),
              pytest.mark.skipif(bool(NOT_SHARED), reason=f"the SLURM nodes cannot run {PY} in {ROOT}: {NOT_SHARED}")]

STANDIN = ["model=qwen3_5_35b", "mesh=8gpu", "cluster=slurm", "mode=train", "cluster.detach=true",
           "run.task_runner=vrun_standin.StandinTaskRunner", "verl.trainer.save_freq=2"]
ONE_NODE = ["mesh.nnodes=1", "mesh.gpus_per_node=4", "mesh.cp=4", "mesh.ep=4",
            "verl.actor_rollout_ref.rollout.tensor_model_parallel_size=4"]
TWO_NODES = ["mesh.nnodes=2", "mesh.gpus_per_node=4"]


@pytest.fixture(autouse=True)
def own_index(tmp_path, monkeypatch):
    monkeypatch.setenv("VRUN_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture(autouse=True)
def cancel_leftovers(shared):
    """A test that fails half-way leaves no job behind. A job whose Ray daemons this harness's init has not reaped
    stays COMPLETING a while after its processes exit: up to 5 min is waited for."""
    yield
    ids = set()
    for f in shared.rglob("progress.jsonl"):
        ids |= {str(json.loads(line).get("job_id")) for line in f.read_text().splitlines() if '"job_id"' in line}
    ids -= {"None", ""}
    if ids:
        slurm("scancel", *sorted(ids))
        wait_for("the test's jobs to leave the queue",
                 lambda: not slurm("squeue", "-h", "-j", ",".join(sorted(ids))).stdout.strip(), timeout=300)


@pytest.fixture(autouse=True)
def nodes_up():
    """Every node back up after a test that took one down."""
    yield
    for n in ("n0", "n1", "n2"):
        slurm("scontrol", "update", f"nodename={n}", "state=resume")


def submit(shared, name, *overrides, cues=None):
    """Submit one run detached; write the stand-in's cues before its rank actors start (Ray takes seconds)."""
    sweep = f"sweep_{name}"  # a sweep dir is one sweep's
    p = run(shared, *STANDIN, *overrides, f"hydra.sweep.subdir={name}", sweep=sweep,
            env={"WANDB_MODE": "offline", "WANDB_DIR": str(shared / "wandb")})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    d = shared / sweep / name
    (d / "standin.json").write_text(json.dumps(cues or {}))
    return d, p


def state_is(d, *states, timeout=240):
    return wait_for(f"{d.name} to be {'/'.join(states)}",
                    lambda: (lambda s: s if s["state"] in states else None)(status(d)), timeout=timeout)


def stepping(d, n=1, timeout=240):
    """The stand-in has printed step n (its log is the first node's submitit stdout)."""
    def seen():
        for f in (d.parent / ".submitit").glob("*/*_0_log.out"):
            if f" step:{n} - " in f.read_text(errors="replace"):
                return True
        # the latest attempt failed (no attempt started after it): it never reaches the step; said at once, with
        # its cause
        lines = (d / "progress.jsonl").read_text(errors="replace").splitlines() if (d / "progress.jsonl").exists() \
            else []
        kinds = [json.loads(x).get("event") if x.startswith("{") else None for x in lines]
        last_failed = max((i for i, k in enumerate(kinds) if k == "failed"), default=-1)
        last_started = max((i for i, k in enumerate(kinds) if k in ("started", "submitted")), default=-1)
        assert last_failed < last_started or last_failed < 0, f"{d.name} failed before step {n}: " \
            f"{lines[last_failed][:400]}"
        return False
    return wait_for(f"{d.name} to reach step {n}", seen, timeout=timeout)


def test_time_limit_and_outside_cancels_tell_the_truth(shared):
    """Three jobs at once. A: time limit of 5 min, requeue signal 60 s before it, no requeue left → verl's
    pre-deadline save ran (the stand-in calls the installed verl's should_save_ckpt_esi under the node's env) and the
    run ends `timeout` with that step. B: scancel from outside while it trains → `cancelled outside vrun (scancel)
    while running`. C: pending for nodes, scancel from outside → `... while pending (never started)`. cancel refuses
    all three as ended; resubmit is allowed."""
    # a 5-minute job waits for its one node at most 2 minutes (the default 300 s would be the whole job: refused)
    a, _ = submit(shared, "a", *ONE_NODE, "cluster.time_min=5", "cluster.signal_delay_s=60", "cluster.max_requeues=0",
                  "cluster.ray.join_timeout_s=120",
                  "verl.trainer.use_v1=false",  # the stand-in stands in for RayPPOTrainer, the trainer that asks
                  cues={"steps": 1000, "step_s": 1.0, "save_freq": 1000})
    b, _ = submit(shared, "b", *ONE_NODE, "cluster.time_min=15", cues={"steps": 1000, "step_s": 1.0})
    c, _ = submit(shared, "c", *TWO_NODES, "cluster.time_min=15", cues={"steps": 1000})
    sc = state_is(c, "pending")
    slurm("scancel", sc["job_id"])  # before A's end frees a node for it
    stepping(b, 2)
    slurm("scancel", status(b)["job_id"])
    sb = state_is(b, "cancelled", timeout=120)
    assert sb["phase"] == "cancelled outside vrun (scancel) while running", sb
    sc = state_is(c, "cancelled", "lost", timeout=60)
    assert sc["state"] == "cancelled" and sc["phase"] == "cancelled outside vrun while pending (never started)", sc
    sa = state_is(a, "timeout", timeout=240)
    step = sa["checkpoint_step"]
    assert isinstance(step, int) and sa["phase"].startswith(f"time limit: step {step} saved"), sa
    assert "no requeue left (cluster.max_requeues=0)" in sa["phase"]
    log = next((a.parent / ".submitit").glob(f"{sa['job_id']}/*_0_log.out")).read_text(errors="replace")
    assert "ESI" in log or "expiration" in log.lower(), log[-2000:]  # verl's own pre-deadline message
    rows = {Path(r["run_dir"]).name: r for r in json.loads(vrun("runs", "--json").stdout)}
    assert (rows["a"]["state"], rows["b"]["state"], rows["c"]["state"]) == ("timeout", "cancelled", "cancelled")
    table = vrun("runs").stdout
    assert "cancelled outside vrun while pending (never started)" in table, table
    for d in (a, b, c):
        c_out = vrun("cancel", str(d))
        assert c_out.returncode == 2 and "the run has ended" in c_out.stderr, c_out.stderr
    assert vrun("resubmit", str(b), "--detach").returncode == 0
    state_is(b, "pending", "running")
    assert vrun("cancel", str(b)).returncode == 0


def test_node_down_is_a_requeue_not_a_failure(shared):
    """A node taken down under a training job: SLURM requeues it (same job id, restart 1). status and runs say
    `requeued after node failure`, not failed; resubmit is refused while it is queued; cancel cancels it."""
    d, _ = submit(shared, "n", *TWO_NODES, "cluster.time_min=15", cues={"steps": 1000, "step_s": 1.0})
    stepping(d, 2)
    s = status(d)
    victim = s["hosts"][1]
    slurm("scontrol", "update", f"nodename={victim}", "state=down", "reason=vrun-test")
    s = state_is(d, "requeued", timeout=120)
    assert s["attempt"] == 1 and s["restarts"] == 1 and s["job_ids"] == [s["attempts"][0]["job_id"]], s
    assert s["attempts"][0]["state"] == "requeued" and "node failure" in s["attempts"][0]["end"], s["attempts"]
    text = vrun("status", str(d)).stdout
    assert "state    requeued after node failure" in text and "restarts 1" in text, text
    again = vrun("resubmit", str(d))
    assert again.returncode == 2 and "still requeued" in again.stderr, again.stderr
    c = vrun("cancel", str(d))
    assert c.returncode == 0 and f"cancelled job {s['job_id']}" in c.stdout, c.stdout + c.stderr
    assert state_is(d, "cancelled", timeout=60)["state"] == "cancelled"


def test_a_hang_in_one_rank_is_diagnosed_and_requeued_without_its_node(shared):
    """Rank 5 (on the second node) hangs in data loading at step 5 while the others wait in all_reduce; step 4's save was cut
    short with the tracker already naming it. Within the stall bound + 60 s: `stalled at step 4 …: 7 ranks in
    all_reduce, rank 5 on <node 1> in data loading → stalls/1/`, a stack file from both nodes. on_stall=requeue: a
    new job without that node, which resumes from global_step_2 (step 4 skipped, saying so) with the same tracker
    run id, then trains on."""
    d, _ = submit(shared, "h", *TWO_NODES, "cluster.time_min=15", "run.stall_after_s=15", "run.stall_grace_s=5",
                  "run.on_stall=requeue", "verl.trainer.logger=[console,wandb]",
                  cues={"steps": 1000, "step_s": 1.0, "save_freq": 2, "cut_short": {"step": 4},
                        "hang": {"rank": 5, "step": 5, "where": "data"}})
    stepping(d, 4)
    t_hang = time.monotonic()
    s = wait_for("the stall's report", lambda: (lambda s: s if s.get("stall") else None)(status(d)), timeout=15 + 90)
    assert time.monotonic() - t_hang <= 15 + 60 + 10, "reported later than the stall bound + 60 s"
    first = s["attempts"][0]
    odd = json.loads((d / "standin_ranks.json").read_text())["5"]["host"]
    summary = s["stall"]["summary"]
    assert summary.startswith("stalled at step 4 for ") and "7 ranks in all_reduce" in summary, summary
    assert f"rank 5 on {odd} in data loading" in summary and summary.endswith("→ stalls/1/"), summary
    # the stuck collective from every rank's flight-recorder dump (torch's gloo recorder), or why there is none
    stalled = s["stall"]
    assert ("collective" in stalled and "rank 5 never entered" in summary) or stalled.get("no_collective"), stalled
    stalls = d / "stalls" / "1"
    assert {p.stem for p in stalls.glob("*.json")} >= set(first["hosts"]), list(stalls.iterdir())
    text = vrun("status", str(d)).stdout
    assert f"rank 5 on {odd} in data loading" in text and str(stalls) in text
    # the requeue: a new job, without the odd node, resumed from the last whole checkpoint
    s = wait_for("the new job to train", lambda: (lambda s: s if len(s["job_ids"]) == 2 and s["state"] == "running"
                                                     and s["resumed"] else None)(status(d)), timeout=240)
    assert odd not in s["hosts"] and s["resumed"]["step"] == 2, s
    assert "global_step_4 skipped" in s["resumed"]["line"], s["resumed"]
    lines = lambda: [json.loads(x) for x in (d / "standin_tracker.jsonl").read_text().splitlines()]  # noqa: E731
    tracker = wait_for("the new job's tracker run", lambda: (lambda t: t if len(t) >= 2 else None)(lines()), timeout=180)
    assert len({t["run_id"] for t in tracker}) == 1 and tracker[-1]["start"] == 3, tracker
    assert vrun("cancel", str(d)).returncode == 0
    assert state_is(d, "cancelled", timeout=60)

"""Bad nodes caught before Ray starts, on a real SLURM cluster (the CI harness: 3 nodes of 4 declared GPUs, each node
its own network namespace with a private /tmp; the checkout is shared). The training process is the stand-in
trainer (tests/support/vrun_standin.py); everything else is real: the node's own checks (vrun.launch.nodecheck) on
every node after cluster.node_setup, the verdict on node 0, the job submitted again with sbatch --exclude, SLURM's
record of the exclusion, the run's events, status and runs.

- a node that does not have the checkpoint storage mounted (the run's checkpoint dir is a link into a per-node path
  that the node's setup mounts on every node but the first to claim it: the one whose mount is missing): named in one
  line, recorded, no Ray started on that attempt, the job submitted again without it, and the run trains on the two
  other nodes;
- a run whose environment hides a GPU on every node (env.CUDA_VISIBLE_DEVICES): each node counts 3 of the 4 the
  plan needs; every node failing is the plan's fault, not a node's: the job fails with that line, not submitted
  again. (SLURM sets CUDA_VISIBLE_DEVICES per node from its GRES, over anything the batch script exports: measured
  here with --gpus-per-node=4 and `export CUDA_VISIBLE_DEVICES=0,1` before srun, both nodes saw 0,1,2,3. One
  node's GPU missing alone cannot be made on this harness without standing in for SLURM or nvidia-smi; the verdict
  for it is tests/test_nodecheck.py's, and the exclusion path is the one the first test takes.)
"""
import json
import uuid

import pytest

from test_runs_slurm import status, vrun, wait_for
from test_slurm import NOT_SHARED, WRAP, slurm, shared  # noqa: F401 - shared is a fixture
from test_slurm_lifecycle import TWO_NODES, cancel_leftovers, own_index, state_is, stepping, submit  # noqa: F401
from conftest import PY, ROOT

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(WRAP is None, reason="no test SLURM cluster: set VRUN_SLURM_WRAPPER (the CI harness's "
                                 "slx), or VRUN_TEST_SLURM=1 to submit test jobs to the cluster sinfo reaches"),
              pytest.mark.skipif(bool(NOT_SHARED), reason=f"the SLURM nodes cannot run {PY} in {ROOT}: {NOT_SHARED}")]


def events(d) -> list:
    return [json.loads(x) for x in (d / "progress.jsonl").read_text().splitlines() if x.startswith("{")]


def mount_rig(shared, d) -> tuple:
    """The site's mount, per node (cluster.node_setup): the run's checkpoint dir is a link to <mnt>/ckpt, and
    <mnt> (private to each node) links to the shared store on every node but the first to claim the fault (its mount
    is missing: the link dangles there). Returns (the node_setup override, the file naming the bad node, <mnt>)."""
    mnt = f"/tmp/vrun-nodecheck-{uuid.uuid4().hex[:8]}"
    store, claim, bad_file = shared / "store", shared / "claim", shared / "bad_host"
    rig = shared / "mount.sh"
    rig.write_text(f"""set -e
ln -sn {mnt}/ckpt {d}/checkpoints 2>/dev/null || true
if mkdir {claim} 2>/dev/null; then hostname > {bad_file}; fi
if [ "$(hostname)" != "$(cat {bad_file} 2>/dev/null)" ]; then mkdir -p {store} {mnt}; ln -sfn {store} {mnt}/ckpt; fi
""")
    return f'cluster.node_setup=["bash {rig}"]', bad_file, mnt


def test_a_node_without_the_checkpoint_storage_is_excluded_before_ray(shared):
    name = "m"
    d = shared / f"sweep_{name}" / name
    setup, bad_file, mnt = mount_rig(shared, d)
    submit(shared, name, *TWO_NODES, "cluster.time_min=15", "cluster.max_requeues=1", setup,
           cues={"steps": 1000, "step_s": 1.0})
    def again(state):
        s = status(d)
        assert s["state"] != "failed", s.get("failure")
        return s if len(s["job_ids"]) == 2 and s["state"] in state else None

    # the queue is shared: other jobs may hold the nodes a while, before either job starts
    wait_for("the job submitted again", lambda: again(("pending", "running")), timeout=300)
    s = wait_for("the job submitted again to start", lambda: again(("running",)), timeout=600)
    bad = bad_file.read_text().strip()
    first, second = s["attempts"][0], s["attempts"][1]
    assert bad in first["hosts"] and bad not in s["hosts"], s
    assert first["state"] == "cancelled" and first["end"].startswith(
        f"node check failed, submitted again without {bad} (node {bad}: checkpoint dir: {d}/checkpoints: a link to "
        f"{mnt}/ckpt, which is missing on this node; fix: mount it"), first
    evs = events(d)
    [check] = [e for e in evs if e["event"] == "node_check"]
    assert check["action"] == "requeued" and check["exclude"] == [bad] and check["nodes"] == [bad], check
    assert not [e for e in evs if e["event"] in ("ray_up", "nodes_joined", "entrypoint_started")
                and e.get("attempt") == 0], "Ray started on the attempt that failed its node check"
    # SLURM's own record of the new job: the node excluded
    job = slurm("scontrol", "show", "job", "-o", second["job_id"]).stdout
    assert f"ExcNodeList={bad}" in job, job
    submitted = [e for e in evs if e["event"] == "submitted" and e.get("attempt") == 1]
    assert submitted and submitted[0]["exclude"] == [bad] and submitted[0]["replacing"] == first["job_id"]
    # the run goes on on the other two nodes, its checkpoints on the shared store
    stepping(d, 2)
    text = vrun("status", str(d)).stdout
    assert f"node check failed, submitted again without {bad}" in text, text
    assert vrun("cancel", str(d)).returncode == 0
    assert state_is(d, "cancelled", timeout=60)


def test_gpus_hidden_on_every_node_fail_the_job_without_a_requeue(shared):
    d, _ = submit(shared, "g", *TWO_NODES, "cluster.time_min=15", "env.CUDA_VISIBLE_DEVICES='0,1,2'",
                  cues={"steps": 1000, "step_s": 1.0})
    state_is(d, "running", "failed", timeout=300)
    s = state_is(d, "failed", timeout=120)
    assert len(s["job_ids"]) == 1, s
    err = s["attempts"][0]["end"]
    for host in s["attempts"][0]["hosts"]:
        assert f"node {host}: gpus: 3 visible GPU(s) (CUDA_VISIBLE_DEVICES=0,1,2), the plan needs 4 per node" in err, err
    assert "not submitted again: every node failed: the plan or the storage, not a node" in err, err
    evs = events(d)
    [check] = [e for e in evs if e["event"] == "node_check"]
    assert check["action"] == "failed" and sorted(check["nodes"]) == sorted(s["attempts"][0]["hosts"])
    assert not [e for e in evs if e["event"] in ("ray_up", "entrypoint_started")]
    rows = json.loads(vrun("runs", "--json").stdout)
    assert [r["state"] for r in rows if r["run_dir"] == str(d)] == ["failed"]


def test_a_bad_node_with_no_requeue_left_fails_the_job_with_its_line(shared):
    name = "z"
    d = shared / f"sweep_{name}" / name
    setup, bad_file, mnt = mount_rig(shared, d)
    submit(shared, name, *TWO_NODES, "cluster.time_min=15", "cluster.max_requeues=0", setup, cues={"steps": 1000})
    state_is(d, "running", "failed", timeout=300)  # the queue is shared: other jobs may hold the nodes a while
    s = state_is(d, "failed", timeout=120)
    bad = bad_file.read_text().strip()
    assert len(s["job_ids"]) == 1, s
    err = s["attempts"][0]["end"]
    assert f"node check: node {bad}: checkpoint dir: {d}/checkpoints: a link to {mnt}/ckpt, which is missing on " \
        "this node" in err and "not submitted again: no requeue left (0 in a row after node checks, " \
        "cluster.max_requeues=0)" in err, err
    assert not [e for e in events(d) if e["event"] in ("ray_up", "entrypoint_started")]

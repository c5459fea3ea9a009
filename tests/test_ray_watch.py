"""A cluster=ray job watched from its own entry, on a real two-node Ray cluster (the session's ray4 in tests/conftest.py:
a head and a worker, each declaring 4 GPUs, their own temp dir and ports): the stand-in trainer
(tests/support/vrun_standin.py) steps in verl's console format, saves in verl's layout and hangs rank 5 in data
loading on cue. The entry's watchdog reports the stall with the stacks of the job's processes on both nodes (py-spy
in a task pinned to each node), names the rank and its node, submits the run again through `python -m vrun
resubmit`, and at cluster.max_requeues cancels it; the job carried verl's deadline from cluster.time_min. Only the
processes started here are stopped (by their pids)."""
import json
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import runner
from test_handoff import grpo_env
from test_rayjobs import wait

pytestmark = [pytest.mark.stack_free, pytest.mark.ray]

STALL_S = 15


def events(run: Path) -> list:
    f = run / "progress.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def jobs(url: str) -> dict:
    with urllib.request.urlopen(url + "/api/jobs/", timeout=10) as r:
        return {j["submission_id"]: j for j in json.loads(r.read())}


def test_a_hung_rank_is_diagnosed_submitted_again_then_cancelled_at_the_cap(ray4, tmp_path):
    """Rank 5 hangs at step 4 in both jobs. Job 1: `stalled` with both nodes' stacks under stalls/1/, rank 5 and its
    node named, within the bound + 60 s; then requeued (the run submitted again to the same cluster, no node left
    out). Job 2 resumes from global_step_2, stalls again at the same step: cluster.max_requeues=1 is reached, so it
    is cancelled, saying why. Both jobs end FAILED by their own driver."""
    env = dict(grpo_env(tmp_path), RAY_ADDRESS=ray4, VRUN_STATE_DIR=str(tmp_path / "state"))
    run = tmp_path / "run"
    t0 = time.time()
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "mesh=8gpu", "mesh.nnodes=2",
                  "mesh.gpus_per_node=4", "run.task_runner=vrun_standin.StandinTaskRunner",
                  f"run.stall_after_s={STALL_S}", "run.stall_grace_s=2", "run.on_stall=requeue",
                  "cluster.max_requeues=1", "verl.trainer.save_freq=2", "cluster.detach=true", f"hydra.run.dir={run}",
                  env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "submitted again to the same cluster" in proc.stdout and "cannot leave the odd node out" in proc.stdout
    (run / "standin.json").write_text(json.dumps({"steps": 1000, "step_s": 1.0, "save_freq": 2,
                                                  "hang": {"rank": 5, "step": 4, "where": "data"}}))
    first = json.loads((run / "ray_job.json").read_text())["job_id"]

    def logs(job):
        with urllib.request.urlopen(f"{ray4}/api/jobs/{job}/logs", timeout=10) as r:
            return json.loads(r.read()).get("logs", "")

    def cancelled():
        return any(e["event"] == "stall_action" and e.get("action") == "cancelled" for e in events(run))

    try:
        wait(cancelled, 600, "the second stall's cancel")
    except AssertionError:
        raise AssertionError(json.dumps(events(run), indent=1)[-4000:] + logs(first)[-4000:]) from None
    ev = events(run)
    stalls = [e for e in ev if e["event"] == "stalled"]
    acts = [e for e in ev if e["event"] == "stall_action"]
    assert [s["n"] for s in stalls] == [1, 2] and [s["step"] for s in stalls] == [3, 3], stalls
    assert [a["action"] for a in acts] == ["requeued", "cancelled"], acts
    assert "cannot leave a node out" in acts[0]["note"] and acts[0]["exclude"] == []
    assert "cluster.max_requeues=1" in acts[1]["why"] and "stalled 2 times in a row" in acts[1]["why"]
    again = [e for e in ev if e["event"] == "submitted" and e.get("replaces") == first]
    assert len(again) == 1, ev
    for s in stalls:  # within the bound + 60 s, the diagnosis included
        assert s["quiet_s"] + s["diagnosis_s"] <= STALL_S + 60, s
        assert "7 ranks in all_reduce, rank 5 on " in s["summary"] and " in data loading" in s["summary"]
        assert s["summary"].endswith(f" → stalls/{s['n']}/"), s  # the stuck collective's clause before it
        assert "dump_error" not in s, s
    # the same seen from outside: the first job's last save (step 2) to its stall's record, one step (1 s) between
    saved = (run / "checkpoints" / "global_step_2" / "data.pt").stat().st_mtime
    assert stalls[0]["t"] - saved <= STALL_S + 60 + 1 + 5, (stalls[0]["t"], saved)
    # every node's stacks: one file per Ray node, rank 5's node the one named
    ranks = json.loads((run / "standin_ranks.json").read_text())
    for n, s in ((1, stalls[0]), (2, stalls[1])):
        d = run / "stalls" / str(n)
        dumps = {p.stem: json.loads(p.read_text()) for p in d.glob("*.json") if p.name != "ray.json"}
        assert len(dumps) == 2 and sorted(p.name for p in d.glob("*.done")) == sorted(f"{k}.done" for k in dumps)
        where = {p["rank"]: (node, p["where"]) for node, dump in dumps.items() for p in dump["processes"]
                 if p["rank"] is not None and p["rank_process"]}
        assert sorted(where) == list(range(8)), where
        assert where[5][1] == "data loading" and all(w == "all_reduce" for r, (_, w) in where.items() if r != 5)
        assert f"rank 5 on {where[5][0]} in data loading" in s["summary"]
        assert all(p["how"] == "py-spy" for dump in dumps.values() for p in dump["processes"]), dumps
        assert json.loads((d / "ray.json").read_text())["actors"]
    assert ranks["5"]["pid"] in {p["pid"] for dump in dumps.values() for p in dump["processes"]}
    # the second job resumed from the last whole checkpoint; both ended by their own driver
    second = again[0]["ray_job"]
    state = jobs(ray4)
    wait(lambda: jobs(ray4)[second]["status"] == "FAILED", 60, "the second job to end")
    assert state[first]["status"] == "FAILED" and state[first]["driver_exit_code"] == 3
    assert "Resuming from" in logs(second) and "global_step_2" in logs(second)
    time.sleep(5)  # the requeue submitted once: the second job's end is not a failed submission to try again
    assert len([e for e in events(run) if e["event"] == "submitted"]) == 2, events(run)
    # verl's deadline reached the task runner: cluster.time_min (240) from the entry's start, less 120 + 60 s
    esi = json.loads((run / "standin_env.json").read_text())["esi"]
    assert esi is not None and t0 + 240 * 60 - 180 - 5 <= int(esi) <= time.time() + 240 * 60 - 180, esi
    assert "vrun: deadline: the job ends at" in logs(first)


def test_a_job_that_cannot_reach_its_run_dir_is_watched_in_its_own_copy(ray4, tmp_path):
    """The path the plan recorded holds another run (as a node that does not share the planner's storage may):
    the job's entry says so, writes its stalls and events in its working dir (Ray's copy of the run dir) and prints
    each event in the job's log as a `vrun: event` line; run.on_stall=cancel ends the job (FAILED, exit 3)."""
    import shutil

    import vrun
    from ray.job_submission import JobSubmissionClient

    env = dict(grpo_env(tmp_path), RAY_ADDRESS=ray4)
    run, copy = tmp_path / "run", tmp_path / "copy"
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "mesh=8gpu", "mesh.nnodes=2",
                  "mesh.gpus_per_node=4", "run.task_runner=vrun_standin.StandinTaskRunner", "mode=plan",
                  f"run.stall_after_s={STALL_S}", "run.stall_grace_s=2", "run.on_stall=cancel",
                  f"hydra.run.dir={run}", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.copytree(run, copy)
    plan = json.loads((copy / "plan.json").read_text())
    (copy / "plan.json").write_text(json.dumps({**plan, "mode": "train"}))
    (run / "plan.json").write_text(json.dumps({**plan, "run_id": "another-run"}))
    (run / "standin.json").write_text(json.dumps({"steps": 1000, "step_s": 1.0, "save_freq": 0,
                                                  "hang": {"rank": 2, "step": 3, "where": "data"}}))
    c = JobSubmissionClient(ray4)
    job = c.submit_job(entrypoint="python -m vrun.launch.entry ppo --config verl_config.yaml --task-runner "
                       "vrun_standin.StandinTaskRunner",
                       runtime_env={"working_dir": str(copy), "py_modules": [str(Path(vrun.__file__).parent)],
                                    "env_vars": {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}})
    try:
        wait(lambda: str(c.get_job_status(job).value) in ("FAILED", "SUCCEEDED", "STOPPED"), 420, "the job's end")
    finally:
        if str(c.get_job_status(job).value) not in ("FAILED", "SUCCEEDED", "STOPPED"):
            c.stop_job(job)
    logs = c.get_job_logs(job)
    info = c.get_job_info(job)
    assert str(info.status.value) == "FAILED" and info.driver_exit_code == 3, logs[-3000:]
    assert "holds another run (another-run, not " in logs and "stalls and events go under the job's working dir" \
        in logs
    shown = [json.loads(line.split("vrun: event ", 1)[1]) for line in logs.splitlines() if "vrun: event {" in line]
    stalled = [e for e in shown if e["event"] == "stalled"]
    assert [e["event"] for e in shown][-2:] == ["stalled", "stall_action"] and shown[-1]["action"] == "cancelled"
    d = Path(stalled[0]["dir"])
    assert d.name == "1" and d.parent.parent != run and "rank 2 on " in stalled[0]["summary"]
    assert len([p for p in d.glob("*.json") if p.name != "ray.json"]) == 2
    kept = [json.loads(x) for x in (d.parent.parent / "progress.jsonl").read_text().splitlines()]
    assert [e["event"] for e in kept][-2:] == ["stalled", "stall_action"]  # the copy's own record
    assert not (run / "stalls").exists() and not (run / "progress.jsonl").exists()

"""The watchdog's parts on this machine: the stall bound (the first step's longer), the log read as it grows (an
earlier attempt's lines are not progress), and the whole loop on a real log file with a real stack dump of this
test's own processes — stall reported once with its summary, the action after the grace, called off by a step.
tests/test_slurm_lifecycle.py runs it on the SLURM harness."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vrun.launch.watchdog import LogTail, Progress, Watchdog, next_stall_dir
from vrun.planning import watch as watching
from vrun.rundir.record import WatchRecord

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

STEP = "(TaskRunner pid=1) step:{n} - timing_s/gen:1.0 - timing_s/step:2.5 - perf/throughput:10.0"


def test_the_first_step_gets_the_load_and_later_steps_the_bound():
    p = Progress(stall_after_s=10, first_step_s=100, since=0.0)
    assert p.stalled_for(99) is None and p.stalled_for(101) == 101
    assert p.feed(50, 3) and not p.feed(55, 3) and not p.feed(56, 2)  # a step seen again is no progress
    assert p.stalled_for(59) is None and p.stalled_for(61) == 11


def test_the_policy_from_the_plan():
    class Run:
        stall_after_s = None
        stall_grace_s = None
        on_stall = "cancel"

    w = watching.policy(Run, 453.0, 754e9, 32)
    assert w.stall_after_s == 1359.0 and w.grace_s == 1359.0 and "3 × the step's high end 453 s" in w.basis
    assert w.first_step_s == round(1359.0 + watching.ENGINE_START_S + 2 * 754e9 / 32 / watching.LOAD_RATE, 1)
    assert watching.policy(Run, 10.0, None, 1).stall_after_s == watching.STALL_FLOOR_S
    assert watching.policy(Run, None, None, 1).basis == "no step-time estimate"
    Run.stall_after_s, Run.stall_grace_s = 30, 0
    w = watching.policy(Run, 453.0, None, 1)
    assert (w.stall_after_s, w.grace_s, w.basis) == (30.0, 0.0, "run.stall_after_s")
    assert "stalled after 30 s" in watching.line(w) and "cancelled after 0 s more" in watching.line(w)
    assert watching.stacks_line(True, 3, True) == "stacks by the process's own dump on SIGURG (faulthandler, " \
        "vrun/launch/stackhook): ptrace_scope 3 forbids attaching"
    assert watching.stacks_line(True, 2, True).startswith("stacks by py-spy, live (ptrace_scope 2, with CAP_SYS_PTRACE)")
    assert watching.stacks_line(True, 1, False).startswith("stacks by py-spy, live (ptrace_scope 1: py-spy is not")
    assert watching.stacks_line(False, None, False).endswith("py-spy is not installed here (pip install py-spy)")


def test_the_log_is_read_from_where_it_stood(tmp_path):
    log = tmp_path / "x_0_log.out"
    log.write_text(STEP.format(n=7) + "\n")
    tail = LogTail(log)
    assert tail.lines() == []
    with open(log, "a") as f:
        f.write(STEP.format(n=8) + "\npartial")
    assert tail.lines() == [STEP.format(n=8)]
    with open(log, "a") as f:
        f.write(" line\n")
    assert tail.lines() == ["partial line"]
    log.write_text("")  # truncated: read again from the start
    assert tail.lines() == []
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert LogTail(fifo).lines() == [] and LogTail(tmp_path / "missing").lines() == []


def test_stall_dirs_number_on(tmp_path):
    n, d = next_stall_dir(str(tmp_path))
    assert n == 1 and d.is_dir()  # made at once: a second stall never takes the same number
    (tmp_path / "stalls" / "nccl").mkdir()
    n, d = next_stall_dir(str(tmp_path))
    assert n == 2 and d == tmp_path / "stalls" / "2"


def test_a_stall_is_reported_acted_on_and_called_off(tmp_path):
    """Steps, then none: one `stalled` event with the summary (this test's own child stacks dumped for real), the
    action once the grace has passed; in a second run a step after the report records `unstalled` instead."""
    log = tmp_path / "job.log"
    log.write_text("")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nfor _ in range(600): time.sleep(0.1)"],
                               env={**os.environ, "RANK": "3", "WORLD_SIZE": "4"})
    try:
        for grace, resume in ((1.0, False), (30.0, True)):
            events, acted = [], []
            w = WatchRecord(stall_after_s=2.0, first_step_s=60.0, on_stall="cancel", grace_s=grace, basis="test")

            def collect(n, out):
                from vrun.launch import stacks

                stacks.dump_node(out, os.getpid())

            dog = Watchdog(str(tmp_path), log, w, record=lambda e, **f: events.append((e, f)), collect=collect,
                           act=lambda *a: acted.append(a), poll_s=0.2)
            dog.start()
            with open(log, "a") as f:
                f.write(STEP.format(n=1) + "\n")
            deadline = time.monotonic() + 60
            while not any(e == "stalled" for e, _ in events) and time.monotonic() < deadline:
                time.sleep(0.2)
            stalled = [f for e, f in events if e == "stalled"]
            assert len(stalled) == 1, events
            s = stalled[0]
            assert s["step"] == 1 and s["summary"].startswith("stalled at step 1 for ") and Path(s["dir"]).is_dir()
            assert any(p.suffix == ".json" for p in Path(s["dir"]).iterdir())
            if resume:
                with open(log, "a") as f:
                    f.write(STEP.format(n=2) + "\n")
                deadline = time.monotonic() + 20
                while not any(e == "unstalled" for e, _ in events) and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert ("unstalled", {"n": s["n"], "step": 2}) in events and not acted
            else:
                deadline = time.monotonic() + 20
                while not acted and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert acted and acted[0][0] == "cancel" and acted[0][1] == s["summary"]
            dog.stop()
            dog.join(10)
            assert len([e for e, _ in events if e == "stalled"]) == 1  # reported once
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sorted(p.name for p in (tmp_path / "stalls").iterdir()) == ["1", "2"]
    assert json.dumps(events)  # plain values only: they become progress lines


def test_a_local_run_that_hangs_is_diagnosed_and_cancelled(tmp_path):
    """mode=train on this machine with the stand-in trainer (tests/support/vrun_standin.py: rank actors in a real
    local Ray instance, a gloo all_reduce per step, verl's own Tracking printing the step lines): rank 1 hangs in
    data loading at step 3. The watchdog reports `stalled at step 2 …: 3 ranks in all_reduce, rank 1 on <host> in
    data loading → stalls/1/` with the stacks, cancels the run after the grace, and status says so."""
    import socket

    import pytest

    from conftest import PY, ROOT, processes_of
    from test_handoff import grpo_env

    pytest.importorskip("verl.utils.tracking")
    run = tmp_path / "run"
    env = dict(grpo_env(tmp_path), VRUN_STATE_DIR=str(tmp_path / "state"), CUDA_VISIBLE_DEVICES="0,1,2,3")
    env.pop("WANDB_API_KEY")
    proc = subprocess.Popen([PY, str(ROOT / "runner.py"), "model=qwen3_5_35b", "mesh=8gpu", "mesh.nnodes=1",
                             "mesh.gpus_per_node=4", "mesh.cp=4", "mesh.ep=4",
                             "verl.actor_rollout_ref.rollout.tensor_model_parallel_size=4", "mode=train", "cluster=local",
                             "cluster.ray.num_gpus=4", "cluster.ray.num_cpus=2",
                             "run.task_runner=vrun_standin.StandinTaskRunner", "run.stall_after_s=8",
                             "run.stall_grace_s=3", f"hydra.run.dir={run}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not run.is_dir():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        (run / "standin.json").write_text(json.dumps({"steps": 1000, "step_s": 1.0, "save_freq": 0,
                                                      "hang": {"rank": 1, "step": 3, "where": "data"}}))
        out = proc.communicate(timeout=400)[0]
    finally:
        proc.kill()
    host = socket.gethostname()
    from vrun.planning import recorder

    named = "; all_reduce #3 on pg 0 (4 B): ranks 0,2,3 in it, rank 1 never entered" if recorder.support().cpu else ""
    assert f"3 ranks in all_reduce, rank 1 on {host} in data loading{named} → stalls/1/" in out, out[-3000:]
    st = subprocess.run([PY, "-m", "vrun", "status", str(run), "--json"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=60)
    s = json.loads(st.stdout)
    assert s["state"] == "cancelled" and s["phase"].startswith("stalled, cancelled by the watchdog (stalled at step 2")
    dumped = json.loads((run / "stalls" / "1" / f"{host}.json").read_text())
    where = {p["rank"]: p["where"] for p in dumped["processes"] if p["rank"] is not None}
    assert where == {0: "all_reduce", 1: "data loading", 2: "all_reduce", 3: "all_reduce"}, where
    left = processes_of("vrun_standin|raylet|gcs_server", str(tmp_path))  # this run's: VRUN_STATE_DIR is under it
    assert not left, left

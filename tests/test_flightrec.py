"""The stuck collective named from torch's flight recorder (vrun.launch.flightrec, vrun.planning.recorder, the stack
hook's listener vrun/launch/stackhook/vrun_frdump.py).

Real parts: a torch gloo group of 3 processes on this machine, started with the run's own environment
(vrun.launch.environment.child_environ: the recorder's variables and the stack hook first on PYTHONPATH), where rank
2 skips the 4th all_reduce while ranks 0 and 1 block in it; the dumps are the ranks' own, written by the listener
thread the hook starts while the rank is blocked in gloo, and the verdict is torch's analyser's
(torch.distributed.flight_recorder). Then the same through a cluster=ray job of the stand-in trainer (a gloo group of
Ray actors, rank 5 cued to skip the all_reduce) on a real two-node Ray cluster (the session's ray4, tests/conftest.py):
the `stalled` event names the collective and rank 5. The plan's environment and its `recorder` row are unit tests.
"""
import json
import os
import pickle
import re
import socket
import subprocess
import time

import pytest

from conftest import PY

from vrun.planning import recorder


def _has_cpu_recorder() -> str:
    s = recorder.support()
    return s.why_not("gloo")


SKIP_GLOO = pytest.mark.skipif(bool(_has_cpu_recorder()), reason=f"this torch cannot: {_has_cpu_recorder()}")

RANK_SCRIPT = """
import datetime, sys, time
import torch, torch.distributed as dist
rank, port, skip = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3,
                        timeout=datetime.timedelta(seconds=600))
t = torch.ones(1 << 20)                    # 4 MiB of float32
for i in range(3):
    dist.all_reduce(t)
print("entered", flush=True)
if rank == skip:
    time.sleep(600)                        # never joins the 4th all_reduce
dist.all_reduce(t)
"""


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def gloo3(tmp_path):
    """A run dir and 3 gloo ranks started with the run's environment; rank 2 skips the 4th all_reduce."""
    from vrun.launch.environment import child_environ
    from vrun.planning.plan import STACK_HOOK

    run = tmp_path / "run"
    run.mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_", "VRUN_"))}
    env = child_environ(base, {"PYTHONPATH": str(STACK_HOOK), "PYTHONWARNINGS": "ignore"}, [], "r1", str(run))
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    port = _port()
    procs = [subprocess.Popen([PY, str(tmp_path / "rank.py"), str(r), str(port), "2"], env=env,
                              stdout=open(tmp_path / f"rank{r}.log", "wb"), stderr=subprocess.STDOUT)
             for r in range(3)]
    try:
        deadline = time.time() + 300
        while sum(b"entered" in (tmp_path / f"rank{r}.log").read_bytes() for r in range(3)) < 3:
            assert time.time() < deadline and all(p.poll() is None for p in procs), \
                [(tmp_path / f"rank{r}.log").read_text()[-2000:] for r in range(3)]
            time.sleep(0.5)
        time.sleep(2)  # ranks 0 and 1 inside the 4th all_reduce
        yield run, procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


@SKIP_GLOO
def test_a_rank_that_skips_a_collective_is_named_from_the_ranks_own_dumps(gloo3, tmp_path):
    """A stall's diagnosis through the watchdog: every rank asked (the request token), each answers from its
    listener thread while blocked in gloo, the dumps gathered under stalls/1/fr/, torch's analyser's verdict in
    stalls/1/fr/collective.json, the clause in the summary line and the `stalled` event."""
    from vrun.launch import flightrec
    from vrun.launch.watchdog import Watchdog
    from vrun.rundir.record import WatchRecord

    run, procs = gloo3
    events = []

    def collect(n, out):
        flightrec.ask(str(run))
        deadline = time.time() + 60
        while len(list((run / "stalls" / "fr").glob("rank_*"))) < 3 and time.time() < deadline:
            time.sleep(0.5)
        flightrec.gather(str(run), out, wait_s=0)

    w = WatchRecord(stall_after_s=10, first_step_s=10, on_stall="report", grace_s=10, basis="test")
    dog = Watchdog(str(run), run / "job.log", w, record=lambda e, **f: events.append((e, f)), collect=collect,
                   act=lambda *a: None)
    got = dog.diagnose(42.0)
    assert all(p.poll() is None for p in procs)  # still hung: the dumps came from running ranks
    (event, fields), = events
    assert event == "stalled" and "no_collective" not in fields, fields
    assert fields["collective"] == "all_reduce #4 on pg 0 (4 MiB): ranks 0,1 in it, rank 2 never entered"
    assert "; all_reduce #4 on pg 0 (4 MiB): ranks 0,1 in it, rank 2 never entered → stalls/1/" in got["summary"]
    v = json.loads((run / "stalls" / "1" / "fr" / "collective.json").read_text())
    assert v["missing_ranks"] == [2] and v["in_it"] == [0, 1] and v["backend"] == "gloo" and v["seq"] == 4
    assert v["bytes"] == 4 << 20 and v["pg_desc"] == "default_pg"
    assert sorted(p.name for p in (run / "stalls" / "1" / "fr").iterdir()) == ["collective.json", "rank_0", "rank_1",
                                                                               "rank_2"]
    assert not list((run / "stalls" / "1").glob("*.json"))  # the stall's own .json files are the nodes' dumps
    assert not list((run / "stalls" / "fr").glob("rank_*"))  # moved, none left for the next stall


@pytest.mark.stack_free
def test_the_plan_sets_the_recorder_under_the_run_dir():
    from vrun.launch.environment import child_environ

    env = recorder.env("/runs/a")
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == \
        "/runs/a/stalls/nccl/rank_"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/runs/a/stalls/fr/rank_" and env["VRUN_FR_DIR"] == "/runs/a/stalls/fr"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # the user's own setting wins (in the environment or the plan's env)
    got = child_environ({"TORCH_FR_BUFFER_SIZE": "50"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "9"}, [], "r", "/runs/a")
    assert got["TORCH_FR_BUFFER_SIZE"] == "50" and got["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "9"
    assert got["VRUN_FR_DIR"] == "/runs/a/stalls/fr"
    # a Ray job: what the job sets already is left out (Ray refuses a variable set twice), the listener hooked
    from vrun.launch import flightrec

    ray = flightrec.ray_runtime_env("/runs/a", {"TORCH_FR_BUFFER_SIZE": "50"})
    assert "env_vars.TORCH_FR_BUFFER_SIZE" not in ray and ray["env_vars.VRUN_FR_DIR"] == "/runs/a/stalls/fr"
    mod, fn = ray["worker_process_setup_hook"].rsplit(".", 1)
    import importlib

    assert callable(getattr(importlib.import_module(mod), fn))


def _torch_dir(tmp_path, version="2.13.0", analyser=True, lib=b"_dump_fr_trace_json\x00"):
    d = tmp_path / "torch"
    (d / "lib").mkdir(parents=True)
    (d / "version.py").write_text(f"__version__ = '{version}'\n")
    if analyser:
        (d / "distributed" / "flight_recorder" / "components").mkdir(parents=True)
        (d / "distributed" / "flight_recorder" / "components" / "builder.py").write_text("")
    (d / "lib" / "libtorch_python.so").write_bytes(b"\x7fELF..." + lib + b"...")
    return d


@pytest.mark.stack_free
def test_the_plan_says_what_this_torch_can(tmp_path):
    s = recorder.support(_torch_dir(tmp_path / "a"))
    assert s == recorder.Support("2.13.0", True, True, False)
    line = recorder.line(s, "slurm")
    assert line.startswith("recorder torch 2.13.0's flight recorder on (2,000 collectives per rank")
    assert "no NCCL: a build without CUDA, gloo through the stack hook's listener" in line
    assert "names the stuck collective and the ranks missing from it" in line and "Ray" not in line
    assert "worker_process_setup_hook" in recorder.line(s, "ray")
    cuda = recorder.support(_torch_dir(tmp_path / "b", lib=b"_dump_fr_trace_json\x00.._dump_nccl_trace_json\x00"))
    assert "(NCCL through the stack hook's listener and NCCL's debug-info pipe, gloo through" in recorder.line(cuda)
    old = recorder.support(_torch_dir(tmp_path / "c", "2.4.1", analyser=False, lib=b"_dump_nccl_trace_json\x00"))
    assert recorder.line(old) == ("recorder a stall names no collective: torch 2.4.1 has no flight-recorder "
                                  "analyser (torch.distributed.flight_recorder)")
    nogloo = recorder.support(_torch_dir(tmp_path / "d", lib=b""))
    assert "no gloo: this torch records none" in recorder.line(nogloo)
    assert nogloo.why_not("gloo") == "torch 2.13.0 records no gloo collectives (no _dump_fr_trace_json)"
    assert recorder.line(recorder.support(tmp_path / "nothing")) == \
        "recorder a stall names no collective: no torch is installed where the plan was made"


@pytest.mark.stack_free
def test_a_stall_without_an_analysis_says_why(tmp_path):
    """No dump came; a torch without the recorder said so; a dump that is not JSON (a pickle that would run a
    command) or a link is refused and nothing of it is run."""
    from vrun.launch import flightrec

    out = tmp_path / "run" / "stalls" / "1"
    out.mkdir(parents=True)
    got = flightrec.named(out)
    assert "collective" not in got and got["no_collective"], got
    assert json.loads((out / "fr" / "collective.json").read_text()) == {"why": "no rank's flight-recorder dump came"}
    assert flightrec.with_clause("stalled at step 3 for 41 s: x → stalls/1/", got) == \
        "stalled at step 3 for 41 s: x → stalls/1/"
    fr = out / "fr"
    (fr / "rank_0.none").write_text("torch 2.4.1 has no flight recorder for its CPU backends (no _dump_fr_trace)\n")

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    (fr / "rank_1").write_bytes(pickle.dumps({"entries": [Boom()], "version": "2.10", "pg_config": {}}))
    os.symlink(fr / "rank_1", fr / "rank_2")
    details, skipped = flightrec.load(fr)
    assert details == {} and not (tmp_path / "ran").exists()
    assert skipped[0] == "rank_0: torch 2.4.1 has no flight recorder for its CPU backends (no _dump_fr_trace)"
    assert skipped[1].startswith("rank_1: not JSON")  # torch's pickled format is never unpickled here
    assert skipped[2].startswith("rank_2: a symbolic link")
    assert flightrec.clause({"why": "x"}) == "no collective named: x"
    assert flightrec.clause({"collective": "all_reduce", "seq": 412, "pg": "0", "bytes": 8 << 20,
                             "in_it": list(range(7)), "missing_ranks": [7], "expected_ranks": list(range(8))}) == \
        "all_reduce #412 on pg 0 (8 MiB): ranks 0–6 in it, rank 7 never entered"


# ------------------------------------------------------------------------------- a Ray job of the stand-in
@pytest.mark.ray
@pytest.mark.stack_free  # the project's watchdog and recorder on the stand-in: one CI leg, as test_phase_watch
@SKIP_GLOO
def test_a_ray_job_names_the_collective_a_rank_never_entered(tmp_path, ray4):
    """cluster=ray, 8 stand-in ranks on two Ray nodes in a gloo group, rank 5 cued to skip the all_reduce of step 3:
    the plan's `recorder` row, then the `stalled` event names the all_reduce, the ranks in it and rank 5 (the
    listener started in every Ray worker by the job's worker_process_setup_hook, the dumps on the run dir both
    nodes share here); run.on_stall=cancel ends the job."""
    from test_handoff import grpo_env
    from test_ray_watch import events
    from test_rayjobs import wait

    from conftest import runner

    env = dict(grpo_env(tmp_path), RAY_ADDRESS=ray4, VRUN_STATE_DIR=str(tmp_path / "state"))
    run = tmp_path / "run"
    proc = runner("model=qwen3_5_35b", "algo=grpo", "cluster=ray", "mesh=8gpu", "mesh.nnodes=2",
                  "mesh.gpus_per_node=4", "run.task_runner=vrun_standin.StandinTaskRunner", "run.stall_after_s=15",
                  "run.stall_grace_s=2", "run.on_stall=cancel", "cluster.detach=true", f"hydra.run.dir={run}",
                  env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run / "standin.json").write_text(json.dumps({"steps": 1000, "step_s": 1.0, "save_freq": 0,
                                                  "hang": {"rank": 5, "step": 3, "where": "collective"}}))
    assert re.search(r"^recorder torch \S+'s flight recorder on .*worker_process_setup_hook", proc.stdout, re.M)

    def acted():
        return any(e["event"] == "stall_action" for e in events(run))

    wait(acted, 420, "the stall's cancel")
    stalled = [e for e in events(run) if e["event"] == "stalled"]
    assert len(stalled) == 1, events(run)
    s = stalled[0]
    assert re.fullmatch(r"all_reduce #\d+ on pg 0 \(4 B\): ranks 0–4,6,7 in it, rank 5 never entered",
                        s.get("collective", "")), s
    assert s["collective"] in s["summary"]
    v = json.loads((run / "stalls" / "1" / "fr" / "collective.json").read_text())
    assert v["missing_ranks"] == [5] and v["expected_ranks"] == list(range(8))



@pytest.mark.stack_free
def test_a_link_in_the_run_dir_is_never_written_or_read_through(tmp_path):
    """stalls/ as a link elsewhere: no request is written there and no dump is taken from it."""
    from vrun.launch import flightrec

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (elsewhere / "fr").mkdir(parents=True)
    (elsewhere / "fr" / "rank_0").write_bytes(b"x")
    run.mkdir()
    os.symlink(elsewhere, run / "stalls")
    assert flightrec.ask(str(run)) == 0 and not (elsewhere / "fr" / "request").exists()
    out = tmp_path / "out"
    out.mkdir()
    assert flightrec.gather(str(run), out, wait_s=0) == 0 and (elsewhere / "fr" / "rank_0").exists()
    os.unlink(run / "stalls")
    flightrec.ask(str(run))
    assert (run / "stalls" / "fr" / "request").read_text().strip().isdigit()

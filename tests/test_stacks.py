"""A stall's stacks (vrun/launch/stacks.py) on real processes: a gloo group stalled with one rank in its DataLoader's
dataset and the others in dist.all_reduce, read by py-spy and, without it, by the processes themselves through the
stack hook (vrun/launch/stackhook); the hook's own behaviour (the signal caught, the process running on, the next
sitecustomize still imported, a forked child on its own file); secrets kept out of the files; processes that vanish,
a missing py-spy and junk in /proc; and the stand-in trainer (tests/support/vrun_standin.py) hung under a real
local Ray cluster, its hung rank named."""
import json
import os
import shutil
import signal
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from conftest import PY, ROOT
from vrun.launch import stacks

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

HOST = socket.gethostname()
SUPPORT = ROOT / "tests" / "support"
HOOKED = {"PYTHONPATH": str(stacks.HOOK_DIR)}

RANK_SCRIPT = textwrap.dedent('''
    import datetime, os, time
    import torch, torch.distributed as dist
    rank, world, odd = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["ODD_RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))

    class Prompts(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            if rank == odd:
                open(os.environ["MARK"] + f".{rank}", "w").close()
                while True:
                    time.sleep(0.2)
            return torch.ones(2)

    loader = iter(torch.utils.data.DataLoader(Prompts(), batch_size=2))

    def train_step():
        t = next(loader).sum().reshape(1)
        open(os.environ["MARK"] + f".{rank}", "w").close()
        dist.all_reduce(t)

    train_step()
''')
# a parent that starts its children and waits (torchrun's part, or the node process's)
PARENT = "import subprocess, sys\nsys.exit(subprocess.call(sys.argv[1:]))"
LAUNCH = textwrap.dedent('''
    import os, socket, subprocess, sys
    world, script = int(sys.argv[1]), sys.argv[2]
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = str(s.getsockname()[1]); s.close()
    ps = [subprocess.Popen([sys.executable, script], env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
          LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)) for r in range(world)]
    for p in ps:
        p.wait()
''')


def wait_for(what, fn, timeout=60.0, every=0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = fn()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def stop_tree(proc, below=None):
    """Stop a process started here and every process below it (by their ids, taken while it ran)."""
    below = stacks.descendants(proc.pid) if below is None else below
    for pid in [proc.pid] + below:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    proc.wait(10)


@pytest.fixture(scope="module")
def stalled_group(tmp_path_factory):
    """Three gloo ranks under one parent: rank 1 blocked in its dataset's __getitem__, ranks 0 and 2 in
    dist.all_reduce; every process with the stack hook first on its PYTHONPATH."""
    d = tmp_path_factory.mktemp("gloo")
    (d / "rank.py").write_text(RANK_SCRIPT)
    env = dict(os.environ, **HOOKED, MARK=str(d / "mark"), ODD_RANK="1")
    proc = subprocess.Popen([PY, "-c", LAUNCH, "3", str(d / "rank.py")], env=env)
    try:
        wait_for("the ranks in place", lambda: len(list(d.glob("mark.*"))) == 3 or proc.poll() is not None)
        assert proc.poll() is None
        time.sleep(0.5)  # from the marks to the blocking calls
        yield proc, d
    finally:
        stop_tree(proc)


def ranks_of(out: Path) -> dict:
    data = json.loads((out / f"{HOST}.json").read_text())
    return {p["rank"]: p for p in data["processes"] if p["rank"] is not None}


def test_py_spy_reads_a_stalled_gloo_group_and_the_summary_names_the_odd_rank(stalled_group):
    proc, d = stalled_group
    out = d / "run" / "stalls" / "1"
    t0 = time.monotonic()
    stacks.dump_node(out, proc.pid)
    took = time.monotonic() - t0
    ranks = ranks_of(out)
    assert {r: p["where"] for r, p in ranks.items()} == {0: "all_reduce", 1: "data loading", 2: "all_reduce"}, \
        (out / f"{HOST}.txt").read_text()
    assert {p["how"] for p in ranks.values()} == {"py-spy"} and ranks[1]["world_size"] == 3
    assert ranks[1]["local_rank"] == 1 and ranks[1]["rank_process"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{HOST}.json", f"{HOST}.txt", f"{HOST}.done"] + ([f"{HOST}-nvidia-smi.txt"] if
                                                          shutil.which("nvidia-smi") else []))
    assert "Prompts.__getitem__" in (out / f"{HOST}.txt").read_text()
    assert stacks.summarize(out, 312, 41 * 60 + 5) == \
        f"stalled at step 312 for 41 min: 2 ranks in all_reduce, rank 1 on {HOST} in data loading → stalls/1/"
    assert stacks.odd(out) == [(1, HOST, "data loading")] and stacks.odd_hosts(out) == []  # one node: no exclusion
    assert took < 15, took
    assert proc.poll() is None  # read live, nothing stopped


@pytest.mark.parametrize("why", ["no py-spy", "ptrace_scope 3"])
def test_where_py_spy_may_not_attach_the_processes_dump_themselves(stalled_group, monkeypatch, why):
    """The stack hook's dump (faulthandler on SIGURG) gives the same answer, and every rank keeps running."""
    proc, d = stalled_group
    if why == "no py-spy":
        monkeypatch.setattr(stacks, "py_spy", lambda: None)
        assert stacks.ptrace_line().startswith("stacks by the process's own dump on SIGURG") and \
            "py-spy is not installed" in stacks.ptrace_line()
    else:
        monkeypatch.setattr(stacks, "ptrace_scope", lambda: 3)
        assert stacks.ptrace_line().endswith("ptrace_scope 3 forbids attaching")
    out = d / "run" / "stalls" / ("2" if why == "no py-spy" else "3")
    stacks.dump_node(out, proc.pid)
    ranks = ranks_of(out)
    assert {r: p["where"] for r, p in ranks.items()} == {0: "all_reduce", 1: "data loading", 2: "all_reduce"}
    assert {p["how"] for p in ranks.values()} == {"signal"}
    assert 'in __getitem__' in ranks[1]["stack"] and "(most recent call first)" in ranks[1]["stack"]
    assert stacks.summarize(out, 7, 90) == \
        f"stalled at step 7 for 90 s: 2 ranks in all_reduce, rank 1 on {HOST} in data loading → stalls/{out.name}/"
    assert proc.poll() is None and len(stacks.descendants(proc.pid)) == 3


def test_the_hook_dumps_on_its_signal_keeps_running_and_chains_the_next_sitecustomize(tmp_path):
    """A process with the hook first on PYTHONPATH: the next sitecustomize on the path still runs (and is the one
    sys.modules names); SIGURG dumps every thread into the hook's own file and the process runs on; a forked child
    dumps into a file of its own; a process without the hook is never signalled."""
    nxt = tmp_path / "next"
    nxt.mkdir()
    (nxt / "sitecustomize.py").write_text("import os\nopen(os.environ['NEXT_MARK'], 'w').write('ran')\n")
    script = tmp_path / "held.py"
    script.write_text(textwrap.dedent('''
        import os, sys, time, threading
        print(sys.modules["sitecustomize"].__file__, flush=True)

        def child_waits():
            while True:
                time.sleep(0.05)

        def parent_waits(child):
            print(child, flush=True)  # from here on, this frame is the main thread's
            while True:
                time.sleep(0.05)

        def helper_waits():
            while True:
                time.sleep(0.05)

        threading.Thread(target=helper_waits, name="helper", daemon=True).start()
        pid = os.fork()
        if pid == 0:
            child_waits()
        parent_waits(pid)
    '''))
    env = dict(os.environ, PYTHONPATH=f"{stacks.HOOK_DIR}:{nxt}", NEXT_MARK=str(tmp_path / "next.ran"))
    p = subprocess.Popen([PY, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == str(nxt / "sitecustomize.py")
        child = int(p.stdout.readline())
        assert (tmp_path / "next.ran").read_text() == "ran"
        assert stacks.catches(p.pid) and stacks.hook_file(p.pid)
        for _ in range(2):
            text, why = stacks.signal_dump(p.pid, timeout_s=10)
            assert not why and "in parent_waits" in text and "in helper_waits" in text, (text, why)
            # the main thread's frame: in its loop, or (a loaded machine) still returning from the print before it
            assert stacks.classify(text) in {f"parent_waits (held.py:{n})" for n in (10, 11, 12)}, text
            assert p.poll() is None
        for _ in range(50):  # the child may not have reached child_waits yet
            text, why = stacks.signal_dump(child, timeout_s=10)
            if "in child_waits" in text:
                break
            time.sleep(0.1)
        assert "in child_waits" in text and "parent_waits" not in text, text
        assert os.readlink(stacks.hook_file(child)).endswith(f".{child} (deleted)")
    finally:
        p.kill()
        p.wait()
        try:
            os.kill(child, signal.SIGKILL)
        except (OSError, UnboundLocalError):
            pass
    # no hook: a Python handler of its own on SIGURG is never triggered by the dump
    bare = subprocess.Popen([PY, "-c", "import signal, sys, time\nsignal.signal(signal.SIGURG, lambda *a: "
                             "open(sys.argv[1], 'w').close())\nprint('up', flush=True)\ntime.sleep(60)",
                             str(tmp_path / "signalled")], stdout=subprocess.PIPE, text=True)
    try:
        assert bare.stdout.readline().strip() == "up" and stacks.catches(bare.pid)
        text, why = stacks.signal_dump(bare.pid, timeout_s=2)
        assert text == "" and why.startswith("no stack hook") and not (tmp_path / "signalled").exists()
    finally:
        bare.kill()
        bare.wait()


def test_secrets_in_the_command_line_or_the_environment_never_reach_the_files(tmp_path):
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MY_SERVICE_TOKEN="tok-OnlyInTheChild-4711",
               DB_PASSWORD="pw-OnlyInTheChild-0815")
    secrets = ["tok-OnlyInTheChild-4711", "pw-OnlyInTheChild-0815", "key-OnTheCommandLine-99",
               "hf-OnTheCommandLine-123", "urlpass-OnTheCommandLine", "tok-OnlyInTheChild-4711"]
    code = "import sys, time\nprint('up', flush=True)\ntime.sleep(60)"
    args = ["--api-key", "key-OnTheCommandLine-99", "--hf_token=hf-OnTheCommandLine-123",
            "https://someone:urlpass-OnTheCommandLine@example.org/x", "--echo", "tok-OnlyInTheChild-4711"]
    p = subprocess.Popen([PY, "-c", PARENT, PY, "-c", code, *args], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"
        out = tmp_path / "run" / "stalls" / "1"
        stacks.dump_node(out, p.pid)
        ranks = ranks_of(out)
        assert ranks[0]["cmdline"].count("<hidden>") == 4, ranks[0]["cmdline"]
        for f in out.iterdir():
            text = f.read_text()
            assert not [s for s in secrets if s in text], f.name
    finally:
        stop_tree(p)


def test_vanishing_processes_a_missing_py_spy_and_junk_in_proc_never_raise(tmp_path, monkeypatch):
    # a process that exits while its stack is being taken
    p = subprocess.Popen([PY, "-c", PARENT, PY, "-c", "import time\nprint('up', flush=True)\ntime.sleep(1.5)"],
                         env=dict(os.environ, RANK="0", WORLD_SIZE="1"), stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    slow = stacks.py_spy_dump

    def late(tool, pid, timeout_s):
        time.sleep(2.0)
        return slow(tool, pid, timeout_s)

    monkeypatch.setattr(stacks, "py_spy_dump", late)
    out = stacks.dump_node(tmp_path / "run" / "stalls" / "1", p.pid)
    p.wait(10)
    gone = ranks_of(out)[0]
    assert gone["stack"] == "" and gone["no_stack"], gone
    assert "without a stack" in stacks.summarize(out, 1, 10)
    # nothing there at all, and no py-spy
    monkeypatch.setattr(stacks, "py_spy", lambda: None)
    assert stacks.signal_dump(4999999)[1] and stacks.hook_file(4999999) is None and not stacks.catches(4999999)
    empty = stacks.dump_node(tmp_path / "run" / "stalls" / "2", 4999999)
    assert (empty / f"{HOST}.done").is_file() and json.loads((empty / f"{HOST}.json").read_text())["processes"] == []
    assert stacks.summarize(empty, None, 5) == \
        f"stalled at the first step for 5 s: no training process found on {HOST} (0 Python processes without " \
        f"RANK) → stalls/2/"
    # junk in every /proc field, under pids no real process has (nothing is ever signalled)
    proc = tmp_path / "proc"
    root, a, b, c = 4999990, 4999991, 4999992, 4999993
    (proc / str(root)).mkdir(parents=True)
    (proc / str(root) / "stat").write_bytes(b"\xff\xfe garbage")
    for pid, stat in ((a, f"{a} (py) thon) S {root} 1 1"), (b, f"{b} (x) S {a}"), (c, f"{c} (y) S notanumber")):
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text(stat)
        (d / "exe").symlink_to("/nonexistent/python3.11")
        (d / "environ").write_bytes(b"RANK=\xff\xfe\0WORLD_SIZE=lots\0=\0\0RANK")
        (d / "cmdline").write_bytes(b"\xff\x00--token\x00\x00" + b"A" * 70000)
        (d / "status").write_text("SigCgt:\tzzzz\n")
        (d / "fd" / "3").symlink_to(f"/tmp/vrun-stack.h.{pid} (deleted)")
    (proc / "notapid").mkdir()
    (proc / "sys" / "kernel" / "yama").mkdir(parents=True)
    (proc / "sys" / "kernel" / "yama" / "ptrace_scope").write_text("x\n")
    monkeypatch.setattr(stacks, "PROC", str(proc))
    assert stacks.descendants(root) == [a, b] and stacks.ptrace_scope() is None
    junk = stacks.dump_node(tmp_path / "run" / "stalls" / "3", root, timeout_s=2)
    data = json.loads((junk / f"{HOST}.json").read_text())
    assert [x["pid"] for x in data["processes"]] == [a, b] and all(x["rank"] is None for x in data["processes"])
    assert all("does not catch SIGURG" in x["no_stack"] for x in data["processes"]), data["processes"]
    assert "no training process found" in stacks.summarize(junk, 3, 5)


def test_classify_places_each_thread_and_summarize_reads_what_nodes_wrote(tmp_path):
    lib = "/venv/lib/python3.11/site-packages"
    pin = f'Thread 2 (idle): "pt_thread"\n    _pin_memory_loop ({lib}/torch/utils/data/_utils/pin_memory.py:40)\n'
    main = 'Thread 1 (active): "MainThread"\n    train ({}:{})\n    <module> (/work/train.py:90)\n'
    assert stacks.classify(main.format("/work/train.py", 12) + pin) == "train (train.py:12)"
    save = f'Thread 1 (idle): "MainThread"\n    write_data ({lib}/torch/distributed/checkpoint/filesystem.py:9)\n' \
           f'    save ({lib}/torch/distributed/checkpoint/state_dict_saver.py:5)\n    <module> (/work/t.py:1)\n'
    assert stacks.classify(save) == "checkpoint save"
    gather = f'Thread 1 (idle): "MainThread"\n    all_gather_object ({lib}/torch/distributed/distributed_c10d.py:3)' \
             f'\n    save ({lib}/torch/distributed/checkpoint/state_dict_saver.py:5)\n'
    assert stacks.classify(gather) == "all_gather"  # the collective first: the odd rank is the one still writing
    sync = f'  File "{lib}/torch/cuda/__init__.py", line 9 in synchronize\n  File "/w/t.py", line 3 in <module>\n'
    assert stacks.classify("Current thread 0x00007f (most recent call first):\n" + sync) == "wait/synchronize"
    helper = f'Thread 3 (idle): "bg"\n    isend ({lib}/torch/distributed/distributed_c10d.py:7)\n'
    assert stacks.classify(main.format("/work/train.py", 5) + helper) == "send/recv"
    assert stacks.classify("") == "" and stacks.classify("no frames here\n") == ""
    out = tmp_path / "run" / "stalls" / "4"
    out.mkdir(parents=True)

    def node(host, procs):
        (out / f"{host}.json").write_text(json.dumps({"host": host, "processes": procs}))

    node("n0", [{"rank": r, "where": "all_reduce"} for r in range(8)] +
         [{"rank": 3, "where": "data loading", "rank_process": False}, {"rank": None, "where": "x"}])
    node("n1", [{"rank": 8 + r, "where": "all_reduce"} for r in range(7)] +
         [{"rank": 15, "where": "", "no_stack": "py-spy: Permission denied"}])
    (out / "n2.json").write_text("{not json")
    (out / "ray.json").write_text(json.dumps({"processes": [{"rank": 99, "where": "x"}]}))
    assert stacks.summarize(out, 12, 7200) == ("stalled at step 12 for 2.0 h: 15 ranks in all_reduce, rank 15 on n1 "
                                              "without a stack (py-spy: Permission denied) → stalls/4/")
    assert stacks.odd_hosts(out) == ["n1"]
    two = tmp_path / "run" / "stalls" / "5"
    two.mkdir()
    (two / "n0.json").write_text(json.dumps({"host": "n0", "processes": [{"rank": 0, "where": "step (t.py:3)"},
                                                                        {"rank": 1, "where": "all_reduce"}]}))
    assert stacks.summarize(two, 2, 61) == \
        "stalled at step 2 for 61 s: 1 rank in all_reduce, rank 0 on n0 in step (t.py:3) → stalls/5/"  # a tie
    assert stacks.HOOK_DIR == Path(__import__("vrun.planning.plan", fromlist=["STACK_HOOK"]).STACK_HOOK)


@pytest.mark.ray
def test_the_standin_hung_under_a_real_ray_cluster_is_named_by_its_stacks(tmp_path):
    """The stand-in trainer (4 rank actors in a real local Ray instance, a gloo all_reduce per step) with rank 2
    cued to hang in data loading at step 2: the stacks of the driver's process tree name it, its Ray actor and its
    pid as standin_ranks.json has it, and the others in all_reduce."""
    pytest.importorskip("verl.utils.tracking")
    run = tmp_path / "run"
    run.mkdir()
    (run / "standin.json").write_text(json.dumps({"steps": 100, "step_s": 0.5, "save_freq": 0,
                                                  "hang": {"rank": 2, "step": 2, "where": "data"}}))
    drive = tmp_path / "drive.py"
    drive.write_text(textwrap.dedent(f'''
        import ray
        from omegaconf import OmegaConf
        cfg = OmegaConf.create({{"trainer": {{"nnodes": 1, "n_gpus_per_node": 4,
              "default_local_dir": "{run / 'checkpoints'}", "save_freq": -1, "esi_redundant_time": 0,
              "logger": ["console"], "project_name": "p", "experiment_name": "e", "resume_mode": "auto"}}}})
        ray.init(address="local", num_cpus=4, num_gpus=4, include_dashboard=False)
        import vrun_standin
        ray.get(vrun_standin.StandinTaskRunner.remote().run.remote(cfg))
    '''))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=f"{SUPPORT}:{ROOT}", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")  # no ~/.ray token
    log = tmp_path / "driver.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen([PY, str(drive)], env=env, stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_for("step 1", lambda: " step:1 - " in log.read_text(errors="replace") or proc.poll() is not None,
                 timeout=150, every=0.2)
        up = time.monotonic() - t0
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(2.0)  # step 2 starts and hangs
        out = run / "stalls" / "1"
        t1 = time.monotonic()
        stacks.dump_node(out, proc.pid, timeout_s=20)
        took = time.monotonic() - t1
        ranks = ranks_of(out)
        assert {r: p["where"] for r, p in ranks.items()} == {0: "all_reduce", 1: "all_reduce", 2: "data loading",
                                                              3: "all_reduce"}, (out / f"{HOST}.txt").read_text()
        assert {p["ray_actor"] for p in ranks.values()} == {"Rank"}
        pids = json.loads((run / "standin_ranks.json").read_text())
        assert ranks[2]["pid"] == pids["2"]["pid"] and ranks[2]["world_size"] == 4
        summary = stacks.summarize(out, 1, 30)
        assert summary == f"stalled at step 1 for 30 s: 3 ranks in all_reduce, rank 2 on {HOST} in data loading" \
                          " → stalls/1/", summary
        n = len(json.loads((out / f"{HOST}.json").read_text())["processes"])
        print(f"stand-in up to its first step in {up:.1f} s; dump of {n} processes in {took:.1f} s")
    finally:
        stop_tree(proc)  # the driver, its Ray instance and every worker, by their ids

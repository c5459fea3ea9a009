"""The sweep's forked workers (hydra_plugins/vrun_sweeper/workers.py): parts in order, the parent's decision seen
by every worker, and a worker that dies or raises leaves its part to the parent."""
import os
import re
import signal
from pathlib import Path

import pytest

from hydra_plugins.vrun_sweeper import workers

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

PARENT = os.getpid()


def first(x):
    return {"x": x, "pid": os.getpid()}, x * 10


def decide(summaries):
    return sum(s["x"] for s in summaries)


def second(kept, total):
    return [(k, total, os.getpid()) for k in kept]


def children(pid: int) -> set:
    """The children of `pid`, running or not yet reaped (zombies), from /proc: a worker left behind is one."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path("/proc", d, "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d))
    return out


@pytest.fixture
def left():
    """The children this test left: none of them there before it (other tests' processes in this pytest process,
    a session's Ray cluster or a drawing child, are not this test's)."""
    before = children(os.getpid())
    return lambda: children(os.getpid()) - before


def test_parts_run_in_workers_and_come_back_in_order():
    parts = workers.chunks(list(range(10)), 3, key=lambda x: x)
    assert [x for p in parts for x in p] == list(range(10)) and len(parts) == 3 and max(map(len, parts)) == 4
    summaries, shared, results = workers.two_phase(parts, first, decide, second)
    results = [r for part in results for r in part]
    assert [s["x"] for s in summaries] == list(range(10)) and shared == 45
    assert [r[0] for r in results] == [x * 10 for x in range(10)] and {r[1] for r in results} == {45}
    pids = {r[2] for r in results}
    assert PARENT in pids and len(pids) == 3  # the parent's part here, each other part in its own process


def dies(x):
    if os.getpid() != PARENT and x == 5:
        os._exit(3)  # a worker killed mid-part: no message, the pipe closes
    return first(x)


def raises_planning(kept, total):
    if os.getpid() != PARENT:
        raise RuntimeError("boom")
    return second(kept, total)


class Unloadable:
    """Pickles in the worker, fails to load in the parent (TypeError): a message the parent cannot read."""

    def __reduce__(self):
        return (Unloadable, (1, 2, 3))


def unreadable(x):
    if os.getpid() != PARENT and x == 4:
        return {"x": x, "bad": Unloadable()}, x * 10
    return first(x)


@pytest.mark.parametrize("phase", ["first", "second", "unreadable"])
def test_a_failed_worker_leaves_its_part_to_the_parent(phase, capfd, left):
    """Two workers besides the parent: the failed one's part is done here, with one warning line; the parent never
    waits on a worker it gave up on (a later worker holding a copy of its pipe kept it waiting before), and no
    worker is left running."""
    parts = workers.chunks(list(range(9)), 3, key=lambda x: x)
    one, two = {"first": (dies, second), "second": (first, raises_planning), "unreadable": (unreadable, second)}[phase]
    signal.alarm(60)  # a hang fails the test instead of the suite
    try:
        summaries, shared, results = workers.two_phase(parts, one, decide, two)
    finally:
        signal.alarm(0)
    results = [r for part in results for r in part]
    assert [s["x"] for s in summaries] == list(range(9)) and shared == 36
    assert [r[0] for r in results] == [x * 10 for x in range(9)]
    assert PARENT in {r[2] for r in results}
    warned = [line for line in capfd.readouterr().err.splitlines() if "planning worker" in line]
    assert len(warned) == (1 if phase != "second" else 2) and all(w.startswith("warning: sweep: ") for w in warned)
    assert not left()  # every worker reaped


def test_the_parent_raising_leaves_no_worker(left):
    def boom(summaries):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        workers.two_phase(workers.chunks(list(range(6)), 3, key=lambda x: x), first, boom, second)
    assert not left()


@pytest.mark.parametrize("points,given,cpus,want", [
    (64, "3", 8, 3), (64, "3", 2, 2), (64, "47", 2, 2), (64, "47", 1, 1), (2, "3", 8, 2),  # never more than the CPUs
    (64, None, 64, 8), (64, None, 2, 2), (7, None, 8, 1), (40, None, 8, 5), (64, "1", 8, 1)])
def test_worker_count(points, given, cpus, want):
    """VRUN_PLAN_WORKERS or the default (≤ 8, ≥ 8 points each), capped by the usable CPUs and the points: 47
    workers asked for on 2 CPUs fork 1 (the parent plans a part too)."""
    env = {} if given is None else {"VRUN_PLAN_WORKERS": given}
    assert workers.count(points, env, cpus=cpus) == want


def test_worker_count_defaults_to_this_process_cpus():
    assert workers.usable_cpus() == len(os.sched_getaffinity(0))
    assert workers.count(10_000, {"VRUN_PLAN_WORKERS": "1000"}) == len(os.sched_getaffinity(0))
    assert 1 <= workers.count(64, {}) <= min(workers.MAX_WORKERS, len(os.sched_getaffinity(0)))


@pytest.mark.parametrize("bad", ["0", "x", "", "-2", "²", "1.5"])
def test_worker_count_refuses_what_is_not_a_count(bad):
    with pytest.raises(ValueError, match="VRUN_PLAN_WORKERS"):
        workers.count(64, {"VRUN_PLAN_WORKERS": bad})


@pytest.mark.parametrize("sig,whole_group", [(signal.SIGTERM, False), (signal.SIGINT, True), (signal.SIGINT, False),
                                             (signal.SIGHUP, False)])
def test_a_signal_while_a_sweep_plans_stops_every_worker(tmp_path, sig, whole_group):
    """The real runner planning a sweep on a forked worker: SIGTERM to the runner, Ctrl-C (SIGINT to the whole
    process group, or to the runner alone) or SIGHUP: every worker gone at once (the caller's pipes close with
    the runner), one line and no traceback, exit 128 + the signal, nothing written."""
    import subprocess
    import time

    from conftest import PY, ROOT

    sweep = tmp_path / "s"
    proc = subprocess.Popen([PY, str(ROOT / "runner.py"), "-m", "model=glm5_1,kimi_k2_6",
                             "verl.trainer.save_freq=range(1,150)", "mode=plan", "run.allow_memory_overrun=true",
                             f"hydra.sweep.dir={sweep}"], cwd=ROOT, env={**os.environ, "VRUN_PLAN_WORKERS": "2"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not children(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, "the runner never forked a worker"
            time.sleep(0.02)
        kids = children(proc.pid)
        time.sleep(0.3)  # the worker planning its part
        assert proc.poll() is None, "the sweep ended before the signal: give it more points"
        if whole_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=30)  # returns once every holder of the pipes is gone
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + sig, err
    assert took < 5, f"{took:.1f} s from the signal to the pipes closing"
    assert all(not os.path.exists(f"/proc/{k}") for k in kids)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and re.fullmatch(rf"sweep: stopped by {signal.Signals(sig).name} while planning \([01] "
                                            r"planning worker\(s\) stopped\); nothing was written or submitted",
                                            lines[0]), err
    assert not sweep.exists()


def test_parts_weigh_the_compositions():
    """Four group sets of 16 points, each composition worth 10 points, the primary's set free: two parts of two
    sets each (splitting a set would compose it twice); one set of 64 over four workers: 16 points each."""
    sets = workers.chunks(list(range(64)), 2, key=lambda x: x // 16, setup=lambda k: 0.0 if k == 1 else 10.0)
    assert [sorted({x // 16 for x in p}) for p in sets] == [[0, 1], [2, 3]]
    one = workers.chunks(list(range(64)), 4, key=lambda x: 0, setup=lambda k: 10.0)
    assert [len(p) for p in one] == [16, 16, 16, 16]
    assert workers.chunks([], 2, key=lambda x: x) == []


def hangs_checking(x):
    if os.getpid() != PARENT and x == 7:
        signal.pause()  # a worker that never answers: no message, its pipe stays open
    return first(x)


def hangs_planning(kept, total):
    if os.getpid() != PARENT:
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped: alive, silent, deaf to everything but SIGKILL
    return second(kept, total)


@pytest.mark.parametrize("phase", ["checking", "planning"])
def test_a_worker_that_never_answers_is_stopped_and_its_part_planned_here(phase, capfd, left):
    """Past its deadline a silent worker is killed, the runner says so in one line and plans its points itself:
    the result is the same as without workers, and no worker is left."""
    import time

    parts = workers.chunks(list(range(10)), 3, key=lambda x: x)
    f, s = (hangs_checking, second) if phase == "checking" else (first, hangs_planning)
    t0 = time.monotonic()
    summaries, shared, results = workers.two_phase(parts, f, decide, s, floor_s=2.0)
    assert time.monotonic() - t0 < 60  # the deadline, not the worker, ended the wait
    results = [r for part in results for r in part]
    assert [s_["x"] for s_ in summaries] == list(range(10)) and shared == 45
    assert [r[0] for r in results] == [x * 10 for x in range(10)] and {r[1] for r in results} == {45}
    err = capfd.readouterr().err
    said = [line for line in err.splitlines() if "no answer within" in line]
    assert said and all(line.startswith("warning: sweep: planning worker ") and "planned by the runner itself" in line
                        for line in said), err
    assert not left()  # every worker reaped: none left running or stopped


def test_the_wait_scales_with_the_parents_own_pace():
    assert workers.wait_until(100.0, 1.0, 10, 10, floor_s=5) == 100.0 + max(5, workers.WAIT_FACTOR * 1.0)
    assert workers.wait_until(100.0, 0.0, 10, 10) == 100.0 + workers.WAIT_FLOOR_S
    assert workers.wait_until(0.0, 60.0, 1, 4) == workers.WAIT_FACTOR * 60 * 4

"""A sweep's points checked and planned on forked copies of this process, one chunk each, in two phases.

Phase one checks each point of a chunk and sends back a small summary (its run dir, its model, its failure); the
sweep's own checks need every summary (run dirs apart, one model or several), so they run in the parent, which
sends its decision to every worker; phase two plans the chunk's points and sends them back. The parent works on
the first chunk itself. Nothing is written by a worker; the launcher writes after every point planned.

A worker is `os.fork()`: it starts with the composed configs, the caches and the imports of the parent, so it costs
no start-up. Results travel over a pipe (`multiprocessing.connection`, pickle underneath) from a copy of this same
process to the process that forked it: never a file, never a payload read from a run dir. A worker that dies or
raises leaves its chunk to the parent, which then does that chunk itself, so a worker failure never changes what
the sweep does, only how fast; the parent says so in one warning line. Linux only (fork after import is the
platform's normal way); elsewhere, serial.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:  # imported where a sweep forks: a run never needs it
    from multiprocessing.connection import Connection

ENV = "VRUN_PLAN_WORKERS"   # the number of processes a sweep plans on (1: no fork); default: the usable CPUs, ≤ 8
MAX_WORKERS = 8
MIN_POINTS = 8              # points per worker below which a fork costs more than it saves
# how long the parent waits for a worker's answer in each phase, counted from the phase's start: WAIT_FACTOR times
# what its own part took per point, for the worker's points (workers share the CPUs: on 2 cores four processes
# each run at half speed), and never less than WAIT_FLOOR_S. A worker past it is killed and its part planned here.
WAIT_FACTOR = 10.0
WAIT_FLOOR_S = 120.0


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a cgroup's cpuset, taskset, a SLURM allocation)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return 1


def count(n_points: int, environ: dict = os.environ, cpus: int | None = None) -> int:
    """How many processes plan a sweep of n_points: VRUN_PLAN_WORKERS when set (a whole number ≥ 1), else at most
    8 with at least 8 points each; never more than the CPUs this process may run on (`cpus`, default usable_cpus:
    more processes than CPUs only take turns) nor than the points."""
    cpus = usable_cpus() if cpus is None else cpus
    given = environ.get(ENV)
    if given is not None:
        if not re.fullmatch(r"\s*[0-9]+\s*", given) or int(given) < 1:
            raise ValueError(f"{ENV}={given!r}: the number of processes a sweep plans on is a whole number >= 1; "
                             f"fix: {ENV}=1 (no fork) or unset it")
        n = int(given)
    else:
        n = min(MAX_WORKERS, n_points // MIN_POINTS)
    if not hasattr(os, "fork") or sys.platform != "linux":
        return 1
    return max(1, min(n, cpus, n_points))


def chunks(items: Sequence, n: int, key: Callable[[Any], Any],
           setup: Callable[[Any], float] = lambda k: 0.0) -> list[list]:
    """items in at most n contiguous parts, after a stable sort by key (items that share a key land together, so
    each part sets up few keys), the costliest part as cheap as it can be: an item costs 1, and the first item of
    each key in a part setup(key) more (a part composes each group set it meets once)."""
    ordered = sorted(items, key=key)
    keys = [key(x) for x in ordered]
    costs = {k: setup(k) for k in dict.fromkeys(keys)}

    def split(limit: float) -> list[list]:
        out: list = [[]]
        cost, last = 0.0, None
        for x, k in zip(ordered, keys):
            add = 1.0 + (costs[k] if k != last else 0.0)
            if out[-1] and cost + add > limit:
                out.append([])
                cost, add = 0.0, 1.0 + costs[k]
            out[-1].append(x)
            cost, last = cost + add, k
        return out

    lo, hi = 1.0 + max(costs.values(), default=0.0), len(ordered) + sum(costs.values()) + 1.0
    while hi - lo > 0.5:  # the least limit that needs no more than n parts
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if len(split(mid)) <= n else (mid, hi)
    return [c for c in split(hi) if c]


class _Worker:
    """A forked worker as the parent sees it: its pid, the parent's end of its pipe, its part, whether reaped."""

    def __init__(self, pid: int, conn: "Connection", part: list):
        self.pid, self.conn, self.part, self.reaped, self.overdue = pid, conn, part, False, 0.0

    def _kill_overdue(self, waited: float) -> None:
        self.overdue = waited
        try:
            os.kill(self.pid, signal.SIGKILL)  # its end of the pipe closes: the parent's recv ends with EOF
        except ProcessLookupError:
            pass

    def receive(self, deadline: float = math.inf, started: float = 0.0):
        """Its message body, or None (with one warning line) when it died, failed, or sent nothing whole by
        `deadline` (time.monotonic()): then it is killed, which ends a wait on a message sent half-way too."""
        timer = None
        if math.isfinite(deadline):
            timer = threading.Timer(max(deadline - time.monotonic(), 0.0), self._kill_overdue,
                                    (deadline - started,))
            timer.daemon = True
            timer.start()
        try:
            kind, body = self.conn.recv()
        except Exception as e:  # noqa: BLE001 - EOF (it died), or a message that does not load back
            kind, body = "failed", f"{type(e).__name__}: {e}"
        finally:
            if timer is not None:
                timer.cancel()
        if self.overdue and kind != "ok":  # (an answer that came as the timer fired is kept: it is whole)
            kind, body = "failed", f"no answer within {self.overdue:.0f} s: stopped"
        if kind == "ok":
            return body
        from vrun.core.writer import mask

        last = str(body).strip().splitlines()[-1] if str(body).strip() else "no reason given"
        print(f"warning: sweep: planning worker {self.pid} failed ({mask(last)[:300]}); its {len(self.part)} point(s) "
              "are planned by the runner itself; fix: none needed (VRUN_PLAN_WORKERS=1 plans in one process)",
              file=sys.stderr)
        return None

    def send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except (OSError, ValueError):
            pass  # it died: its receive comes back None and the parent does its part

    def end(self, kill: bool = False) -> None:
        """Close the parent's end and reap it, killed first when the parent gave up on it; once."""
        if self.reaped:
            return
        self.conn.close()
        if kill:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.reaped = True


_live: list = []  # the workers of the sweep being planned: what a signal stops


@contextlib.contextmanager
def stop_on_signals():
    """While a sweep is planned: SIGTERM, SIGINT (Ctrl-C) or SIGHUP kills every planning worker at once (none
    outlives the runner holding its caller's pipes), says so in one line and exits 128 + the signal's number; no
    traceback. Planning writes nothing, so nothing is left half written. Main thread only (Python's rule)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def stop(signum, frame):
        if os.getpid() != owner:  # a worker between its fork and its own handlers
            os._exit(128 + signum)
        n = _kill_all()
        line = (f"sweep: stopped by {signal.Signals(signum).name} while planning ({n} planning worker(s) stopped); "
                "nothing was written or submitted\n")
        try:
            os.write(2, line.encode())
        except OSError:
            pass
        raise SystemExit(128 + signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _kill_all() -> int:
    """Every live worker killed, then reaped; how many there were."""
    left = [w for w in _live if not w.reaped]
    for w in left:
        try:
            os.kill(w.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for w in left:
        w.end()
    return len(left)


def _die_with_parent(parent: int) -> None:
    """In a worker: default signal actions (Ctrl-C reaches the whole process group: a worker just ends), and
    killed by the kernel when the parent dies, whatever kills it (Linux's PR_SET_PDEATHSIG)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the request took
        os._exit(1)


def wait_until(started: float, own_s: float, own_points: int, points: int, floor_s: float = WAIT_FLOOR_S) -> float:
    """The time.monotonic() by which a worker with `points` points must answer in a phase that began at `started`,
    in which the parent's own `own_points` took `own_s`."""
    per_point = own_s / max(own_points, 1)
    return started + max(floor_s, WAIT_FACTOR * per_point * max(points, 1))


def two_phase(parts: list[list], first: Callable[[Any], tuple[Any, Any]], decide: Callable[[list], Any],
              second: Callable[[list, Any], Any], floor_s: float = WAIT_FLOOR_S) -> tuple[list, Any, list]:
    """first(item) → (summary, kept); decide(every summary, in order) → shared; second(a part's kept, shared) →
    that part's result. parts[0] runs here, every other part in a forked worker, which answers each phase by
    wait_until (floor_s: its least wait) or is killed and its part done here. Returns (summaries, shared, one
    result per part, in order)."""
    from multiprocessing.connection import Pipe

    workers: list[_Worker] = []
    _live[:] = []
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        started = time.monotonic()
        for part in parts[1:]:
            here, there = Pipe()
            pid = os.fork()
            if pid == 0:  # the worker: never returns
                _die_with_parent(parent)
                here.close()
                for earlier in workers:  # the parent's ends of earlier workers' pipes are not this worker's
                    earlier.conn.close()
                _work(there, part, first, second)
            there.close()
            workers.append(_Worker(pid, here, part))
            _live.append(workers[-1])
        kept = [first(item) for item in parts[0]]
        own_s = time.monotonic() - started
        summaries = [[s for s, _ in kept]]
        taken_back: dict = {}  # a worker's part the parent took back: its phase-one results
        for i, w in enumerate(workers):
            got = w.receive(wait_until(started, own_s, len(parts[0]), len(w.part), floor_s), started)
            if got is None:  # the worker died or failed: this part is the parent's
                w.end(kill=True)
                taken_back[i] = [first(item) for item in w.part]
                summaries.append([s for s, _ in taken_back[i]])
            else:
                summaries.append(got)
        flat = [s for part in summaries for s in part]
        shared = decide(flat)
        started = time.monotonic()
        for i, w in enumerate(workers):
            if i not in taken_back:
                w.send(("go", shared))
        results = [second([k for _, k in kept], shared)]
        own_s = time.monotonic() - started
        for i, w in enumerate(workers):
            if i in taken_back:
                results.append(second([k for _, k in taken_back[i]], shared))
                continue
            got = w.receive(wait_until(started, own_s, len(parts[0]), len(w.part), floor_s), started)
            w.end(kill=got is None)
            if got is None:  # it died planning: the parent does both phases of its part again
                redo = [first(item) for item in w.part]
                results.append(second([k for _, k in redo], shared))
            else:
                results.append(got)
        return flat, shared, results
    finally:  # the parent raised, or returns: no worker outlives the sweep
        for w in workers:
            w.end(kill=True)
        _live[:] = []


def _work(conn: "Connection", part: list, first, second) -> None:
    code = 0
    try:
        kept = [first(item) for item in part]
        conn.send(("ok", [s for s, _ in kept]))
        msg = conn.recv()
        if isinstance(msg, tuple) and msg[0] == "go":
            conn.send(("ok", second([k for _, k in kept], msg[1])))
    except BaseException:  # noqa: BLE001 - told to the parent, which does this part itself
        code = 1
        try:
            conn.send(("failed", traceback.format_exc()[-2000:]))
        except BaseException:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

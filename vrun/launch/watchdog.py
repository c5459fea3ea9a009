"""The running job watched (started with the job by the project's own process: node 0 of a SLURM job, the local
launch, or a Ray job's own entry on cluster=ray and cluster=kuberay: vrun.launch.raywatch), not a separate service.

Progress is what verl prints: its step lines (vrun.rundir.joblog) in the job's output, read as they come. No step
within the plan's bound (plan.json `watch`, vrun.planning.watch: the first step of an attempt gets the model load
on top) is a stall. A stall is diagnosed at once — every node dumps the Python stack of every training process
(vrun.launch.stacks), what nvidia-smi reports, every rank's flight-recorder dump (vrun.launch.flightrec: the stuck
collective named with the ranks that never entered it, or why not) and Ray's view of its nodes and actors — under
<run dir>/stalls/<n>/, then summed up in one line (`stalled at step 312 for 41 min: 255 ranks in all_reduce, rank
133 on n17 in data loading; all_reduce #412 on pg 0 (8 MiB): ranks 0–132,134–255 in it, rank 133 never entered →
stalls/1/`) — or, where Ray's state API shows a phase of the step past its own bound (vrun.launch.phases), that phase
named first (`stalled in weight sync for 6 min (plan 21–105 s, this run 48 s) …`) — recorded as a `stalled` event,
which `status`, `runs` and the submitter show. stalls/ and each stall's
dir are made only as the run dir's own plain dirs (never through a link, never outside it): where they cannot be, or a
dump fails, the stall is still recorded and acted on, the failure one line in the event (`dump_error`). Then
run.on_stall: report only; or, once run.stall_grace_s more pass without a step, cancel (or submit again without the
odd rank's node where the cluster can leave it out, then cancel). A step after the report records `unstalled` and
calls the action off.

While it watches it also stamps each checkpoint the job finishes with the plan it belongs to
(vrun.rundir.checkpoints.stamp), so a restart can tell whose checkpoint it resumes: the tracker read as a regular
file of ASCII digits (anything else is no step, silently), never stamped through a checkpoints/ link (said once).
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from vrun.core import fs, writer
from vrun.launch.flightrec import collect_nccl, nccl_env, poke_nccl  # noqa: F401 - the launchers' names
from vrun.rundir import joblog

POLL_S = 2.0
# how long a stall's diagnosis waits for every node's dump
DUMP_WAIT_S = 60.0
STALLS = "stalls"


@dataclass
class Progress:
    """The last step seen and when; pure: fed (time, step) pairs, asked whether the bound has passed."""
    stall_after_s: float
    first_step_s: float
    since: float                # when watching started (the attempt's start)
    last_step: Optional[int] = None
    last_t: Optional[float] = None

    def feed(self, t: float, step: int) -> bool:
        """True when this is progress: a step not seen before (a resumed run starts past its checkpoint)."""
        if self.last_step is None or step > self.last_step:
            self.last_step, self.last_t = step, t
            return True
        return False

    def stalled_for(self, t: float) -> Optional[float]:
        """Seconds without progress when past the bound (the first step's before one was seen), else None."""
        start, bound = (self.since, self.first_step_s) if self.last_t is None else (self.last_t, self.stall_after_s)
        quiet = t - start
        return quiet if quiet > bound else None


class LogTail:
    """New whole lines of a growing file, from where it stood when the tail began (an earlier attempt's lines in a
    log appended across attempts are not this attempt's progress). Regular files only; never blocks or raises."""

    def __init__(self, path: Path, from_start: bool = False):
        self.path = Path(path)
        st, _ = fs.stat(self.path)
        self.offset = 0 if from_start or st is None else st.st_size
        self.partial = b""

    def lines(self, limit: int = 8 << 20) -> list:
        import stat as st_mod

        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except (OSError, ValueError):
            return []
        try:
            info = os.fstat(fd)
            if not st_mod.S_ISREG(info.st_mode):
                return []
            if info.st_size < self.offset:  # truncated: start over
                self.offset, self.partial = 0, b""
            os.lseek(fd, self.offset, os.SEEK_SET)
            data = os.read(fd, limit)
        except OSError:
            return []
        finally:
            os.close(fd)
        self.offset += len(data)
        data = self.partial + data
        *whole, self.partial = data.split(b"\n")
        if len(self.partial) > 1 << 20:  # a line without end: drop it
            self.partial = b""
        return [w.decode(errors="replace") for w in whole]


def stalls_in_a_row(events: list) -> int:
    """How many times in a row the run was submitted again after a stall without getting past the step it stalled
    at: each stall at the run's furthest step so far (a stall before any step of its job stands where the stall
    before it did), walked back from the newest (the one being acted on) while the earlier stall was followed by a
    `stall_action` requeued and the newer one is not past it. A step that is not a finite whole number counts as
    none (the progress file is an input)."""
    stalls: list = []   # [step, requeued]
    for e in events:
        if e.get("event") == "stalled":
            stalls.append([_whole(e.get("step")), False])
        elif e.get("event") == "stall_action" and e.get("action") == "requeued" and stalls:
            stalls[-1][1] = True
    last = None
    for s in stalls:   # no step in its job: where the run stood at the stall before
        s[0] = last = s[0] if s[0] is not None else last
    if not stalls:
        return 0
    n, cur = 0, stalls[-1][0]
    for step, requeued in reversed(stalls[:-1]):
        if not requeued or (cur is not None and step is not None and cur > step):
            break
        n, cur = n + 1, step if step is not None else cur
    return n


def _whole(v) -> Optional[int]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        return None
    return int(v)


def own_dir(path: Path, root: str) -> Path:
    """`path` as a plain directory inside `root` (the run dir), made when absent (mkdir never follows a link);
    a link, a file or anything else in its place, or a path that leaves the root on its real path, is refused with
    one line (writer.UnsafePath)."""
    import stat as st_mod

    path = Path(path)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    st, _ = fs.stat(path, follow=False)
    if st is None or st_mod.S_ISLNK(st.st_mode) or not st_mod.S_ISDIR(st.st_mode):
        what = "gone" if st is None else "a symbolic link" if st_mod.S_ISLNK(st.st_mode) else "not a directory"
        raise writer.UnsafePath(f"{path} is {what}: nothing is written there (a run dir's stalls/ is its own dir)")
    if not writer.contained(str(path / "x"), root):
        raise writer.UnsafePath(f"{path} is outside {root} on its real path: nothing is written there")
    return path


def next_stall_dir(run_dir: str) -> tuple[int, Path]:
    """<run dir>/stalls/<n>, made (never through a link), n one past the highest there; raises OSError (one line)
    where stalls/ is not the run dir's own dir."""
    base = own_dir(Path(run_dir) / STALLS, run_dir)
    try:
        taken = [int(p.name) for p in base.iterdir() if p.name.isascii() and p.name.isdigit()]
    except OSError:
        taken = []
    n = max(taken, default=0) + 1
    while True:
        try:
            os.mkdir(base / str(n), 0o755)
            return n, base / str(n)
        except FileExistsError:
            n += 1


class Watchdog(threading.Thread):
    """Node 0's (or the local launch's) watcher. The launcher gives it:
    log: the file the job's step lines reach; watch: plan.json's `watch`; record(event, **fields): a progress line;
    collect(n, out_dir): every node's dump into out_dir (returns when they are in, or DUMP_WAIT_S passed);
    act(action, summary, hosts): cancel or requeue the job; plan: the PlanRecord (for checkpoint stamps)."""

    def __init__(self, run_dir: str, log: Path, watch, record: Callable, collect: Callable, act: Callable,
                 plan=None, poll_s: float = POLL_S, clock=time.time, phases=None):
        """phases: the running phases (vrun.launch.phases.RayPhases; None: the whole step's bound alone)."""
        from vrun.launch.phases import PhaseWatch

        super().__init__(name="vrun-watchdog", daemon=True)
        self.phases, self.phase_watch = phases, PhaseWatch(dict(getattr(watch, "phases", None) or {}))
        self.run_dir, self.watch, self.plan = run_dir, watch, plan
        self.record, self.collect, self.act = record, collect, act
        self.tail = LogTail(log)
        self.poll_s, self.clock = poll_s, clock
        self.progress = Progress(watch.stall_after_s, watch.first_step_s, clock())
        self.stop_event = threading.Event()
        self.reported: Optional[dict] = None
        self.acted = False
        self.last_n = 0             # the last stall's number (a stall whose dir cannot be made still gets one)
        self.said: set = set()      # the checkpoint lines said once
        # the step the attempt starts from is not this attempt's save: only steps the tracker moves to are stamped
        start = self.tracker()
        self.stamped: set = {start} if start is not None else set()

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> None:
        while not self.stop_event.wait(self.poll_s):
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - the watcher never fails the job it watches
                print(f"vrun: watchdog: {type(e).__name__}: {e}", flush=True)

    def tick(self) -> None:
        now = self.clock()
        moved = False
        for line in self.tail.lines():
            got = joblog.parse_line(line)
            if got is not None and got[1] and self.progress.feed(now, got[0]):
                moved = True
                self.judge(got[0], got[1])
        self.stamp()
        if moved and self.reported is not None:
            self.record("unstalled", n=self.reported["n"], step=self.progress.last_step)
            print(f"vrun: watchdog: step {self.progress.last_step} came; stall {self.reported['n']} is over",
                  flush=True)
            self.reported = None
            return
        if self.acted:
            return
        if self.reported is None:
            quiet = self.progress.stalled_for(now)
            phase = self.phase_stall(now) if quiet is None else None
            if quiet is not None or phase is not None:
                self.reported = self.diagnose(quiet if quiet is not None else now - self.progress.last_t, phase)
            return
        if self.watch.on_stall != "report" and now - self.reported["t"] >= self.watch.grace_s:
            self.acted = True
            self.act(self.watch.on_stall, self.reported["summary"], self.reported.get("hosts") or [])

    def phase_stall(self, now: float) -> Optional[dict]:
        """A phase running past its own bound (vrun.launch.phases), once the attempt's first step was seen (the
        first step holds the load, the engine's start and the first refit: its bound is the whole step's)."""
        if self.phases is None or self.progress.last_t is None or not self.phase_watch.bounds:
            return None
        return self.phase_watch.stalled(now, self.phases.look())

    def judge(self, step: int, metrics: dict) -> None:
        """A step's phase durations: a phase turned slow is recorded `slow` (progress continues: no action), one
        back within its bounds `slow_over`."""
        for phase, ratio, line in self.phase_watch.feed(metrics):
            if ratio is None:
                self.record("slow_over", phase=phase, step=step)
                continue
            print(f"vrun: watchdog: slow at step {step}: {line}", flush=True)
            self.record("slow", phase=phase, step=step, ratio=ratio, summary=line)

    def diagnose(self, quiet: float, phase: Optional[dict] = None) -> dict:
        """Every node's stacks under stalls/<n>/ and one summary line, recorded as `stalled`. A dir that cannot be
        made or a dump that fails is one line in the event (`dump_error`): the stall is recorded and acted on.
        phase: the phase past its own bound (PhaseWatch.stalled), named first in the summary and the event."""
        from vrun.launch import flightrec, stacks

        t0 = self.clock()
        step = self.progress.last_step
        out, error = None, ""
        try:
            n, out = next_stall_dir(self.run_dir)
        except OSError as e:
            n, error = self.last_n + 1, f"no dump: {_line(e)}"
        self.last_n = n
        if out is not None:
            try:
                self.collect(n, out)
            except Exception as e:  # noqa: BLE001 - the stall is still recorded and acted on
                error = f"the dump failed: {_line(e)}"
        found = {}
        if out is not None:
            summary, hosts = stacks.summarize(out, step, quiet), stacks.odd_hosts(out)
            found = flightrec.named(out)
            summary = flightrec.with_clause(summary, found)
        else:
            head = f"stalled at {'step ' + str(step) if step is not None else 'the first step'} for " \
                   f"{stacks.duration(quiet)}"
            summary, hosts = f"{head}: {error}", []
        if phase is not None:
            summary = f"{phase['line']}; {summary}"
        took = round(self.clock() - t0, 1)
        print(f"vrun: {summary}" + (f" ({error})" if error and out is not None else ""), flush=True)
        self.record("stalled", n=n, step=step, quiet_s=round(quiet, 1), summary=summary,
                    dir=str(out) if out is not None else None, odd_hosts=hosts, diagnosis_s=took,
                    **found, **({"dump_error": error} if error else {}),
                    **({"phase": phase["phase"], "phase_bound_s": phase["bound"]} if phase is not None else {}))
        return {"n": n, "t": self.clock(), "summary": summary, "hosts": hosts}

    def tracker(self) -> Optional[int]:
        """The step the run's checkpoint tracker names (a regular file holding ASCII digits), else None."""
        from vrun.rundir import checkpoints

        try:
            return checkpoints.read_tracker(Path(self.run_dir) / "checkpoints")[0]
        except (OSError, ValueError):
            return None

    def say_once(self, key: str, line: str) -> None:
        if key not in self.said:
            self.said.add(key)
            print(f"vrun: watchdog: {line}", flush=True)

    def stamp(self) -> None:
        """Each checkpoint the job finished (the tracker moved to it) stamped with this plan — only inside the run
        dir: checkpoints/ as a link (followed for reading) is said once, never written through."""
        if self.plan is None:
            return
        root = Path(self.run_dir) / "checkpoints"
        step = self.tracker()
        if step is None or step in self.stamped:
            return
        self.stamped.add(step)
        if not writer.contained(str(root / "x"), self.run_dir) or os.path.islink(root):
            self.say_once("link", f"{root} is a link (to {os.path.realpath(root)}): its steps are read through it, "
                                  "never stamped through it")
            return
        try:
            from vrun.rundir import checkpoints

            checkpoints.stamp(root, step, self.plan)
        except Exception as e:  # noqa: BLE001
            print(f"vrun: watchdog: checkpoint {step} not stamped: {_line(e)}", flush=True)


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def ray_view(out: Path, address: Optional[str], env: dict, timeout_s: float = 30.0) -> None:
    """Ray's nodes and actors as its GCS knows them, into out/ray.json (a child process: never this one's Ray)."""
    import subprocess
    import sys

    from vrun.core import writer

    if not address:
        return
    code = ("import json, ray\n"
            "ray.init(address=%r, logging_level='ERROR', log_to_driver=False)\n"
            "out = {'nodes': [{'host': n.get('NodeManagerHostname'), 'ip': n.get('NodeManagerAddress'),\n"
            "        'alive': n.get('Alive'), 'resources': n.get('Resources')} for n in ray.nodes()]}\n"
            "try:\n"
            "    from ray._private.state import state as s\n"
            "    out['actors'] = [{'class': a.get('ActorClassName'), 'state': a.get('State'),\n"
            "        'node': (a.get('Address') or {}).get('IPAddress'), 'pid': a.get('Pid')}\n"
            "        for a in s.actor_table(None).values()]\n"
            "except Exception as e:\n"
            "    out['actors_unavailable'] = repr(e)\n"
            "print(json.dumps(out))\n") % address
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout_s)
        text = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else json.dumps(
            {"unavailable": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:300]})
    except (OSError, subprocess.SubprocessError) as e:
        text = json.dumps({"unavailable": f"{type(e).__name__}: {e}"[:300]})
    writer.write_text(out / "ray.json", text + "\n", root=str(out.parent.parent))

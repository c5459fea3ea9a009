"""A Ray job seen from its own driver (cluster=ray, cluster=kuberay): its attempt as its submission numbered it
(VRUN_ATTEMPT), its submission id (Ray's job config), where its records go (`place`: the run dir when plan.json at
the path the plan recorded is this run, the nodes sharing its storage; else the job's working dir, Ray's uploaded
copy), and this driver's own output read back (`stdout_file`: Ray's job supervisor writes it to a regular file;
`tee_stdout` where it is no file). On cluster=ray, what the entry records of its own run where the run dir is shared
(`begin`, `finish`, `keep_log`): its start, its end and its log, so the read verbs need write nothing.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vrun.core import fs

SUBMISSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def attempt() -> int:
    """This job's attempt number as its submission set it (VRUN_ATTEMPT: vrun.launch.rayjobs), 0 where unset: the
    events it records join that attempt (vrun.rundir.state groups a Ray run's events by attempt)."""
    a = os.environ.get("VRUN_ATTEMPT", "0")
    return int(a) if a.isascii() and a.isdigit() and len(a) < 7 else 0


@dataclass(frozen=True)
class Place:
    """Where the job's records go: `dir`, the run dir itself when `same_run`, else the job's working dir."""
    dir: str
    same_run: bool
    why: str = ""   # why not the run dir


def place(here: str, record) -> Place:
    """The run dir at record.run_dir when its plan.json is this run's (run_id), else `here` (the job's copy)."""
    from vrun.rundir.files import RunDirError
    from vrun.rundir.record import PlanRecord

    target = str(record.run_dir)
    if os.path.realpath(here) == os.path.realpath(target):
        return Place(target, True)
    if not fs.is_dir(target):
        return Place(here, False, f"the run dir {target} is not on this node")
    try:
        other = PlanRecord.load(target)
    except RunDirError as e:
        return Place(here, False, f"the run dir {target} cannot be read here ({str(e)[:200]})")
    if other.run_id != record.run_id:
        return Place(here, False, f"{target} here holds another run ({other.run_id}, not {record.run_id})")
    return Place(target, True)


def submission_id() -> Optional[str]:
    """This job's submission id, from the job config Ray's supervisor gives its driver; None outside a Ray job."""
    try:
        meta = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")).get("metadata") or {}
    except (ValueError, AttributeError):
        return None
    sid = meta.get("job_submission_id") if isinstance(meta, dict) else None
    return sid if isinstance(sid, str) and SUBMISSION_ID.fullmatch(sid) else None


# ---------------------------------------------------------------------------------------------- the driver's log
def stdout_file() -> Optional[Path]:
    """/proc/<pid>/fd/1 when this process's stdout is a regular file (Ray's job supervisor writes it there)."""
    import stat

    path = Path(f"/proc/{os.getpid()}/fd/1")
    st, _ = fs.stat(path)
    return path if st is not None and stat.S_ISREG(st.st_mode) else None


def tee_stdout() -> Optional[Path]:
    """This process's stdout copied into a private temp file as it goes (fd 1 becomes a pipe read by a thread
    that writes on to the old stdout and the file); the file, or None where it cannot."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix="vrun-driver-", suffix=".log")
        r, w = os.pipe()
        sys.stdout.flush()
        old = os.dup(1)
        os.dup2(w, 1)
        os.close(w)
    except OSError:
        return None

    def pump() -> None:
        while True:
            try:
                data = os.read(r, 1 << 16)
            except OSError:
                return
            if not data:
                return
            for out in (old, fd):
                try:
                    os.write(out, data)
                except OSError:
                    pass

    threading.Thread(target=pump, name="vrun-tee", daemon=True).start()
    return Path(name)


# ---------------------------------------------------------------------------------------------- the job's own records
@dataclass
class Own:
    """What a cluster=ray job's entry records of its own run, in the run dir its nodes share: the job's start
    (`ray_running`), its end (`ray_ended`) and its log (job.log). The read verbs (`status`, `runs`, `logs`) write
    nothing: what they learn from the dashboard is shown, and this is what stays once the cluster forgets the job."""
    dir: str                 # the run dir (place: this run's, reachable here)
    ray_job: Optional[str]   # this job's submission id
    started: float           # unix seconds the entry started
    log: Optional[Path]      # this driver's stdout where it is a regular file
    ended: bool = False


OWN: list = []  # this process's Own once `begin` recorded it (the entry runs one job)
KEEP_LOCK = threading.Lock()  # one keeper at a time (the writer's temp file is named by the process)
KEEP_EVERY_S = 10.0  # how often the entry keeps its log while it runs, when it has grown (a head that dies ends it)


def begin(config_path: str) -> Optional[Own]:
    """At a cluster=ray job's entry, before verl starts: `ray_running` (the attempt, the job, when it started) in the
    run dir when it is this run's and reachable from here (`place`); None elsewhere (KubeRay, whose verbs read
    kubectl, or a run dir the nodes do not share: the verbs then show the dashboard's word); its log is then kept
    every KEEP_EVERY_S while it grows (`keep_while_running`). Never raises."""
    import time

    try:
        from vrun.rundir import records
        from vrun.rundir.record import PlanRecord

        here = os.path.dirname(os.path.abspath(config_path))
        record = PlanRecord.load(here)
        if str(record.cluster) != "ray":
            return None
        where = place(here, record)
        if not where.same_run:
            return None
        own = Own(where.dir, submission_id(), time.time(), stdout_file())
        records.record(own.dir, "ray_running", attempt=attempt(), **({"ray_job": own.ray_job} if own.ray_job else {}),
                       started=round(own.started, 3))
        OWN[:] = [own]
        if own.log is not None:
            threading.Thread(target=keep_while_running, name="vrun-keep-log", daemon=True).start()
        return own
    except Exception:  # noqa: BLE001 - recording never stops the training
        return None


def finish(state: str, error: Optional[BaseException] = None) -> None:
    """At the entry's end (verl's run_ppo returned, or raised): `ray_ended` with how the job ended in the run's words
    (`completed`, `failed: <the error's first line>`) and when, once; then its log kept (`keep_log`). Nothing where
    `begin` recorded nothing. Never raises."""
    import time

    if not OWN or OWN[0].ended:
        return
    own = OWN[0]
    own.ended = True
    try:
        from vrun.rundir import records

        phase = {}
        if error is not None:
            first = (str(error).strip().splitlines() or [""])[0][:200]
            phase = {"phase": f"failed: {type(error).__name__}" + (f": {first}" if first else "")}
        records.record(own.dir, "ray_ended", attempt=attempt(), **({"ray_job": own.ray_job} if own.ray_job else {}),
                       state=state, started=round(own.started, 3), ended=round(time.time(), 3), **phase)
    except Exception:  # noqa: BLE001
        pass
    keep_log()


def keep_log() -> None:
    """This driver's output so far (its last LOG_KEEP bytes) kept in the run dir as job.log through the writer:
    the measured steps and a failure's cause stay readable after the cluster forgets the job (`python -m vrun logs`
    prints it then). Nothing where `begin` recorded nothing or the output is no regular file. Never raises."""
    if not OWN or OWN[0].log is None:
        return
    own = OWN[0]
    try:
        from vrun.core import writer
        from vrun.rundir.joblog import JOB_LOG
        from vrun.rundir.rayjob import LOG_KEEP

        sys.stdout.flush()
        with KEEP_LOCK:
            data, _ = fs.read_checked(own.log, LOG_KEEP, binary=True, tail=True)
            if data is not None:
                writer.write_text(Path(own.dir) / JOB_LOG, data.decode("utf-8", errors="replace"), root=own.dir)
    except Exception:  # noqa: BLE001
        pass


def keep_while_running(every_s: float = KEEP_EVERY_S) -> None:
    """The log kept every `every_s` while this driver's output grows (a job whose head dies never reaches `finish`:
    its log up to then stays in the run dir). Runs in a daemon thread until the process ends."""
    import time

    size = -1
    while OWN and not OWN[0].ended:
        time.sleep(every_s)
        st, _ = fs.stat(OWN[0].log)
        if st is not None and st.st_size != size and not OWN[0].ended:
            size = st.st_size
            keep_log()

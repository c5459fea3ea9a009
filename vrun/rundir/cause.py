"""The cause of a failure, lifted out of a job's log: the first decisive line (a missing module, an out-of-memory,
an NCCL error, SLURM's own error, else the first Python exception that is not the project's own wrapping).
Standard library only (`python -m vrun runs` stays fast)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Optional

from vrun.core.writer import mask

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# strongest first: a line matching an earlier pattern wins over an earlier line matching a later one
DECISIVE = [
    re.compile(r"(?:^|\s|\))((?:ModuleNotFoundError|ImportError): .+)"),
    re.compile(r"^\S+: (No module named .+)$"),  # python -m <missing module>
    re.compile(r"^(?:\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s*)?(.*(?:OutOfMemoryError: |CUDA out of memory|oom-kill|"
               r"Out of memory).*)$"),
    re.compile(r"(NCCL (?:error|WARN).+|ncclInternalError.+|ncclSystemError.+)", re.I),
    re.compile(r"((?:slurmstepd(?:-[\w.-]+)?|srun): error: .+)"),
    re.compile(r"^(?:\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s*)?((?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): .+)$"),
]
# lines that only wrap another failure (this project's and submitit's)
WRAPPING = re.compile(r"the driver exited|torchrun on node|another node failed|Job \(task=|"
                      r"FailedJobError|exited \d+ \(see the job log\)|raise |^\s*File \"")


# how SLURM says it ended a job, in the job's own log (Debian's slurmstepd names itself with the node:
# `slurmstepd-n0: error: *** JOB 5 ON n0 CANCELLED AT <time> DUE TO TIME LIMIT ***`); the first that matches wins
ENDINGS = [
    ("timeout", re.compile(r"slurmstepd(?:-[\w.-]+)?: error: \*\*\* JOB \d+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT")),
    ("preempted", re.compile(r"slurmstepd(?:-[\w.-]+)?: error: \*\*\* JOB \d+ ON \S+ CANCELLED AT \S+ DUE TO PREEMPTION")),
    ("node_fail", re.compile(r"srun: error: Node failure on (\S+)|DUE TO NODE FAILURE")),
    ("cancelled", re.compile(r"slurmstepd(?:-[\w.-]+)?: error: \*\*\* JOB \d+ ON \S+ CANCELLED AT \S+ \*\*\*")),
]
# the line every node prints to both its streams when an attempt starts (vrun.launch.slurm.node): a log appended
# across attempts is read from the current attempt's marker on
MARKER = "vrun: attempt "


def marker(job_id: str, restart: int, host: str) -> str:
    return f"{MARKER}{job_id}.{restart} on {host}"


def ending(lines: Iterable[str]) -> Optional[tuple[str, str]]:
    """(kind, line) of SLURM's own word on how the job ended: timeout, preempted, node_fail, cancelled."""
    lines = [ANSI.sub("", line).strip() for line in lines]
    for kind, pattern in ENDINGS:
        for line in lines:
            if pattern.search(line):
                return kind, mask(line)[:300]  # masked before cut: a cut secret would not mask
    return None


def since(lines: list, key: Optional[str]) -> list:
    """The lines from the last marker of attempt `key` (`<job>.<restart>`) on; all of them when it has none."""
    if not key:
        return lines
    tag = f"{MARKER}{key} "
    for i in range(len(lines) - 1, -1, -1):
        if tag in lines[i]:
            return lines[i + 1:]
    return lines


def decisive_line(lines: Iterable[str]) -> Optional[str]:
    lines = [ANSI.sub("", line).strip() for line in lines]
    for pattern in DECISIVE:
        for line in lines:
            if WRAPPING.search(line):
                continue
            m = pattern.search(line)
            if m:
                return mask(m.group(1).strip())[:300]
    return None


def tail_lines(paths: Iterable[Path], key: Optional[str] = None, tail_bytes: int = 2_000_000) -> list:
    """The last `tail_bytes` of each regular file (stderr first), from attempt `key`'s marker on."""
    import os
    import stat

    found = []
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        except (OSError, ValueError):
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            with os.fdopen(fd, "rb", closefd=False) as f:
                size = f.seek(0, 2)
                f.seek(max(size - tail_bytes, 0))
                found.extend(since(f.read().decode(errors="replace").splitlines(), key))
        except OSError:
            continue
        finally:
            os.close(fd)
    return found


def from_files(paths: Iterable[Path], tail_bytes: int = 2_000_000, key: Optional[str] = None) -> Optional[str]:
    """The decisive line of these log files (stderr first), reading at most the last `tail_bytes` of each, from
    attempt `key`'s marker on."""
    return decisive_line(tail_lines(paths, key, tail_bytes))


# pending reasons in words (squeue %r); the others are shown as SLURM spells them
PENDING = {
    "Resources": "waiting for nodes to free up",
    "Priority": "other jobs are ahead in the queue",
    "PartitionNodeLimit": "more nodes than the partition allows: it will never start (cancel it; fewer nodes)",
    "PartitionTimeLimit": "a time limit above the partition's: it will never start (cancel it; lower cluster.time_min)",
    "ReqNodeNotAvail": "a requested node is down, drained or reserved",
    "Dependency": "waiting for another job",
    "BeginTime": "its start time has not come",
    "QOSMaxGRESPerUser": "your QOS's GPU limit is reached: it starts when your other jobs end",
    "AssocGrpGRES": "your account's GPU limit is reached",
    "JobHeldUser": "held (scontrol release <job>)",
    "JobHeldAdmin": "held by an administrator",
    "launch failed requeued held": "the launch failed on a node and SLURM held it",
}


def pending_words(reason: str) -> str:
    words = PENDING.get(reason)
    return f"{reason}: {words}" if words else reason

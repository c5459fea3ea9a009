"""The cause of a failure, lifted out of a job's log: the first decisive line (a missing module, an out-of-memory,
an NCCL error, SLURM's own error, else the first Python exception that is not the project's own wrapping).
Standard library only (`python -m vrun runs` stays fast)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Optional

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# strongest first: a line matching an earlier pattern wins over an earlier line matching a later one
DECISIVE = [
    re.compile(r"(?:^|\s|\))((?:ModuleNotFoundError|ImportError): .+)"),
    re.compile(r"^\S+: (No module named .+)$"),  # python -m <missing module>
    re.compile(r"^(?:\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s*)?(.*(?:OutOfMemoryError: |CUDA out of memory|oom-kill|"
               r"Out of memory).*)$"),
    re.compile(r"(NCCL (?:error|WARN).+|ncclInternalError.+|ncclSystemError.+)", re.I),
    re.compile(r"((?:slurmstepd|srun): error: .+)"),
    re.compile(r"^(?:\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s*)?((?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): .+)$"),
]
# lines that only wrap another failure (this project's and submitit's)
WRAPPING = re.compile(r"the driver exited|torchrun on node|another node failed|Job \(task=|"
                      r"FailedJobError|exited \d+ \(see the job log\)|raise |^\s*File \"")


def decisive_line(lines: Iterable[str]) -> Optional[str]:
    lines = [ANSI.sub("", line).strip() for line in lines]
    for pattern in DECISIVE:
        for line in lines:
            if WRAPPING.search(line):
                continue
            m = pattern.search(line)
            if m:
                return m.group(1).strip()[:300]
    return None


def from_files(paths: Iterable[Path], tail_bytes: int = 2_000_000) -> Optional[str]:
    """The decisive line of these log files (stderr first), reading at most the last `tail_bytes` of each."""
    found = []
    for p in paths:
        try:
            with open(p, "rb") as f:
                size = f.seek(0, 2)
                f.seek(max(size - tail_bytes, 0))
                found.append(f.read().decode(errors="replace").splitlines())
        except OSError:
            continue
    return decisive_line([line for lines in found for line in lines])


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

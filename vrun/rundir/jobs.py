"""SLURM's own record of a run's jobs: state, reason, restarts, nodes and end time, read the way the cluster keeps it.

One `squeue --states=all` call lists every job of this user that SLURM still holds, ended ones included (for
MinJobAge, 300 s by default, after they end): a job requeued by SLURM (node failure) or by the job itself (time
limit, preemption) keeps its id, its restart count going up. Jobs squeue no longer knows are asked of `sacct` where
accounting works (many clusters, the CI harness among them, keep none: then the run's own progress lines and log
are the record). Standard library only (`python -m vrun runs` stays fast); nothing here raises on what SLURM prints.
"""
from __future__ import annotations

import getpass
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

# states in which a job still holds, or waits for, an allocation (squeue's long names)
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
          "SUSPENDED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"}
FIELDS = ("JobID", "State", "Reason", "RestartCnt", "NodeList", "EndTime", "Name", "WorkDir")


@dataclass(frozen=True)
class Job:
    id: str
    state: str          # squeue/sacct's state word: PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, NODE_FAIL, ...
    reason: str = ""    # why pending, or why it ended (TimeLimit, NodeDown, ...); "" for None
    restarts: int = 0   # times SLURM started it again (its requeues)
    nodes: str = ""
    end: Optional[float] = None  # unix seconds: the time limit while it runs, the end once ended
    name: str = ""
    work_dir: str = ""  # the dir sbatch ran in (squeue's WorkDir); "" where sacct is the record
    source: str = "squeue"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def _when(text: str) -> Optional[float]:
    """SLURM's ISO time in the local zone (what squeue prints), or None for Unknown/None/anything else."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def parse_squeue(text: str) -> dict:
    """squeue -h -O JobID:|,State:|,... lines → {job id: Job}; lines of any other shape are skipped."""
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < len(FIELDS) or not parts[0]:
            continue
        jid, st, reason, restarts, nodes, end, name = parts[:len(FIELDS) - 1]
        work_dir = "|".join(parts[len(FIELDS) - 1:-1] or parts[len(FIELDS) - 1:])  # the last field, '|' and all
        out[jid] = Job(jid, st.split()[0] if st else "", "" if reason in ("None", "(null)") else reason,
                       _int(restarts), nodes, _when(end), name, work_dir)
    return out


def squeue(run=subprocess.run) -> Optional[dict]:
    """This user's jobs SLURM still holds, ended ones included: {job id: Job}. None when squeue cannot be run."""
    fmt = ",".join(f"{f}:|" for f in FIELDS)
    try:
        p = run(["squeue", "-h", "--states=all", "-u", getpass.getuser(), "-O", fmt], capture_output=True,
                text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode:
        return None
    return parse_squeue(p.stdout)


def not_this_runs(job: Job, name: Optional[str], work_dir: Optional[str]) -> str:
    """Why SLURM's record of a job id the run dir names is not the run's own job ("" when it is): the job name the
    plan gave sbatch and the dir it was submitted from, as squeue reports them (`squeue -O JobID,Name,WorkDir`)."""
    import os

    if not name:
        return "cannot be matched: the run's plan records no sbatch job name"
    if not work_dir:
        return "cannot be matched: the run dir did not record the dir it was submitted from (an earlier vrun)"
    if job.name != name:
        return f"is named {job.name!r} in squeue, not {name!r} (the run's sbatch job name)"
    same = os.path.normpath(job.work_dir) == os.path.normpath(work_dir) or \
        os.path.realpath(job.work_dir or "/nonexistent-") == os.path.realpath(work_dir)
    if not same:
        return f"runs in {job.work_dir or '(no dir)'} in squeue, not {work_dir} (where the run was submitted from)"
    return ""


def parse_sacct(text: str) -> dict:
    """sacct -n -P -X -o JobID,State,ExitCode,NodeList,End,Reason → {job id: Job} (the last line of an id wins:
    sacct lists a requeued job once per start)."""
    out = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 6 or not parts[0]:
            continue
        jid, st, _exit, nodes, end, reason = parts[:6]
        word = st.split()[0] if st.split() else ""
        prev = out.get(jid)
        out[jid] = Job(jid, word, "" if reason in ("None", "(null)") else reason,
                       (prev.restarts + 1) if prev else 0, nodes, _when(end), source="sacct")
    return out


def sacct(job_ids: list, run=subprocess.run) -> dict:
    """What accounting knows about these jobs; {} where it does not work (many clusters, the CI harness)."""
    if not job_ids:
        return {}
    try:
        p = run(["sacct", "-n", "-P", "-X", "-D", "-j", ",".join(job_ids), "-o", "JobID,State,ExitCode,NodeList,End,Reason"],
                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    if p.returncode:
        return {}
    return parse_sacct(p.stdout)

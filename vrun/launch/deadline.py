"""The job's deadline, given to verl's own pre-deadline save (what verl does with it, per verl and trainer, and the
plan's side of it: vrun/estimate/timelimit.py).

The node sets MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP (unix seconds), which
verl.utils.checkpoint.checkpoint_manager.should_save_ckpt_esi reads: RayPPOTrainer.fit (trainer.use_v1=false) asks it
after every step's update and saves when the deadline is within 60 s + the longest step so far +
trainer.esi_redundant_time, then trains on. The v1 trainer and the SFT trainer never ask (0.9.1, a6ef5009,
1dda039b): there the variable is inert.

The deadline is not the time limit: submitit's USR2 comes cluster.signal_delay_s before it (sbatch
--signal=USR2@<s>), and SLURM may send it up to 60 s earlier still (sbatch(1)); at the signal submitit requeues the
job or, with no requeue left, ends it. So the node gives verl EndTime − signal_delay_s − 60 s.

Where the end comes from (Slurm 22.05.8, Debian, on the CI harness): `squeue -h -j <id> -o %e` prints EndTime alone
(`2026-12-05T02:28:25`; `NONE` for an unlimited job, `N/A` while pending; no line once the job has left the queue);
`scontrol show job -o <id>` holds `EndTime=2026-12-05T02:28:25` (`EndTime=Unknown` unlimited or pending; it also has
an unrelated `Deadline=N/A`). Both print local time without a zone, in the client's TZ: they are run with TZ=UTC0
and read as UTC. Slurm 22.05 puts no end time in the job's environment; a SLURM_JOB_END_TIME (unix seconds) that
a newer Slurm sets is the last resort (it is not updated when the time limit changes, the controller's answer is).
"""
from __future__ import annotations

import calendar
import math
import os
import re
import subprocess
import time
from typing import Mapping, Optional

from vrun.core import fs
from vrun.estimate.timelimit import ESI_VAR, SIGNAL_EARLY_S, deadline

__all__ = ["ESI_VAR", "SIGNAL_EARLY_S", "parse_end", "job_end_time", "esi_env", "ray_env"]

CLIENT_TIMEOUT_S = 30
# the client's output in UTC whatever the node's zone (a POSIX TZ string: no zoneinfo file needed)
CLIENT_ENV = {"TZ": "UTC0"}
# a sane end: after 2001 and before 2200 (anything else is a misread)
PLAUSIBLE = (1.0e9, 7.3e9)
END_FIELD = re.compile(r"(?:^|\s)EndTime=(\S+)")


def parse_end(text) -> Optional[float]:
    """SLURM's EndTime (`YYYY-MM-DDTHH:MM:SS`, read as UTC) as unix seconds; None for Unknown, NONE, N/A, an empty
    or any other text."""
    try:
        t = float(calendar.timegm(time.strptime(str(text).strip(), "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError, TypeError):
        return None
    return t if PLAUSIBLE[0] < t < PLAUSIBLE[1] else None


def parse_scontrol(text) -> Optional[float]:
    """EndTime from `scontrol show job -o <id>`'s line."""
    m = END_FIELD.search(str(text or ""))
    return parse_end(m.group(1)) if m else None


def parse_epoch(text) -> Optional[float]:
    """A unix time in seconds written as digits (SLURM_JOB_END_TIME)."""
    s = str(text or "").strip()
    return float(s) if s.isdigit() and PLAUSIBLE[0] < float(s) < PLAUSIBLE[1] else None


def _ask(argv: list, run) -> str:
    try:
        p = run(argv, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, env={**os.environ, **CLIENT_ENV})
    except (OSError, subprocess.SubprocessError, ValueError):
        return ""
    if getattr(p, "returncode", 1) != 0 or not isinstance(getattr(p, "stdout", None), str):
        return ""
    return p.stdout


def job_end_time(job_id, run=subprocess.run, environ: Optional[Mapping[str, str]] = None) -> Optional[float]:
    """When SLURM will end this job (unix seconds), or None when it cannot say (unlimited, pending, gone, no client);
    never raises."""
    jid = str(job_id or "").strip()
    if not re.fullmatch(r"\d+(?:_\d+)?", jid):
        return None
    lines = _ask(["squeue", "-h", "-j", jid, "-o", "%e"], run).strip().splitlines()
    end = parse_end(lines[0]) if lines else None
    if end is None:
        end = parse_scontrol(_ask(["scontrol", "show", "job", "-o", jid], run))
    if end is None:
        env = os.environ if environ is None else environ
        if str(env.get("SLURM_JOB_ID", "")).strip() == jid:
            end = parse_epoch(env.get("SLURM_JOB_END_TIME"))
    return end


def esi_env(end_time: Optional[float], signal_delay_s) -> dict:
    """What the node sets so verl saves before submitit's signal stops the job ({} without an end)."""
    if end_time is None or isinstance(end_time, bool):
        return {}
    try:
        at = deadline(float(end_time), float(signal_delay_s or 0))
    except (TypeError, ValueError):
        return {}
    if not math.isfinite(at):
        return {}
    return {ESI_VAR: str(math.floor(at))}  # a whole second at or before it: a deadline rounds early


# ---------------------------------------------------------------------------------------------- a Ray job's end
def container_start(proc: str = "/proc") -> Optional[float]:
    """When this container started: its process 1's start (boot time + /proc/1/stat's starttime in clock ticks);
    None where /proc does not say."""
    stat = fs.read_small(f"{proc}/1/stat", 4096) or ""
    boot = next((line.split()[1] for line in (fs.read_small(f"{proc}/stat", 1 << 20) or "").splitlines()
                 if line.startswith("btime ") and len(line.split()) > 1), "")
    try:
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        t = int(boot) + ticks / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return None
    return t if PLAUSIBLE[0] < t < PLAUSIBLE[1] else None


def job_start(cluster: str, now: float, proc: str = "/proc", environ: Optional[Mapping[str, str]] = None) -> tuple:
    """(when the job's clock started, in words) as its entry can tell.

    cluster=ray: the entry's own start. Ray's set-up before it (the working dir's upload, the runtime env) is not
    counted: the job's end is that much later than a clock started at submission would put it, which suits a
    limit the entry itself enforces (vrun.launch.raywatch ends the job there).
    cluster=kuberay: the head pod's container start (its process 1) where the entry runs under Kubernetes, else the
    entry's start. The operator counts activeDeadlineSeconds from the RayJob's own start, before the pods were
    scheduled and their image pulled: the end told here is later than the operator's by that time (over-counted),
    and the entry's work before the first step is counted in both. cluster.signal_delay_s is kept before the end
    (with SIGNAL_EARLY_S) as the margin that covers it."""
    env = os.environ if environ is None else environ
    if cluster == "kuberay" and env.get("KUBERNETES_SERVICE_HOST"):
        t = container_start(proc)
        if t is not None and t <= now:
            return t, "the head pod's start"
    return now, "the job entry's start"


def ray_env(cluster: str, time_min, signal_delay_s, now: Optional[float] = None, proc: str = "/proc",
            environ: Optional[Mapping[str, str]] = None) -> tuple:
    """cluster=ray or kuberay: (verl's deadline env, the job's end in unix seconds, the line that says how) from
    cluster.time_min (KubeRay's activeDeadlineSeconds is time_min × 60) counted from job_start; ({}, None, why)
    where time_min is not a positive whole number of minutes giving a plausible end."""
    now = time.time() if now is None else now
    if isinstance(time_min, bool) or not isinstance(time_min, (int, float)) or not math.isfinite(time_min) \
            or time_min <= 0:
        return {}, None, f"deadline: cluster.time_min={time_min!r} is no time limit: verl is given none"
    start, how = job_start(cluster, now, proc, environ)
    end = start + float(time_min) * 60
    if not PLAUSIBLE[0] < end < PLAUSIBLE[1]:
        return {}, None, f"deadline: cluster.time_min={time_min} ends past any plausible date: verl is given none"
    env = esi_env(end, signal_delay_s)
    return env, end, (f"deadline: the job ends at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(end))} UTC "
                      f"(cluster.time_min={time_min} from {how}); verl saves before {env.get(ESI_VAR, '?')}")

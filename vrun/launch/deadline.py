"""The job's deadline, given to verl's own pre-deadline save.

verl (0.9.1, a6ef5009 and 1dda039b alike) reads `MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP` (unix seconds) in
`verl.utils.checkpoint.checkpoint_manager.should_save_ckpt_esi(max_steps_duration, save_ckpt_duration=60,
redundant_time=0)`: true when 0 < remaining ≤ save_ckpt_duration + max_steps_duration + redundant_time. The PPO
trainer (ray_trainer.py `fit`) calls it after every step with the longest step so far and
`trainer.esi_redundant_time`, and saves when it is true (a message says the expiration approaches), then trains on.
SFT's trainer has no such call: an SFT run's steps after its last save are lost at the limit.

On SLURM the real deadline is not the time limit: submitit stops the job (or requeues it) at its signal,
`cluster.signal_delay_s` before the limit. So the node gives verl EndTime − signal_delay_s. EndTime is what
SLURM says the job's end is (`squeue -h -j <id> -O EndTime`, in the client's local time: `2026-12-05T01:02:21`).
"""
from __future__ import annotations

import subprocess
import time
from typing import Optional

ESI_VAR = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"


def parse_end(text: str) -> Optional[float]:
    """SLURM's EndTime (local time, ISO without a zone) as unix seconds; None for Unknown, None or anything else."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError, AttributeError):
        return None


def job_end_time(job_id: str, run=subprocess.run) -> Optional[float]:
    """When SLURM will end this job (its time limit), or None when squeue cannot say."""
    if not str(job_id).isdigit():
        return None
    try:
        p = run(["squeue", "-h", "-j", str(job_id), "-O", "EndTime"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode or not p.stdout.strip():
        return None
    return parse_end(p.stdout.strip().splitlines()[0])


def esi_env(end_time: Optional[float], signal_delay_s: float) -> dict:
    """What the node sets so verl saves before submitit's signal stops the job."""
    if end_time is None:
        return {}
    return {ESI_VAR: str(int(end_time - max(float(signal_delay_s or 0), 0.0)))}

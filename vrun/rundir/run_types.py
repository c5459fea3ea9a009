"""A run read back, as typed objects: `Run` (its plan, its SLURM or Ray record, its progress lines, its state) and
`Attempt` (one start of it), the state words they take (STATES, ACTIVE), the order of an attempt's events (RANK),
SLURM's end states in those words (SLURM_ENDS) and a time limit's ending in words. vrun.rundir.state fills them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vrun.core import fs
from vrun.rundir.record import PlanRecord


# the order of the phases within one attempt (a submitter and a node may write in either order)
RANK = {"submitted": 0, "requeued": 0, "started": 1, "ray_running": 1, "resumed": 1, "nodes_joined": 2, "ray_up": 3,
        "entrypoint_started": 4, "stalled": 5, "unstalled": 5, "stall_action": 5, "node_check": 5, "signalled": 6,
        "time_limit": 6,
        "slow": 5, "slow_over": 5, "exited": 7, "failed": 7, "ray_ended": 7, "cancelled": 8, "stopped": 8}


# a run's states; the first three are still holding or waiting for an allocation
ACTIVE = ("pending", "running", "requeued")


STATES = ("planned", "pending", "running", "requeued", "completed", "failed", "cancelled", "timeout", "node_fail",
          "preempted", "lost")


# SLURM's end states → this project's (a job may end COMPLETED after its task failed: the run's own lines decide)
SLURM_ENDS = {"COMPLETED": "completed", "CANCELLED": "cancelled", "TIMEOUT": "timeout", "NODE_FAIL": "node_fail",
              "PREEMPTED": "preempted", "FAILED": "failed", "OUT_OF_MEMORY": "failed", "BOOT_FAIL": "failed",
              "DEADLINE": "timeout", "SPECIAL_EXIT": "failed", "REVOKED": "cancelled"}


@dataclass
class Attempt:
    """One start of the run: a SLURM job id and its restart count (SLURM requeues keep the id), or one local
    launch. Its state comes from its own progress lines, then SLURM's record of its job."""
    n: int
    job_id: Optional[str]
    restart: int
    events: list
    state: str = "pending"
    phase: str = "submitted"
    end: str = ""                      # how it ended, in words ("" while it runs)
    hosts: list = field(default_factory=list)
    failure: Optional[dict] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    pid: Optional[int] = None
    host: Optional[str] = None

    @property
    def key(self) -> str:
        return f"{self.job_id}.{self.restart}"

    def last(self, event: str) -> Optional[dict]:
        return next((e for e in reversed(self.events) if e["event"] == event), None)


@dataclass
class Run:
    dir: Path
    plan: PlanRecord
    slurm: Optional[dict]
    events: list
    attempts: list = field(default_factory=list)
    state: str = "planned"
    phase: str = ""
    attempt: int = 0
    job_id: Optional[str] = None
    job_ids: list = field(default_factory=list)
    hosts: list = field(default_factory=list)
    failure: Optional[dict] = None
    reason: str = ""
    elapsed_s: float = 0.0
    when: float = 0.0
    pid: Optional[int] = None
    host: Optional[str] = None
    stall: Optional[dict] = None       # the last `stalled` event of the current attempt, unless progress resumed
    slow: list = field(default_factory=list)  # the current attempt's phases slow now (vrun.rundir.slowness)
    resumed: Optional[dict] = None     # the current attempt's `resumed` event (the checkpoint it started from)
    ray: Optional[dict] = None         # cluster=ray: the job's address and id (vrun.rundir.rayrecord.load)
    ray_problem: str = ""              # cluster=ray: why ray_job.json was refused (one line), "" when it was not
    ray_error: str = ""                # cluster=ray: why its dashboard gave no word on the job this time
    ray_error_kind: str = ""           # and what came back (vrun.core.remote.KINDS)
    ray_log: Optional[str] = None      # cluster=ray: the job's log as its dashboard gave it this time (shown,
                                       # never stored: the job's entry keeps its own as job.log)

    @property
    def gpus(self) -> int:
        return self.plan.mesh.world

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.elapsed_s / 3600.0

    @property
    def on_slurm(self) -> bool:
        return self.slurm is not None

    @property
    def on_ray(self) -> bool:
        """Submitted to a standing Ray cluster (its ray_job.json read, or refused: ray_problem says why)."""
        return self.ray is not None or bool(self.ray_problem)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def restarts(self) -> int:
        """Starts after the first: SLURM's requeues, the job's own requeues and resubmissions alike."""
        return max(len([a for a in self.attempts if a.started is not None or a.n > 0]) - 1, 0)

    def checkpoint_step(self) -> Optional[int]:
        """The last checkpoint step verl left under <run dir>/checkpoints (trainer.default_local_dir)."""
        d = self.dir / "checkpoints"
        text = fs.read_small(d / "latest_checkpointed_iteration.txt", 64)
        if text is not None and text.strip().isdigit():
            return int(text.strip())
        try:
            steps = [int(p.name.rpartition("_")[2]) for p in d.iterdir() if p.name.startswith("global_step_")
                     and p.name.rpartition("_")[2].isdigit()]
        except OSError:
            return None
        return max(steps) if steps else None

    def summary(self) -> dict:
        p = self.plan
        return {"run_dir": str(self.dir), "model": p.model.name, "algo": p.algo,
                "gpus": self.gpus, "mode": p.mode, "cluster": p.cluster, "state": self.state,
                "phase": self.phase, "reason": self.reason, "job_id": self.job_id, "job_ids": self.job_ids,
                "attempt": self.attempt, "restarts": self.restarts, "elapsed_s": round(self.elapsed_s, 1),
                "gpu_hours": round(self.gpu_hours, 3), "checkpoint_step": self.checkpoint_step(),
                "failure": self.failure, "hosts": self.hosts, "when": self.when, "stall": self.stall,
                "slow": self.slow,
                "resumed": self.resumed, **({"ray": self.ray} if self.ray else {}),
                "attempts": [{"n": a.n, "job_id": a.job_id, "restart": a.restart, "state": a.state, "end": a.end,
                              "hosts": a.hosts} for a in self.attempts]}


def time_limit_words(e: dict) -> str:
    step = e.get("step")
    saved = f"step {step} saved" if isinstance(step, int) else "no checkpoint saved"
    if e.get("requeued"):
        return f"time limit: {saved}, requeued"
    return f"time limit: {saved}" + (f"; {e['why']}" if isinstance(e.get("why"), str) else "")

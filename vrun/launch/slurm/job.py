"""SLURM: the callable submitit runs on every node (`RunJob`): the plan read back, the node opened
(vrun.launch.slurm.node), the stack and the checkpoint checked, then the entrypoint's role — the Ray head or a
worker (vrun.launch.slurm.ray_node), or a torchrun node (vrun.launch.slurm.torchrun_node). Its `checkpoint` is what
submitit calls on the requeue signal (the time limit, a preemption)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from vrun import entrypoints
from vrun.config.schema import EntrypointName
from vrun.launch.slurm.node import Node, checkpoint_step_of, restart_count, signal_delay_of, check_node, check_stack
from vrun.launch.slurm.ray_node import ray_head, ray_worker
from vrun.launch.slurm.torchrun_node import torchrun_node
from vrun.rundir import records as rundir
from vrun.rundir.record import PlanRecord


@dataclass
class RunJob:
    """The callable submitit runs on every node of the allocation; requeues itself on timeout/preemption. It names
    the run dir only: every node reads the plan from its plan.json (vrun.rundir.record.PlanRecord, the run dir being
    on storage the nodes share), and refuses one whose run id is not the submitted one."""
    run_dir: str
    run_id: str
    attempt: int = 0

    def plan(self) -> PlanRecord:
        plan = PlanRecord.load(self.run_dir)
        if plan.run_id != self.run_id:
            raise RuntimeError(f"{self.run_dir}/plan.json: run id {plan.run_id}, not the submitted {self.run_id} "
                               "(the run dir was planned again since): submit it again")
        return plan

    def __call__(self) -> Any:
        import submitit

        t_start = time.monotonic()
        plan = self.plan()
        node = Node.open(self, plan, submitit.JobEnvironment(), t_start)
        node.mark()
        if node.rank == 0:
            node.record_attempt()
        try:
            check_stack(plan.stack, node.where)
            check_node(plan.node_checks, node.where)
            if node.rank == 0 and plan.mode == "train":
                node.resume()
            if not entrypoints.ENTRYPOINTS[EntrypointName(plan.launcher)].uses_ray:
                return torchrun_node(node)
            return ray_head(node) if node.rank == 0 else ray_worker(node)
        except Exception as e:
            if type(e).__name__ == "UncompletedJobError":  # submitit: the time limit, and no requeue left
                if node.rank == 0:
                    node.record("time_limit", requeued=False, step=node.checkpoint_step(),
                                why=f"no requeue left (cluster.max_requeues={node.cluster.max_requeues})")
                    node.release()
                raise
            if not node.failed:
                node.record_failure(str(e).splitlines()[0] if str(e) else type(e).__name__)
            raise

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Requeue (time limit or preemption) with the same run dir; verl resumes (trainer.resume_mode=auto). Only the
        signal is recorded here: submitit requeues after this returns, if a requeue is left, and the requeue itself is
        read from SLURM's record (its restart count), never assumed."""
        import submitit

        from vrun.launch import deadline

        job_id = os.environ.get("SLURM_JOB_ID", "")
        end = deadline.job_end_time(job_id) if job_id else None
        delay = signal_delay_of(self.run_dir)
        near_end = end is not None and time.time() >= end - delay - 60
        step = checkpoint_step_of(self.run_dir)
        saved = f"step {step} saved" if step is not None else "no checkpoint saved yet"
        why = f"the time limit ({saved})" if near_end else f"preemption ({saved})"
        rundir.record(self.run_dir, "signalled", job_id=job_id or None, restart=restart_count(), attempt=self.attempt,
                      why=why, step=step)
        return submitit.helpers.DelayedSubmission(RunJob(self.run_dir, self.run_id, self.attempt + 1))

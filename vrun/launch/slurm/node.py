"""SLURM: the job on every node of the allocation (vrun.launch.slurm.submit submits it from the login node).

Every node runs RunJob (tasks_per_node=1); submitit's JobEnvironment says which node it is. An attempt is one start of
the job: its SLURM job id and restart count (SLURM's requeues, and the job's own at its time limit, keep the id). On
each node:

1. RunJob (vrun.launch.slurm.job) opens the node's Node: its control dir <run_dir>/.vrun/job-<id>-<attempt>[-r<restart>] (the run dir is on
   storage every node shares), its ports, the environment its children start with (the run's, the job's deadline for
   verl's pre-deadline save: vrun.launch.deadline), and prints the attempt's marker line to both its streams (the log
   is appended across attempts: vrun.rundir.cause reads an attempt from its marker on). Node 0 records the attempt.
2. check_stack: the node's verl and verl_mlite must be those the plan was composed against. Node 0 then checks the
   checkpoint verl will resume from (vrun.rundir.checkpoints): whole, and this plan's, or refused/skipped, saying so.
3. The entrypoint's record says what runs (vrun.launch.slurm.ray_node: the Ray head and workers and the driver;
   vrun.launch.slurm.torchrun_node: SFT). Node 0 watches the training (vrun.launch.watchdog); every node answers a
   stall's dump request (its processes' stacks) while it waits.
A node that fails writes `failed-<rank>` with its error line (node 0 also releases the others): the job fails at once
naming that node instead of at the join timeout or the time limit. A node stopped by SLURM (scancel, the time limit,
a requeue) records what SLURM says it is, not a failure of its own. Children are stopped on every exit path.
A stall's dump and action are NodeStall's (vrun.launch.slurm.node_stall), the checks before anything starts
vrun.launch.slurm.node_checks'; their names are importable from here.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from vrun.config.schema import Cluster
from vrun.core import fs, writer
from vrun.launch.environment import child_environ
from vrun.launch.slurm.node_checks import check_node, check_stack, cluster_of  # noqa: F401 - importable from here
from vrun.launch.slurm.node_stall import NodeStall
from vrun.launch.slurm.procs import exited, kill, ports
from vrun.rundir import records as rundir
from vrun.rundir.record import PlanRecord

POLL_S = 0.5


class StoppedBySlurm(Exception):
    """SLURM's SIGTERM (scancel, the time limit, a requeue): the node unwinds, stopping its children (Ray daemons
    started in their own sessions would otherwise outlive the job where SLURM tracks processes by parentage)."""


def restart_count() -> int:
    r = os.environ.get("SLURM_RESTART_COUNT", "0")
    return int(r) if r.isdigit() else 0


def signal_delay_of(run_dir: str) -> float:
    try:
        return float(PlanRecord.load(run_dir).cluster_group.get("signal_delay_s") or 0)
    except Exception:  # noqa: BLE001
        return 0.0


def checkpoint_step_of(run_dir: str) -> Optional[int]:
    text = fs.read_small(Path(run_dir) / "checkpoints" / "latest_checkpointed_iteration.txt", 64)
    return int(text.strip()) if text and text.strip().isdigit() else None


# ==================================================================== this node in this attempt
@dataclass
class Node(NodeStall):
    """One node of one attempt: who it is (submitit's JobEnvironment), the control dir it shares with the other
    nodes, its ports, how it starts children, and whether the job has been released."""
    job: Any           # vrun.launch.slurm.job.RunJob
    plan: PlanRecord    # the run dir's plan.json
    env: Any            # submitit.JobEnvironment
    ctl: Path           # <run_dir>/.vrun/job-<id>-<attempt>[-r<SLURM restart>]
    t_start: float      # time.monotonic() when the task started
    cluster: Cluster    # the run's cluster group, typed again from the job's plain values
    failed: bool = False  # this node has recorded its failure
    served: set = field(default_factory=set)    # the stall dump requests this node has answered
    terminated: Optional[float] = None          # when SLURM's SIGTERM came (scancel, time limit, requeue)
    dashboard_port: Optional[int] = None        # node 0: the port the Ray head's dashboard took (ray_node.ray_head)

    @classmethod
    def open(cls, job: Any, plan: PlanRecord, env: Any, t_start: float) -> "Node":
        # a requeue by SLURM itself (node failure, preemption) reruns the same job and attempt: its own dir
        restart = os.environ.get("SLURM_RESTART_COUNT", "0")
        name = f"job-{env.job_id}-{job.attempt}" + ("" if restart == "0" else f"-r{restart}")
        ctl = Path(job.run_dir) / ".vrun" / name
        ctl.mkdir(parents=True, exist_ok=True)
        return cls(job, plan, env, ctl, t_start, cluster_of(plan.cluster_group))

    @property
    def gpus(self) -> int:
        """The GPUs each node offers Ray and the head waits for: cluster.ray.num_gpus, else the mesh's."""
        return int(self.cluster.ray.num_gpus or self.plan.mesh.gpus_per_node)

    @property
    def rank(self) -> int:
        return self.env.node

    @property
    def restart(self) -> int:
        return restart_count()

    @property
    def where(self) -> str:
        return f"node {self.rank} ({socket.gethostname()})"

    @property
    def ports(self) -> dict:
        return ports(self.env.job_id)

    def checkpoint_step(self) -> Optional[int]:
        return checkpoint_step_of(self.job.run_dir)

    # ---------------------------------------------------------------- records
    def record(self, event: str, **fields) -> None:
        rundir.record(self.job.run_dir, event, job_id=self.env.job_id, restart=self.restart, attempt=self.job.attempt,
                      **fields)

    def mark(self) -> None:
        """The attempt's marker on both streams (a log appended across attempts is read from it on), and SIGTERM
        noted: SLURM sends it before it kills a job it cancels, times out or requeues."""
        from vrun.rundir.cause import marker

        line = marker(str(self.env.job_id), self.restart, socket.gethostname())
        print(line, flush=True)
        print(line, file=sys.stderr, flush=True)
        before = signal.getsignal(signal.SIGTERM)

        def noted(signum, frame):
            first = self.terminated is None
            self.terminated = self.terminated or time.time()
            if callable(before):
                before(signum, frame)
            if first:  # unwind now: every way out stops this node's children before SLURM's SIGKILL
                raise StoppedBySlurm("SIGTERM from SLURM")

        try:
            signal.signal(signal.SIGTERM, noted)
        except ValueError:  # not the main thread (tests)
            pass

    def record_attempt(self) -> None:
        """Node 0: one line in slurm_attempts.jsonl and the `started` event."""
        writer.append_line(Path(self.job.run_dir) / "slurm_attempts.jsonl", json.dumps(
            {"job_id": self.env.job_id, "restart": self.restart, "attempt": self.job.attempt,
             "hosts": self.env.hostnames, "time": time.time()}), root=self.job.run_dir)
        self.record("started", hosts=self.env.hostnames, nodes=self.env.num_nodes)

    def resume(self) -> None:
        """Node 0, before anything starts: the checkpoint verl will load is whole and this plan's, or the last whole
        one is made the one it loads, or none (step 0) — each said in the log and recorded as `resumed`."""
        from vrun.rundir import checkpoints

        decision = checkpoints.check(Path(self.job.run_dir) / "checkpoints", self.plan,
                                     lambda line: print(line, flush=True))
        if decision.refused is not None:
            raise RuntimeError(decision.refused.line())
        from vrun.rundir import no_progress  # restarts that make no progress stop here, before anything starts

        stop = no_progress.judge(rundir.events(self.job.run_dir), decision.step, self.cluster.no_progress_attempts,
                                 no_progress.save_freq_of(self.plan))
        if stop is not None:
            self.record("stopped", **stop.fields())
            print(f"vrun: {stop.line()}", flush=True)
            self.fail(stop.line())
            self.failed = True
            raise RuntimeError(stop.line())
        self.record("resumed", **checkpoints.resumed_fields(decision))

    # ---------------------------------------------------------------- children
    def environ(self, extra: dict) -> dict:
        """The environment children start with: the run's (vrun.launch.environment, from the task's, with
        ROCR/HIP unset when SLURM set CUDA_VISIBLE_DEVICES on this node), the job's deadline for verl's
        pre-deadline save (vrun.launch.deadline), this attempt's number, then `extra`."""
        from vrun.rundir import checkpoints

        e = child_environ(os.environ, self.plan.env, self.plan.env_unset, self.plan.run_id, self.job.run_dir)
        e.update(self.deadline_env())
        e["VRUN_ATTEMPT"] = str(self.job.attempt)
        e[checkpoints.CHECKED_ENV] = "1"  # node 0 checked it before anything started (resume)
        e.update(extra)
        return e

    def deadline_env(self) -> dict:
        """verl's pre-deadline save fed with this job's end (looked up once per node and attempt)."""
        if not os.environ.get("SLURM_JOB_ID"):
            return {}
        if not hasattr(self, "_deadline"):
            from vrun.launch import deadline

            end = deadline.job_end_time(str(self.env.job_id))
            self._deadline = deadline.esi_env(end, self.cluster.signal_delay_s) if end else {}
        return self._deadline

    def start_setup(self, extra: dict) -> Optional[subprocess.Popen]:
        """Start cluster.node_setup's lines (one bash -e script), if any."""
        lines = self.cluster.node_setup
        if not lines:
            return None
        return subprocess.Popen(["bash", "-ec", "\n".join(lines)], env=self.environ(extra), start_new_session=True)

    def wait_setup(self, proc: Optional[subprocess.Popen]) -> bool:
        """Wait for the node's setup lines; False when the job is released first (the head gave up)."""
        if proc is None:
            return True
        while proc.poll() is None:
            if self.released():
                kill(proc)
                return False
            self.pause()
        if proc.returncode:
            raise RuntimeError(f"cluster.node_setup failed on {self.where} with exit code {proc.returncode}"
                               if proc.returncode > 0 else f"cluster.node_setup on {self.where} "
                               f"{exited(proc.returncode)}")
        return True

    # ---------------------------------------------------------------- the control dir
    def publish(self, name: str, text: str) -> None:
        """Written whole, then renamed: another node never reads it half-written (shared storage)."""
        part = self.ctl / f".{name}.{self.rank}.part"
        part.write_text(text)
        os.replace(part, self.ctl / name)

    def wait_for(self, name: str) -> Optional[str]:
        """What another node published as `name`; None when the job is released first."""
        while not fs.exists(self.ctl / name):
            if self.released():
                return None
            self.pause()
        return (fs.read_checked(self.ctl / name, 1 << 16, own=True)[0] or "").strip()

    def released(self) -> bool:
        return fs.exists(self.ctl / "released")

    def pause(self, seconds: float = POLL_S) -> None:
        """A wait loop's sleep, answering a stall's dump request meanwhile."""
        self.serve()
        time.sleep(seconds)

    def fail(self, error: str) -> None:
        """Tell the other nodes this one failed (`failed-<rank>` holds the line); node 0 also releases them."""
        self.publish(f"failed-{self.rank}", error if self.where in error else f"{self.where}: {error}")
        if self.rank == 0:
            self.release()

    def failure(self) -> Optional[str]:
        """Another node's error line, once one has failed."""
        for f in sorted(self.ctl.glob("failed-*")):
            if f.name != f"failed-{self.rank}":
                return (fs.read_checked(f, 1 << 16, own=True)[0] or f"{f}: unreadable").strip()
        return None

    def wait_unless_failed(self, proc: subprocess.Popen) -> int:
        """proc's exit code; another node failing first stops the wait (the caller stops proc)."""
        while proc.poll() is None:
            other = self.failure()
            if other:
                raise RuntimeError(f"another node failed: {other}")
            self.pause()
        return proc.returncode

    def release(self) -> None:
        self.publish("released", "1")

    def record_failure(self, line: str) -> str:
        """Record this node's failure at once (before its children are stopped), with the cause its log holds,
        and tell the other nodes. Returns the line. A node SLURM is stopping records what SLURM says instead."""
        ended = self.stopped_by_slurm()
        if ended:
            self.record("signalled", why=ended, step=self.checkpoint_step(), node=self.rank)
            if ended.startswith("the time limit") and self.rank == 0:
                self.record("time_limit", requeued=False, step=self.checkpoint_step())
            self.fail(f"stopped by SLURM: {ended}")
            self.failed = True
            return line
        cause = self.cause()
        if cause and cause not in line:
            line = f"{line.replace(' (see the job log)', '')}: {cause}"
        self.record("failed", node=self.rank, error=line)
        self.fail(line)
        self.failed = True
        return line

    def stopped_by_slurm(self) -> Optional[str]:
        """After SLURM's SIGTERM: why SLURM is stopping this job (its state word), else None."""
        if self.terminated is None:
            return None
        from vrun.rundir import jobs

        job = (jobs.squeue() or {}).get(str(self.env.job_id))
        words = {"CANCELLED": "a cancellation", "TIMEOUT": "the time limit", "PREEMPTED": "preemption",
                 "NODE_FAIL": "a node failure", "REQUEUED": "a requeue", "PENDING": "a requeue",
                 "COMPLETING": "the job ending"}
        return words.get(job.state, f"SLURM state {job.state}") if job else "a signal from SLURM"

    def cause(self) -> Optional[str]:
        """The first decisive line this node's log holds so far in this attempt (its children write there too)."""
        from vrun.rundir.cause import from_files

        sys.stdout.flush()
        sys.stderr.flush()
        try:
            paths = self.env.paths
            return from_files([paths.stderr, paths.stdout], key=f"{self.env.job_id}.{self.restart}")
        except Exception:  # noqa: BLE001 - no cause is no worse than before
            return None


def start_watchdog(node: Node, ray_address: Optional[str] = None):
    """Node 0: watch the training as its step lines reach this node's log (mode=train only)."""
    from vrun.launch.watchdog import Watchdog

    if node.plan.mode != "train" or node.plan.watch is None:
        return None
    from vrun.launch.phases import RayPhases

    host = ray_address.rsplit(":", 1)[0].strip("[]") if ray_address else ""
    port = node.dashboard_port or node.ports["dashboard"]
    dash = f"http://{f'[{host}]' if ':' in host else host}:{port}" if host else None
    dog = Watchdog(node.job.run_dir, Path(node.env.paths.stdout), node.plan.watch, record=node.record,
                   collect=lambda n, out: node.collect(n, out, ray_address), act=node.act, plan=node.plan,
                   phases=RayPhases(dash) if dash else None)
    dog.start()
    return dog



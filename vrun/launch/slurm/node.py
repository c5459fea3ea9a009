"""SLURM: the job on every node of the allocation (vrun.launch.slurm.submit submits it from the login node).

Every node runs RunJob (tasks_per_node=1); submitit's JobEnvironment says which node it is. On each node:

1. RunJob opens the node's Node: its control dir <run_dir>/.vrun/job-<id>-<attempt>[-r<restart>] (the run dir is on storage
   every node shares), its ports, the environment its children start with. Node 0 records the attempt.
2. check_stack: the node's verl and verl_mlite must be those the plan was composed against.
3. The entrypoint's record says what runs; every role first runs cluster.node_setup (unless released meanwhile).
   - PPO (GRPO/DAPO) on Ray, node 0 — ray_head: start the Ray head and publish its address (`head`), poll until
     exactly nnodes nodes with the expected GPUs are alive (`bringup.json`), run the plan's driver
     (vrun.launch.entry → verl's run_ppo) against that cluster, then release the workers (`released`).
   - PPO on Ray, the other nodes — ray_worker: wait for the head's address, join it, stay until released.
   - SFT, every node — torchrun_node: node 0 publishes its address (`master`), the others wait for it; each runs
     torchrun with its node rank; node 0 releases when its torchrun is done.
A node that fails writes `failed-<rank>` with its error line (node 0 also releases the others): the head stops
waiting for nodes or stops the driver, torchrun nodes stop theirs, and the job fails at once naming that node
instead of at the join timeout or the time limit.
Ray daemons (`ray start --block`) and torchrun are children of the task, each in its own process group, and are
stopped on every exit path. Coordination goes through files in the control dir: no fixed sleeps.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from vrun import entrypoints
from vrun.rundir import records as rundir
from vrun.compose import stack
from vrun.core import writer
from vrun.launch.environment import child_environ
from vrun.config.schema import Cluster, EntrypointName, RayCfg
from vrun.rundir.record import PlanRecord
from vrun.core import fs

POLL_S = 0.5


def ports(job_id: str) -> dict:
    """A block of 1000 ports per job, from the job id: two jobs sharing a node do not collide (40 blocks)."""
    digits = "".join(ch for ch in str(job_id) if ch.isdigit()) or "0"
    base = 20000 + (int(digits) % 40) * 1000
    return {"gcs": base, "node_manager": base + 1, "object_manager": base + 2, "client": base + 3,
            "metrics": base + 4, "agent_grpc": base + 5, "agent_listen": base + 6, "dashboard": base + 7,
            "runtime_env_agent": base + 8, "torch": base + 9, "min_worker": base + 100, "max_worker": base + 999}


def node_ip(interface: Optional[str] = None, host: Optional[str] = None) -> str:
    """This node's IPv4 address: on `interface` when given (several NICs), else the hostname's address."""
    if interface:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", interface], capture_output=True, text=True)
        for word in out.stdout.split():
            if "/" in word and word.count(".") == 3:
                return word.split("/")[0]
        raise RuntimeError(f"cluster.ray.interface={interface}: no IPv4 address on this node "
                           f"({socket.gethostname()})")
    return socket.gethostbyname(host or socket.gethostname())


# ==================================================================== the submitit callable
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
        if node.rank == 0:
            node.record_attempt()
        try:
            check_stack(plan.stack, node.where)
            check_node(plan.node_checks, node.where)
            if not entrypoints.ENTRYPOINTS[EntrypointName(plan.launcher)].uses_ray:
                return torchrun_node(node)
            return ray_head(node) if node.rank == 0 else ray_worker(node)
        except Exception as e:
            if not node.failed:
                node.record_failure(str(e).splitlines()[0] if str(e) else type(e).__name__)
            raise

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Requeue (time limit or preemption) with the same run dir; verl resumes (trainer.resume_mode=auto)."""
        import submitit

        rundir.record(self.run_dir, "requeued", attempt=self.attempt + 1)
        return submitit.helpers.DelayedSubmission(RunJob(self.run_dir, self.run_id, self.attempt + 1))


# ==================================================================== this node in this attempt
@dataclass
class Node:
    """One node of one attempt: who it is (submitit's JobEnvironment), the control dir it shares with the other
    nodes, its ports, how it starts children, and whether the job has been released."""
    job: RunJob
    plan: PlanRecord    # the run dir's plan.json
    env: Any            # submitit.JobEnvironment
    ctl: Path           # <run_dir>/.vrun/job-<id>-<attempt>[-r<SLURM restart>]
    t_start: float      # time.monotonic() when the task started
    cluster: Cluster    # the run's cluster group, typed again from the job's plain values
    failed: bool = False  # this node has recorded its failure

    @classmethod
    def open(cls, job: RunJob, plan: PlanRecord, env: Any, t_start: float) -> "Node":
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
    def where(self) -> str:
        return f"node {self.rank} ({socket.gethostname()})"

    @property
    def ports(self) -> dict:
        return ports(self.env.job_id)

    # ---------------------------------------------------------------- records
    def record(self, event: str, **fields) -> None:
        rundir.record(self.job.run_dir, event, job_id=self.env.job_id, attempt=self.job.attempt, **fields)

    def record_attempt(self) -> None:
        """Node 0: one line in slurm_attempts.jsonl and the `started` event."""
        writer.append_line(Path(self.job.run_dir) / "slurm_attempts.jsonl", json.dumps(
            {"job_id": self.env.job_id, "attempt": self.job.attempt, "hosts": self.env.hostnames, "time": time.time()}),
            root=self.job.run_dir)
        self.record("started", hosts=self.env.hostnames, nodes=self.env.num_nodes)

    # ---------------------------------------------------------------- children
    def environ(self, extra: dict) -> dict:
        """The environment children start with: the run's (vrun.launch.environment, from the task's, with
        ROCR/HIP unset when SLURM set CUDA_VISIBLE_DEVICES on this node), this attempt's number, then `extra`."""
        e = child_environ(os.environ, self.plan.env, self.plan.env_unset, self.plan.run_id)
        e["VRUN_ATTEMPT"] = str(self.job.attempt)
        e.update(extra)
        return e

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
                _kill(proc)
                return False
            time.sleep(POLL_S)
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
            time.sleep(POLL_S)
        return (self.ctl / name).read_text().strip()

    def released(self) -> bool:
        return fs.exists(self.ctl / "released")

    def fail(self, error: str) -> None:
        """Tell the other nodes this one failed (`failed-<rank>` holds the line); node 0 also releases them."""
        self.publish(f"failed-{self.rank}", error if self.where in error else f"{self.where}: {error}")
        if self.rank == 0:
            self.release()

    def failure(self) -> Optional[str]:
        """Another node's error line, once one has failed."""
        for f in sorted(self.ctl.glob("failed-*")):
            if f.name != f"failed-{self.rank}":
                return f.read_text().strip()
        return None

    def wait_unless_failed(self, proc: subprocess.Popen) -> int:
        """proc's exit code; another node failing first stops the wait (the caller stops proc)."""
        while proc.poll() is None:
            other = self.failure()
            if other:
                raise RuntimeError(f"another node failed: {other}")
            time.sleep(POLL_S)
        return proc.returncode

    def release(self) -> None:
        self.publish("released", "1")

    def record_failure(self, line: str) -> str:
        """Record this node's failure at once (before its children are stopped), with the cause its log holds,
        and tell the other nodes. Returns the line."""
        cause = self.cause()
        if cause and cause not in line:
            line = f"{line.replace(' (see the job log)', '')}: {cause}"
        self.record("failed", node=self.rank, error=line)
        self.fail(line)
        self.failed = True
        return line

    def cause(self) -> Optional[str]:
        """The first decisive line this node's log holds so far (its children write there too)."""
        from vrun.rundir.cause import from_files

        sys.stdout.flush()
        sys.stderr.flush()
        try:
            paths = self.env.paths
            return from_files([paths.stderr, paths.stdout])
        except Exception:  # noqa: BLE001 - no cause is no worse than before
            return None


# ==================================================================== PPO (GRPO / DAPO) on Ray
@dataclass
class RayDaemon:
    """How this node runs `ray start`: the binary next to this Python, the flags head and workers share
    (resources, this node's address, the job's ports), and the environment Ray and the driver get."""
    bin: str
    flags: list
    extra: dict
    ip: str

    @classmethod
    def on(cls, node: Node) -> "RayDaemon":
        ray_cfg, pt = node.cluster.ray, node.ports
        cpus = int(ray_cfg.num_cpus or os.environ.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
        me = node_ip(ray_cfg.interface, None)
        extra = {"RAY_AUTH_MODE": ray_cfg.auth_mode, "RAY_USAGE_STATS_ENABLED": "0"}
        flags = ["--num-cpus", str(cpus), "--num-gpus", str(node.gpus), "--node-ip-address", me, "--block",
                 "--disable-usage-stats", "--node-manager-port", str(pt["node_manager"]),
                 "--object-manager-port", str(pt["object_manager"]), "--metrics-export-port", str(pt["metrics"]),
                 "--dashboard-agent-grpc-port", str(pt["agent_grpc"]),
                 "--dashboard-agent-listen-port", str(pt["agent_listen"]),
                 "--runtime-env-agent-port", str(pt["runtime_env_agent"]),
                 "--min-worker-port", str(pt["min_worker"]), "--max-worker-port", str(pt["max_worker"])]
        return cls(str(Path(sys.executable).parent / "ray"), flags, extra, me)

    def start(self, node: Node, *role: str) -> subprocess.Popen:
        return subprocess.Popen([self.bin, "start", *role, *self.flags], env=node.environ(self.extra),
                                start_new_session=True)


def ray_head(node: Node) -> Any:
    """Node 0: start the Ray head, wait for every node, run the driver against the cluster; release the workers
    and stop the head on every way out."""
    ray = RayDaemon.on(node)
    setup = node.start_setup(ray.extra)
    proc = None
    try:
        node.wait_setup(setup)
        pt = node.ports
        address = f"{ray.ip}:{pt['gcs']}"
        proc = ray.start(node, "--head", "--port", str(pt["gcs"]), "--ray-client-server-port", str(pt["client"]),
                         "--include-dashboard=false")
        t0 = time.monotonic()
        node.publish("head", address)
        wait_for_nodes(node, address, proc, ray.extra, t0)
        bringup = {"nodes": node.env.num_nodes, "task_start_to_all_alive_s": round(time.monotonic() - node.t_start, 2),
                   "head_start_to_all_alive_s": round(time.monotonic() - t0, 2)}
        node.publish("bringup.json", json.dumps(bringup))
        node.record("ray_up", nodes=node.env.num_nodes, seconds=bringup["task_start_to_all_alive_s"])
        return run_driver(node, node.environ({**ray.extra, "RAY_ADDRESS": address}),
                          bringup["task_start_to_all_alive_s"])
    finally:
        node.release()
        _kill(proc)
        _kill(setup)


def run_driver(node: Node, driver_env: dict, alive_s: float) -> Any:
    """The plan's driver argv (preflight swaps in its task runner), in the run dir; a non-zero exit fails the job."""
    job, mode = node.job, node.plan.mode
    argv = list(node.plan.argv)
    if mode == "preflight" and "--task-runner" not in argv:
        argv += ["--task-runner", "vrun.launch.preflight_nodes.PreflightTaskRunner"]
    print(f"vrun: {node.env.num_nodes} node(s) alive {alive_s} s after the task started; driver: {' '.join(argv)}",
          flush=True)
    node.record("entrypoint_started", node=0)
    proc = subprocess.Popen(argv, env=driver_env, cwd=job.run_dir)
    try:
        rc = node.wait_unless_failed(proc)
    finally:
        _stop(proc)
    node.record("exited", node=0, rc=rc)
    if rc:
        raise RuntimeError(node.record_failure(f"the driver {exited(rc)} (see the job log)"))
    return {"mode": mode, "run_dir": job.run_dir, "job_id": node.env.job_id}


def wait_for_nodes(node: Node, address: str, proc: subprocess.Popen, extra: dict, t0: float) -> None:
    """Poll Ray's node table (one connection, POLL_S apart) until exactly nnodes nodes with the expected
    GPUs are alive; past cluster.ray.join_timeout_s fail, naming the nodes that never joined."""
    env, job = node.env, node.job
    want = env.num_nodes
    gpus = float(node.gpus)
    timeout = float(node.cluster.ray.join_timeout_s)
    left = max(timeout - (time.monotonic() - t0), 1.0)
    poller = subprocess.Popen([sys.executable, "-m", "vrun.launch.slurm.node", "wait-nodes", address, str(want), str(gpus),
                               str(left), job.run_dir, f"{env.job_id}:{job.attempt}"],
                              env=node.environ(extra), stdout=subprocess.PIPE, text=True)
    try:
        while poller.poll() is None:
            if proc.poll() is not None:
                raise RuntimeError(f"the Ray head on {socket.gethostname()} {exited(proc.returncode)}")
            other = node.failure()
            if other:
                raise RuntimeError(f"a node failed before the Ray cluster was up: {other}")
            time.sleep(0.1)
    finally:
        _stop(poller)
    lines = (poller.stdout.read() or "").strip().splitlines()
    seen = json.loads(lines[-1]) if lines else []
    if poller.returncode == 0:
        return
    hosts = {n.get("host") for n in seen} | {n["ip"] for n in seen}
    missing = [h for h in env.hostnames if h not in hosts and _resolve(h) not in hosts]
    raise RuntimeError(f"cluster.ray.join_timeout_s={timeout:g}: {len(seen)} of {want} node(s) joined the Ray "
                       f"head; missing: {', '.join(missing) or '?'}")


def ray_worker(node: Node) -> Any:
    """Every other node: wait for the head's address, join it, stay until released; stop Ray on every way out."""
    ray = RayDaemon.on(node)
    setup = node.start_setup(ray.extra)
    proc = None
    try:
        if not node.wait_setup(setup):
            return {"released": True}
        address = node.wait_for("head")
        if address is None:
            return {"released": True}
        proc = ray.start(node, "--address", address)
        while not node.released():
            if proc.poll() is not None:
                raise RuntimeError(f"ray on {node.where} {exited(proc.returncode)}")
            time.sleep(POLL_S)
        return {"released": True}
    finally:
        _kill(proc)


# ==================================================================== SFT: torchrun on every node
def torchrun_node(node: Node) -> Any:
    """Every node: agree on the master address, run torchrun with this node's rank; node 0 releases when done."""
    if not node.wait_setup(node.start_setup({})):
        return {"released": True}
    master = master_address(node)
    if master is None:
        return {"released": True}
    t = node.plan.torchrun
    argv = entrypoints.torchrun_argv(t.python, t.module, node.job.run_dir, nnodes=node.env.num_nodes,
                                     nproc_per_node=t.nproc_per_node, node_rank=node.rank,
                                     master_addr=master, master_port=node.ports["torch"])
    print(f"vrun: node {node.rank}: {' '.join(argv)}", flush=True)
    proc = subprocess.Popen(argv, env=node.environ({}), cwd=node.job.run_dir, start_new_session=True)
    if node.rank == 0:
        node.record("entrypoint_started", node=0)
    try:
        rc = node.wait_unless_failed(proc)
        node.record("exited", node=node.rank, rc=rc)
        if rc:
            node.record_failure(f"torchrun on {node.where} {exited(rc)}")
    finally:
        _kill(proc)
        if node.rank == 0:
            node.release()
    if rc:
        raise RuntimeError(f"torchrun on {node.where} {exited(rc)}")
    return {"node": node.rank, "rc": rc}


def master_address(node: Node) -> Optional[str]:
    """Node 0 publishes its own address; the others wait for it (None when the job is released first)."""
    if node.rank != 0:
        return node.wait_for("master")
    master = node_ip(node.cluster.ray.interface, None)
    node.publish("master", master)
    return master


# ==================================================================== on the node, before anything starts
def cluster_of(values: dict) -> Cluster:
    """The cluster group as the schema's object from the plain values plan.json records (asdict of it)."""
    known = {f.name for f in fields(Cluster)}
    ray = values.get("ray") or {}
    return Cluster(**{k: v for k, v in values.items() if k in known and k != "ray"},
                   ray=RayCfg(**{k: v for k, v in ray.items() if k in {f.name for f in fields(RayCfg)}}))


def check_stack(recorded: dict, where: str) -> None:
    """Before Ray or torchrun start on a node: its verl and verl_mlite must be those the plan was composed against
    (a login node's venv and the cluster image differing is the ordinary case)."""
    wrong = stack.mismatch(recorded)
    if wrong:
        raise RuntimeError(f"{where}: " + " | ".join(p.line() for p in wrong))


def check_node(checks: Optional[dict], where: str) -> None:
    """cluster.login_preflight=false: the checks the submitting machine skipped, first thing on every node."""
    if not checks:
        return
    from vrun.launch.slurm.checks import node_problems

    found = node_problems(checks)
    if found:
        raise RuntimeError(f"{where}: preflight found {len(found)} problem(s): " + " | ".join(found))


# ==================================================================== python -m vrun.launch.slurm.node wait-nodes
def wait_nodes(address: str, want: int, gpus: float, timeout: float, run_dir: Optional[str] = None,
               job: str = "") -> int:
    """Connect once and poll until `want` alive nodes each offer `gpus` GPUs; prints the last node table and
    records each new count in the run dir."""
    import ray

    t0 = time.monotonic()
    while True:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            break
        except Exception:  # noqa: BLE001 - the GCS may not be up yet
            if time.monotonic() - t0 > timeout:
                print("[]")
                return 1
            time.sleep(0.2)
    seen: list = []
    joined = -1
    job_id, _, attempt = job.partition(":")
    while time.monotonic() - t0 <= timeout:
        seen = [{"ip": n["NodeManagerAddress"], "host": n.get("NodeManagerHostname"),
                 "gpus": n["Resources"].get("GPU", 0)} for n in ray.nodes() if n["Alive"]]
        ready = [n for n in seen if n["gpus"] >= gpus]
        if run_dir and len(ready) != joined:
            joined = len(ready)
            rundir.record(run_dir, "nodes_joined", job_id=job_id, attempt=int(attempt or 0), joined=joined, of=want,
                          hosts=[n["host"] or n["ip"] for n in ready])
        if len(ready) == want:
            print(json.dumps(seen))
            return 0
        time.sleep(0.2)
    print(json.dumps(seen))
    return 1


def exited(rc: int) -> str:
    """How a child ended: `exited 1`, or the signal that stopped it and what usually sends it."""
    if rc < 0:
        return f"was stopped by signal {-rc} (the job was cancelled, preempted or out of time)"
    return f"exited {rc}"


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _stop(proc: subprocess.Popen) -> None:
    """Stop a child that shares this task's process group (the driver: SLURM's signals reach it too)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _kill(proc: Optional[subprocess.Popen]) -> None:
    """Stop a child and everything it started (its own process group): nothing outlives the job."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (subprocess.TimeoutExpired, ProcessLookupError, PermissionError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vrun.launch.slurm.node")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait-nodes", help="(inside a job) wait for the Ray cluster to have every node")
    w.add_argument("address")
    w.add_argument("want", type=int)
    w.add_argument("gpus", type=float)
    w.add_argument("timeout", type=float)
    w.add_argument("run_dir", nargs="?")
    w.add_argument("job", nargs="?", default="")
    a = ap.parse_args()
    sys.exit(wait_nodes(a.address, a.want, a.gpus, a.timeout, a.run_dir, a.job))

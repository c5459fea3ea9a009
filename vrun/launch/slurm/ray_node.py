"""SLURM, PPO (GRPO / DAPO) on Ray: node 0 starts the Ray head, waits until every node joined, runs the plan's driver
(vrun.launch.entry → verl's run_ppo) against that cluster with the watchdog on its output, then releases the workers;
every other node joins the head and stays until released. Ray daemons (`ray start --block`) are children of the
task in their own process groups, stopped on every exit path. vrun.launch.slurm.node holds the node itself.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from vrun.core.text import summarised
from vrun.launch.slurm import nodegate
from vrun.launch.slurm.node import Node, start_watchdog
from vrun.launch.slurm.procs import exited, free_port, kill, node_ip, stop
from vrun.rundir import records as rundir


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
        if not nodegate.gate(node):  # what the plan needs of every node, before Ray starts
            return {"released": True}
        pt = node.ports
        address = f"{ray.ip}:{pt['gcs']}"
        # the state API the watchdog asks which phase each worker is in: the job's port, else a free one
        node.dashboard_port = free_port(ray.ip, pt["dashboard"])
        proc = ray.start(node, "--head", "--port", str(pt["gcs"]), "--ray-client-server-port", str(pt["client"]),
                         "--include-dashboard=true", "--dashboard-host", ray.ip, "--dashboard-port",
                         str(node.dashboard_port))
        t0 = time.monotonic()
        node.publish("head", address)
        wait_for_nodes(node, address, proc, ray.extra, t0)
        bringup = {"nodes": node.env.num_nodes, "task_start_to_all_alive_s": round(time.monotonic() - node.t_start, 2),
                   "head_start_to_all_alive_s": round(time.monotonic() - t0, 2)}
        node.publish("bringup.json", json.dumps(bringup))
        node.record("ray_up", nodes=node.env.num_nodes, seconds=bringup["task_start_to_all_alive_s"])
        return run_driver(node, node.environ({**ray.extra, "RAY_ADDRESS": address}),
                          bringup["task_start_to_all_alive_s"], address)
    finally:
        node.release()
        kill(proc)
        kill(setup)


def run_driver(node: Node, driver_env: dict, alive_s: float, address: Optional[str] = None) -> Any:
    """The plan's driver argv (preflight swaps in its task runner), in the run dir, watched; a non-zero exit fails
    the job."""
    job, mode = node.job, node.plan.mode
    argv = list(node.plan.argv)
    if mode == "preflight" and "--task-runner" not in argv:
        argv += ["--task-runner", "vrun.launch.preflight_nodes.PreflightTaskRunner"]
    print(f"vrun: {node.env.num_nodes} node(s) alive {alive_s} s after the task started; driver: {' '.join(argv)}",
          flush=True)
    node.record("entrypoint_started", node=0)
    proc = subprocess.Popen(argv, env=driver_env, cwd=job.run_dir)
    dog = start_watchdog(node, address)
    try:
        rc = node.wait_unless_failed(proc)
    finally:
        if dog is not None:
            dog.stop()
        stop(proc)
    node.record("exited", node=0, rc=rc)
    if mode == "train":
        from vrun.planning import measured

        measured.learn_at_end(job.run_dir)  # the run's measured step time, learned where the run ends
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
    poller = subprocess.Popen([sys.executable, "-m", "vrun.launch.slurm.ray_node", "wait-nodes", address, str(want),
                               str(gpus), str(left), job.run_dir, f"{env.job_id}:{job.attempt}:{node.restart}"],
                              env=node.environ(extra), stdout=subprocess.PIPE, text=True)
    try:
        while poller.poll() is None:
            if proc.poll() is not None:
                raise RuntimeError(f"the Ray head on {socket.gethostname()} {exited(proc.returncode)}")
            other = node.failure()
            if other:
                raise RuntimeError(f"a node failed before the Ray cluster was up: {other}")
            node.pause(0.1)
    finally:
        stop(poller)
    lines = (poller.stdout.read() or "").strip().splitlines()
    seen = json.loads(lines[-1]) if lines else []
    if poller.returncode == 0:
        return
    hosts = {n.get("host") for n in seen} | {n["ip"] for n in seen}
    missing = [h for h in env.hostnames if h not in hosts and _resolve(h) not in hosts]
    raise RuntimeError(f"cluster.ray.join_timeout_s={timeout:g}: {len(seen)} of {want} node(s) joined the Ray "
                       f"head; missing: {summarised(missing) or '?'}")


def ray_worker(node: Node) -> Any:
    """Every other node: wait for the head's address, join it, stay until released; stop Ray on every way out."""
    ray = RayDaemon.on(node)
    setup = node.start_setup(ray.extra)
    proc = None
    try:
        if not node.wait_setup(setup) or not nodegate.gate(node):
            return {"released": True}
        address = node.wait_for("head")
        if address is None:
            return {"released": True}
        proc = ray.start(node, "--address", address)
        while not node.released():
            if proc.poll() is not None:
                raise RuntimeError(f"ray on {node.where} {exited(proc.returncode)}")
            node.pause()
        return {"released": True}
    finally:
        kill(proc)


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


# ==================================================================== python -m vrun.launch.slurm.ray_node wait-nodes
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
    job_id, _, rest = job.partition(":")
    attempt, _, restart = rest.partition(":")
    while time.monotonic() - t0 <= timeout:
        seen = [{"ip": n["NodeManagerAddress"], "host": n.get("NodeManagerHostname"),
                 "gpus": n["Resources"].get("GPU", 0)} for n in ray.nodes() if n["Alive"]]
        ready = [n for n in seen if n["gpus"] >= gpus]
        if run_dir and len(ready) != joined:
            joined = len(ready)
            rundir.record(run_dir, "nodes_joined", job_id=job_id or None, attempt=int(attempt or 0),
                          restart=int(restart or 0), joined=joined, of=want, hosts=[n["host"] or n["ip"] for n in ready])
        if len(ready) == want:
            print(json.dumps(seen))
            return 0
        time.sleep(0.2)
    print(json.dumps(seen))
    return 1


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vrun.launch.slurm.ray_node")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait-nodes", help="(inside a job) wait for the Ray cluster to have every node")
    w.add_argument("address")
    w.add_argument("want", type=int)
    w.add_argument("gpus", type=float)
    w.add_argument("timeout", type=float)
    w.add_argument("run_dir", nargs="?")
    w.add_argument("job", nargs="?", default="")
    a = ap.parse_args()
    return wait_nodes(a.address, a.want, a.gpus, a.timeout, a.run_dir, a.job)


if __name__ == "__main__":
    sys.exit(main())

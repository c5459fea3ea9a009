"""SLURM: the job on every node of the allocation (vrun.slurm submits it from the login node).

Every node runs RunJob (tasks_per_node=1); roles come from submitit's JobEnvironment. The entrypoint's record
says what runs: PPO (GRPO/DAPO) on Ray — node 0 starts the Ray head, the others join it; the head polls until
exactly nnodes nodes with the expected GPUs are alive, runs the plan's driver (vrun.entry → verl's run_ppo)
against that cluster, then releases the workers; Ray daemons are children of the task (`ray start --block`)
and are stopped on every exit path. SFT: every node runs torchrun with its node rank and the head's address.
Coordination goes through files in the run dir, which every node shares: no fixed sleeps.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from vrun import entrypoints, stack
from vrun.plan import UNSET_WITH_CUDA
from vrun.schema import EntrypointName

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


@dataclass
class RunJob:
    """The callable submitit runs on every node of the allocation; requeues itself on timeout/preemption."""
    run_dir: str
    plan: dict
    cluster: dict
    mode: str
    attempt: int = 0

    # ---------------------------------------------------------------- submitit hooks
    def __call__(self) -> Any:
        import submitit

        self._t_start = time.monotonic()
        env = submitit.JobEnvironment()
        ctl = Path(self.run_dir) / ".vrun" / f"job-{env.job_id}-{self.attempt}"
        ctl.mkdir(parents=True, exist_ok=True)
        if env.global_rank == 0:
            self._record(env)
        check_stack(self.plan, f"node {env.node} ({socket.gethostname()})")
        if entrypoints.ENTRYPOINTS[EntrypointName(self.plan["algo_entrypoint"])].uses_ray:
            return self._ray(env, ctl)
        return self._torchrun(env, ctl)

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Requeue (time limit or preemption) with the same run dir; verl resumes (trainer.resume_mode=auto)."""
        import submitit

        return submitit.helpers.DelayedSubmission(RunJob(self.run_dir, self.plan, self.cluster, self.mode,
                                                         self.attempt + 1))

    # ---------------------------------------------------------------- helpers
    def _record(self, env) -> None:
        p = Path(self.run_dir) / "slurm_attempts.jsonl"
        with p.open("a") as f:
            f.write(json.dumps({"job_id": env.job_id, "attempt": self.attempt, "hosts": env.hostnames,
                                "time": time.time()}) + "\n")

    def _environ(self, extra: dict) -> dict:
        e = dict(os.environ)
        # decided on the node: SLURM sets CUDA_VISIBLE_DEVICES (and ROCR_VISIBLE_DEVICES) per allocation
        unset = set(self.plan["env_unset"]) | (set(UNSET_WITH_CUDA) if e.get("CUDA_VISIBLE_DEVICES") else set())
        for name in unset:
            e.pop(name, None)
        e.update(self.plan["env"])
        e["VRUN_ATTEMPT"] = str(self.attempt)
        e.update(extra)
        return e

    def _node_setup(self, ctl: Path, env: dict) -> Optional[subprocess.Popen]:
        lines = self.cluster.get("node_setup") or []
        if not lines:
            return None
        return subprocess.Popen(["bash", "-ec", "\n".join(lines)], env=env, start_new_session=True)

    def _wait_setup(self, proc, ctl: Path, node: int) -> bool:
        """Wait for the node's setup lines; False when the job is released first (the head gave up)."""
        if proc is None:
            return True
        while proc.poll() is None:
            if (ctl / "released").exists():
                _kill(proc)
                return False
            time.sleep(POLL_S)
        if proc.returncode:
            raise RuntimeError(f"cluster.node_setup failed on node {node} ({socket.gethostname()}) "
                               f"with exit code {proc.returncode}")
        return True

    # ---------------------------------------------------------------- GRPO / DAPO
    def _ray(self, env, ctl: Path) -> Any:
        ray_cfg = self.cluster["ray"]
        pt = ports(env.job_id)
        gpus = int(ray_cfg.get("num_gpus") or self.plan["mesh"]["gpus_per_node"])
        cpus = int(ray_cfg.get("num_cpus") or os.environ.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
        me = node_ip(ray_cfg.get("interface"), None)
        extra = {"RAY_AUTH_MODE": ray_cfg.get("auth_mode") or "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        common = ["--num-cpus", str(cpus), "--num-gpus", str(gpus), "--node-ip-address", me, "--block",
                  "--disable-usage-stats", "--node-manager-port", str(pt["node_manager"]),
                  "--object-manager-port", str(pt["object_manager"]), "--metrics-export-port", str(pt["metrics"]),
                  "--dashboard-agent-grpc-port", str(pt["agent_grpc"]),
                  "--dashboard-agent-listen-port", str(pt["agent_listen"]),
                  "--runtime-env-agent-port", str(pt["runtime_env_agent"]),
                  "--min-worker-port", str(pt["min_worker"]), "--max-worker-port", str(pt["max_worker"])]
        ray_bin = str(Path(sys.executable).parent / "ray")
        setup = self._node_setup(ctl, self._environ(extra))
        if env.node == 0:
            return self._head(env, ctl, pt, common, ray_bin, extra, me, setup)
        return self._worker(env, ctl, pt, common, ray_bin, extra, setup)

    def _head(self, env, ctl, pt, common, ray_bin, extra, me, setup) -> Any:
        proc = None
        try:
            self._wait_setup(setup, ctl, 0)
            address = f"{me}:{pt['gcs']}"
            proc = subprocess.Popen([ray_bin, "start", "--head", "--port", str(pt["gcs"]),
                                     "--ray-client-server-port", str(pt["client"]), "--include-dashboard=false",
                                     *common], env=self._environ(extra), start_new_session=True)
            t0 = time.monotonic()
            (ctl / "head").write_text(address)
            self._wait_for_nodes(env, address, proc, extra, t0)
            bringup = {"nodes": env.num_nodes, "task_start_to_all_alive_s": round(time.monotonic() - self._t_start, 2),
                       "head_start_to_all_alive_s": round(time.monotonic() - t0, 2)}
            (ctl / "bringup.json").write_text(json.dumps(bringup))
            driver_env = self._environ({**extra, "RAY_ADDRESS": address})
            argv = list(self.plan["argv"])
            if self.mode == "preflight" and "--task-runner" not in argv:
                argv += ["--task-runner", "vrun.preflight_nodes.PreflightTaskRunner"]
            print(f"vrun: {env.num_nodes} node(s) alive {bringup['task_start_to_all_alive_s']} s after the task started; "
                  f"driver: "
                  f"{' '.join(argv)}", flush=True)
            rc = subprocess.run(argv, env=driver_env, cwd=self.run_dir).returncode
            if rc:
                raise RuntimeError(f"the driver exited {rc} (see the job log)")
            return {"mode": self.mode, "run_dir": self.run_dir, "job_id": env.job_id}
        finally:
            (ctl / "released").write_text("1")
            _kill(proc)

    def _wait_for_nodes(self, env, address, proc, extra, t0) -> None:
        """Poll Ray's node table (one connection, POLL_S apart) until exactly nnodes nodes with the expected
        GPUs are alive; past cluster.ray.join_timeout_s fail, naming the nodes that never joined."""
        want = env.num_nodes
        gpus = float(self.cluster["ray"].get("num_gpus") or self.plan["mesh"]["gpus_per_node"])
        timeout = float(self.cluster["ray"].get("join_timeout_s") or 300)
        left = max(timeout - (time.monotonic() - t0), 1.0)
        poller = subprocess.Popen([sys.executable, "-m", "vrun.slurm_node", "wait-nodes", address, str(want), str(gpus),
                                   str(left)], env=self._environ(extra), stdout=subprocess.PIPE, text=True)
        while poller.poll() is None:
            if proc.poll() is not None:
                _kill(poller)
                raise RuntimeError(f"the Ray head on {socket.gethostname()} exited {proc.returncode}")
            time.sleep(0.1)
        lines = (poller.stdout.read() or "").strip().splitlines()
        seen = json.loads(lines[-1]) if lines else []
        if poller.returncode == 0:
            return
        hosts = {n.get("host") for n in seen} | {n["ip"] for n in seen}
        missing = [h for h in env.hostnames if h not in hosts and _resolve(h) not in hosts]
        raise RuntimeError(f"cluster.ray.join_timeout_s={timeout:g}: {len(seen)} of {want} node(s) joined the Ray "
                           f"head; missing: {', '.join(missing) or '?'}")

    def _worker(self, env, ctl, pt, common, ray_bin, extra, setup) -> Any:
        proc = None
        try:
            if not self._wait_setup(setup, ctl, env.node):
                return {"released": True}
            while not (ctl / "head").exists():
                if (ctl / "released").exists():
                    return {"released": True}
                time.sleep(POLL_S)
            address = (ctl / "head").read_text().strip()
            proc = subprocess.Popen([ray_bin, "start", "--address", address, *common], env=self._environ(extra),
                                    start_new_session=True)
            while not (ctl / "released").exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"ray on node {env.node} ({socket.gethostname()}) exited {proc.returncode}")
                time.sleep(POLL_S)
            return {"released": True}
        finally:
            _kill(proc)

    # ---------------------------------------------------------------- SFT
    def _torchrun(self, env, ctl: Path) -> Any:
        pt = ports(env.job_id)
        setup = self._node_setup(ctl, self._environ({}))
        if not self._wait_setup(setup, ctl, env.node):
            return {"released": True}
        master = node_ip(self.cluster["ray"].get("interface"), None) if env.node == 0 else None
        if env.node == 0:
            (ctl / "master").write_text(master)
        while master is None:
            if (ctl / "master").exists():
                master = (ctl / "master").read_text().strip()
            elif (ctl / "released").exists():
                return {"released": True}
            else:
                time.sleep(POLL_S)
        t = self.plan["torchrun"]
        argv = entrypoints.torchrun_argv(t["python"], t["module"], self.run_dir, nnodes=env.num_nodes,
                                         nproc_per_node=t["nproc_per_node"], node_rank=env.node,
                                         master_addr=master, master_port=pt["torch"])
        print(f"vrun: node {env.node}: {' '.join(argv)}", flush=True)
        proc = subprocess.Popen(argv, env=self._environ({}), cwd=self.run_dir, start_new_session=True)
        try:
            rc = proc.wait()
        finally:
            _kill(proc)
            if env.node == 0:
                (ctl / "released").write_text("1")
        if rc:
            raise RuntimeError(f"torchrun on node {env.node} ({socket.gethostname()}) exited {rc}")
        return {"node": env.node, "rc": rc}


def check_stack(payload: dict, where: str) -> None:
    """Before Ray or torchrun start on a node: its verl and verl_mlite must be those the plan was composed against
    (a login node's venv and the cluster image differing is the ordinary case)."""
    wrong = stack.mismatch(payload.get("stack"))
    if wrong:
        raise RuntimeError(f"{where}: " + " | ".join(p.line() for p in wrong))


def wait_nodes(address: str, want: int, gpus: float, timeout: float) -> int:
    """Connect once and poll until `want` alive nodes each offer `gpus` GPUs; prints the last node table."""
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
    while time.monotonic() - t0 <= timeout:
        seen = [{"ip": n["NodeManagerAddress"], "host": n.get("NodeManagerHostname"),
                 "gpus": n["Resources"].get("GPU", 0)} for n in ray.nodes() if n["Alive"]]
        if len([n for n in seen if n["gpus"] >= gpus]) == want:
            print(json.dumps(seen))
            return 0
        time.sleep(0.2)
    print(json.dumps(seen))
    return 1


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


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

    ap = argparse.ArgumentParser(prog="python -m vrun.slurm_node")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait-nodes", help="(inside a job) wait for the Ray cluster to have every node")
    w.add_argument("address")
    w.add_argument("want", type=int)
    w.add_argument("gpus", type=float)
    w.add_argument("timeout", type=float)
    a = ap.parse_args()
    sys.exit(wait_nodes(a.address, a.want, a.gpus, a.timeout))

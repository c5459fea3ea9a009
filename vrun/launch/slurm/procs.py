"""What a SLURM node's own processes need: the ports of a job (a block per job id: jobs sharing a node do not collide),
this node's address, and its children's lifecycle (how one ended, stopping one, killing one with everything it
started). vrun.launch.slurm.node, ray_node and torchrun_node use them."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
from typing import Optional


def ports(job_id: str) -> dict:
    """A block of 1000 ports per job, from the job id: two jobs sharing a node do not collide (40 blocks)."""
    digits = "".join(ch for ch in str(job_id) if ch.isdigit()) or "0"
    base = 20000 + (int(digits) % 40) * 1000
    return {"gcs": base, "node_manager": base + 1, "object_manager": base + 2, "client": base + 3,
            "metrics": base + 4, "agent_grpc": base + 5, "agent_listen": base + 6, "dashboard": base + 7,
            "runtime_env_agent": base + 8, "torch": base + 9, "min_worker": base + 100, "max_worker": base + 999}


def free_port(host: str, wanted: int) -> int:
    """`wanted` when nothing listens on it here, else a port the kernel gives (a process a killed job left behind may
    still hold the job's block: no cgroups on every cluster)."""
    import socket

    for port in (wanted, 0):
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
                s.bind((host, port))
                return s.getsockname()[1]
        except OSError:
            continue
    return wanted


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


# ==================================================================== children
def exited(rc: int) -> str:
    """How a child ended: `exited 1`, or the signal that stopped it and what usually sends it."""
    if rc < 0:
        return f"was stopped by signal {-rc} (the job was cancelled, preempted or out of time)"
    return f"exited {rc}"


def stop(proc: subprocess.Popen) -> None:
    """Stop a child that shares this task's process group (the driver: SLURM's signals reach it too)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def kill(proc: Optional[subprocess.Popen]) -> None:
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

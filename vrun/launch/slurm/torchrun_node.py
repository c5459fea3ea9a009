"""SLURM, SFT: every node runs torchrun with its node rank against node 0's address (the torch port from the job id);
node 0 watches the training (its rank 0 prints verl's step lines into this node's log) and releases the others when
its torchrun is done. vrun.launch.slurm.node holds the node itself."""
from __future__ import annotations

import subprocess
from typing import Any, Optional

from vrun import entrypoints
from vrun.launch.slurm import nodegate
from vrun.launch.slurm.node import Node, start_watchdog
from vrun.launch.slurm.procs import exited, kill, node_ip


def torchrun_node(node: Node) -> Any:
    """Every node: agree on the master address, run torchrun with this node's rank; node 0 releases when done."""
    if not node.wait_setup(node.start_setup({})) or not nodegate.gate(node):
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
    dog = None
    if node.rank == 0:
        node.record("entrypoint_started", node=0)
        dog = start_watchdog(node)
    try:
        rc = node.wait_unless_failed(proc)
        node.record("exited", node=node.rank, rc=rc)
        if rc:
            node.record_failure(f"torchrun on {node.where} {exited(rc)}")
    finally:
        if dog is not None:
            dog.stop()
        kill(proc)
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

"""SLURM: the node check as a gate before Ray (or torchrun) starts on an attempt (vrun.launch.nodecheck holds the
checks and verdicts).

Every node, after cluster.node_setup: its own checks and the tokens it sees, published as `nodecheck-<rank>.json`
in the attempt's control dir. Node 0 waits for every node's report (cluster.ray.join_timeout_s at most), judges,
and either publishes `nodecheck-ok` (the nodes go on) or, where some nodes failed:
- records `node_check` (the lines, the nodes) in the run dir and prints the verdict's line;
- submits the run again without those nodes (sbatch --exclude, as a stall's requeue does) and cancels this job,
  unless the run has been submitted again after a node check cluster.max_requeues times in a row without an attempt
  getting past it, or every node failed (the plan or the storage, not a node): then the job fails with that line.
No Ray is started on an attempt that fails its check: no training time is spent on it. A node that has not reported
within the bound is not judged (Ray's join timeout names it); reaching its check later, it fails the job with its own
failures, if any.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from vrun.core import fs
from vrun.launch import nodecheck
from vrun.launch.nodecheck import Need, Verdict

REPORT = "nodecheck-{rank}.json"
OK = "nodecheck-ok"


def need(node) -> Need:
    """What the plan needs of each of its nodes: its GPUs, the run dir and the checkpoint dir verl writes."""
    run_dir = node.job.run_dir
    return nodecheck.need_of(node.gpus, str(node.cluster.gpu), run_dir, str(Path(run_dir) / "checkpoints"))


def requeues_in_a_row(events: list) -> int:
    """How many times in a row the run was submitted again after a node check without an attempt getting past its
    check since (an attempt whose Ray came up, or whose entrypoint started, ends the row)."""
    n = 0
    for e in events:
        ev = e.get("event")
        if ev == "node_check" and e.get("action") == "requeued":
            n += 1
        elif ev in ("ray_up", "entrypoint_started"):
            n = 0
    return n


def gate(node) -> bool:
    """Run this node's check; True: go on to Ray; False: the job was released (a node failed its check, or the
    head gave up). Node 0 raises with the verdict's line where the job cannot go on."""
    bound = float(node.cluster.ray.join_timeout_s)  # the whole check's, as for nodes joining Ray
    end = time.monotonic() + bound
    want = dataclasses.replace(need(node), wait_s=min(nodecheck.TOKEN_WAIT_S, bound))
    hosts = list(node.env.hostnames)  # SLURM's names: the tokens', the verdict's and --exclude's
    host = hosts[node.rank] if node.rank < len(hosts) else socket.gethostname()
    settled = lambda: frozenset(h for r, h in enumerate(hosts) if fs.exists(node.ctl / REPORT.format(rank=r)))  # noqa: E731
    mine = nodecheck.report(host, want, node.environ({}), node.ctl.name, hosts, pause=node.pause, settled=settled)
    node.publish(REPORT.format(rank=node.rank), json.dumps(mine))
    if node.rank != 0:
        while not fs.exists(node.ctl / OK):
            if node.released():
                return False
            node.pause()
        judged = json.loads(fs.read_checked(node.ctl / OK, 1 << 16, own=True)[0] or "[]")
        if host not in judged:  # too late for node 0's verdict (Ray's join timeout names it): its own checks decide
            nodecheck.clean(want.dirs, node.ctl.name)
            if mine["failures"]:
                raise RuntimeError(nodecheck.Verdict([nodecheck.Failure(**f) for f in mine["failures"]]).line())
        return True
    reports = collect(node, hosts, end)
    # a node that did not reach its check within the bound is not judged here: Ray's join timeout names it
    verdict = nodecheck.judge([h for h in hosts if h in reports], reports, want)
    nodecheck.clean(want.dirs, node.ctl.name)
    if verdict.ok:
        node.publish(OK, json.dumps(sorted(reports)))
        return True
    act(node, verdict)
    return False


def collect(node, hosts: list, end: float) -> dict:
    """Node 0: every node's report, by host, waiting until `end` (time.monotonic()) for them."""
    out: dict = {}
    while True:
        for rank in range(len(hosts)):
            p = node.ctl / REPORT.format(rank=rank)
            if hosts[rank] not in out and fs.exists(p):
                text = fs.read_checked(p, 1 << 20, own=True)[0]
                try:
                    out[hosts[rank]] = json.loads(text or "")
                except ValueError:
                    continue
        if len(out) == len(hosts) or time.monotonic() >= end:
            return out
        other = node.failure()
        if other:
            raise RuntimeError(f"another node failed before its node check: {other}")
        node.pause()


def act(node, verdict: Verdict) -> None:
    """Node 0, some nodes failed: submit the run again without them, or fail the job saying why not."""
    line = verdict.line()
    print(f"vrun: {line}", flush=True)
    fields = {"lines": [f.line() for f in verdict.failures][:20], "nodes": verdict.bad}
    limit = node.cluster.max_requeues
    again = requeues_in_a_row(node_events(node))
    why = ("every node failed: the plan or the storage, not a node" if verdict.everyone else
           f"mode={node.plan.mode} reports the nodes, it does not submit again" if node.plan.mode != "train" else
           f"no requeue left ({again} in a row after node checks, cluster.max_requeues={limit})"
           if again >= limit else "")
    if not why:
        p = submit_again(node, verdict.bad)
        if p.returncode == 0:
            node.record("node_check", action="requeued", exclude=verdict.bad, **fields)
            node.release()
            subprocess.run(["scancel", str(node.env.job_id)], capture_output=True, timeout=60)
            return
        why = "submitting again failed: " + ((p.stderr or "").strip().splitlines() or ["?"])[-1][:300]
    node.record("node_check", action="failed", why=why, **fields)
    raise RuntimeError(f"{line}; not submitted again: {why}")


def submit_again(node, hosts: list) -> subprocess.CompletedProcess:
    """The run submitted again without `hosts` (sbatch --exclude; none: the same nodes may be taken), replacing this
    job: a node check's or a stall's requeue (vrun.launch.slurm.node_stall.NodeStall.act). A job submitted from inside
    a job must not inherit this one's allocation (SLURM_JOB_*, SLURM_NNODES, ...)."""
    env = {k: v for k, v in os.environ.items() if k == "SLURM_CONF" or
           not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    argv = [sys.executable, "-m", "vrun.launch.slurm.submit", "resubmit", node.job.run_dir, "--detach",
            "--replacing", str(node.env.job_id)] + (["--exclude", ",".join(hosts)] if hosts else [])
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    print(p.stdout + p.stderr, flush=True)
    return p


def node_events(node) -> list:
    from vrun.rundir import records

    return records.events(node.job.run_dir)

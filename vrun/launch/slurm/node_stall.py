"""A stall's diagnosis and its action on a SLURM node, as the methods Node takes on (NodeStall): every node answers
a dump request (its processes' stacks, GPUs and NCCL flight recorder) while it waits; node 0 collects every node's
dump with Ray's view beside them, then cancels the job or submits the run again without the odd nodes
(cluster.max_requeues stalls in a row at one step: cancelled). The attributes these methods read (job, env, ctl,
cluster, served, record, publish, environ, release) are vrun.launch.slurm.node.Node's.
"""
from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

from vrun.core import fs, writer
from vrun.rundir import records as rundir


class NodeStall:
    """A node's part in a stall: answer dump requests, and on node 0 collect the dumps and act."""

    # ---------------------------------------------------------------- a stall's diagnosis
    def serve(self) -> None:
        """Answer a stall's dump request (`dump-<n>` in the control dir, naming the folder): this node's stacks,
        GPUs and NCCL flight recorder, in a thread so the node's own wait goes on."""
        try:
            requests = [p for p in self.ctl.iterdir() if p.name.startswith("dump-") and p.name not in self.served]
        except OSError:
            return
        for req in requests:
            self.served.add(req.name)
            out = Path(fs.read_small(req, 4096) or "")
            if not out.is_absolute():
                continue
            threading.Thread(target=self.dump, args=(out,), daemon=True).start()

    def dump(self, out: Path) -> None:
        from vrun.launch import stacks, watchdog

        try:
            watchdog.poke_nccl(self.job.run_dir)
            stacks.dump_node(out, os.getpid())
        except Exception as e:  # noqa: BLE001 - a dump that fails says so in its place
            writer.write_text(out / f"{socket.gethostname()}.failed", f"{type(e).__name__}: {e}\n",
                              root=self.job.run_dir)

    def collect(self, n: int, out: Path, ray_address: Optional[str] = None) -> None:
        """Node 0: every node's dump into `out` (the request published, this node's own taken), Ray's view beside
        them; returns when every node's `<host>.done` is there or DUMP_WAIT_S passed."""
        from vrun.launch import watchdog

        self.publish(f"dump-{n}", str(out))
        self.serve()
        if ray_address:
            watchdog.ray_view(out, ray_address, self.environ({}))
        deadline = time.monotonic() + watchdog.DUMP_WAIT_S
        while time.monotonic() < deadline:
            try:
                done = [p for p in out.iterdir() if p.name.endswith((".done", ".failed"))]
            except OSError:
                done = []
            if len(done) >= self.env.num_nodes:
                break
            time.sleep(0.5)
        watchdog.collect_nccl(self.job.run_dir, out)

    def act(self, action: str, summary: str, hosts: list) -> None:
        """Node 0, a stall past its grace: cancel this job, or first submit the run again without the odd nodes —
        unless the run has already been submitted again cluster.max_requeues times in a row after stalls without
        getting past the step it stalled at (a hang that follows the run to new nodes is not the nodes')."""
        from vrun.launch import watchdog

        job_id = str(self.env.job_id)
        why = ""
        if action == "requeue":
            again = watchdog.stalls_in_a_row(rundir.events(self.job.run_dir))
            if again >= self.cluster.max_requeues:
                action = "cancel"
                why = (f"stalled {again + 1} times in a row without getting past its step, {again} submitted again "
                       f"(cluster.max_requeues={self.cluster.max_requeues}): not submitted again")
        if action == "requeue":
            from vrun.rundir import no_progress

            stop = no_progress.before_restart(self.job.run_dir, self.plan, self.cluster.no_progress_attempts)
            if stop is not None:
                action, why = "cancel", stop.line()
                self.record("stopped", **stop.fields())
        if action == "requeue":
            from vrun.launch.slurm.nodegate import submit_again

            p = submit_again(self, hosts)
            if p.returncode:
                self.record("stall_action", action="requeue_failed", summary=summary,
                            error=(p.stderr.strip().splitlines() or ["?"])[-1][:300])
                action = "cancel"
            else:
                self.record("stall_action", action="requeued", summary=summary, exclude=hosts)
        if action == "cancel":
            self.record("stall_action", action="cancelled", summary=summary, **({"why": why} if why else {}))
            if why:
                print(f"vrun: watchdog: {why}", flush=True)
        self.release()
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60)

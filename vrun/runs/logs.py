"""`python -m vrun logs`: submitit's per-task files of a run's jobs (one task per node), each line prefixed with the
node and stream; -f follows the run's current job until the run ends (a requeue or resubmission included)."""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from vrun.core import fs
from vrun.rundir import state
from vrun.runs.common import Usage, one_run

LIST_LIMIT = 100_000  # entries of a job's submitit folder looked at
PRINT_LIMIT = 64 << 20  # bytes of one log printed (its end); -f reads at most this much per poll


def _read_from(path: Path, offsets: dict) -> bytes:
    """What a regular file holds past the offset last read (at most PRINT_LIMIT); b"" for a FIFO or device
    (opened without blocking, never read) or a file that went away."""
    import os
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        os.lseek(fd, offsets.get(path, 0), os.SEEK_SET)
        data = os.read(fd, PRINT_LIMIT)
        offsets[path] = offsets.get(path, 0) + len(data)
        return data
    except OSError:
        return b""
    finally:
        os.close(fd)

def log_files(r: state.Run, job_id: str | None = None) -> list:
    """submitit's per-task files of the run's jobs: (job id, task, stream, path), task = node index. Found by
    listing each job's folder once (at most LIST_LIMIT entries), not by probing every node the job asked for."""
    import os
    import re

    if not r.on_slurm:
        return []
    folder = str(r.slurm.get("folder"))
    nodes = (r.slurm.get("spec") or {}).get("nodes") or 1
    out = []
    for j in ([job_id] if job_id else r.job_ids or [r.job_id]):
        d = Path(folder.replace("%j", str(j)))
        name = re.compile(re.escape(str(j)) + r"_([0-9]{1,7})_log\.(out|err)")
        try:
            with os.scandir(d) as it:
                names = [e.name for _, e in zip(range(LIST_LIMIT), it)]
        except (OSError, ValueError):
            continue
        found = [(str(j), int(m.group(1)), m.group(2), d / n) for n in names for m in [name.fullmatch(n)]
                 if m and int(m.group(1)) < nodes]
        out += sorted(found, key=lambda x: (x[1], x[2] != "out"))
    return out


def cmd_logs(a) -> int:
    r = one_run(a.run)
    if r.on_ray and r.state != "planned":  # the job's log from its cluster's dashboard
        from vrun.runs import rayjobs

        return rayjobs.logs(r, a.follow)
    if not r.on_slurm and fs.is_file(r.dir / "job.log"):  # a local run's output, teed by vrun.launch.local
        from vrun.core.text import visible

        data, why = fs.read_checked(r.dir / "job.log", PRINT_LIMIT, binary=True, tail=True)
        if data is not None and len(data) >= PRINT_LIMIT:
            print(f"note: {r.dir / 'job.log'}: printing its last {PRINT_LIMIT >> 20} MiB only", file=sys.stderr)
        for line in (data or b"").decode("utf-8", errors="replace").splitlines():
            print(visible(line, colours=sys.stdout.isatty()))
        return 0
    if r.state == "planned":
        raise Usage(f"error: run={r.dir}: planned, not run (mode={r.plan.mode}, cluster={r.plan.cluster}): no job has written "
                    "a log; fix: run it with the same command and mode=train (its overrides: manifest.json), or "
                    "mode=preflight first")
    if not r.on_slurm:
        raise Usage(f"error: run={r.dir}: a run on this machine (cluster={r.plan.cluster}) writes no log "
                    "files: its output went to the terminal that started it; fix: for a kept log, run it with "
                    "`... 2>&1 | tee run.log`, or on cluster=slurm")
    node = _node_index(r, a.node) if a.node is not None else None
    job = r.job_id if a.follow else None

    def selected():
        return [f for f in log_files(r, job) if (node is None or f[1] == node) and (a.stream in ("both", f[2]))]

    # nodes named as every verb names them: the hostname once known, else the node index as hostnames go
    label = lambda t, s: f"{r.hosts[t] if t < len(r.hosts) else 'node ' + str(t)} {s}| "  # noqa: E731
    from vrun.core.text import visible

    tty = sys.stdout.isatty()
    plain = lambda text: visible(text, colours=tty)  # noqa: E731 - Ray's colours on a terminal, no other control
    if a.follow and shutil.which("squeue") is None:
        raise Usage(f"error: logs -f {r.dir}: squeue is not on this machine, so the job's end cannot be seen; fix: "
                    "follow from a SLURM login node, or drop -f to print the logs so far")
    if not a.follow:
        files = selected()
        if not files:
            never = not r.active and r.state != "completed"
            print(f"no log files {'for' if never else 'yet for'} job {r.job_id} ({state.describe(r)})"
                  + (f": SLURM never wrote {r.slurm.get('stdout')}; the nodes likely cannot see that path"
                     if never and r.slurm and r.slurm.get("stdout") else ""), file=sys.stderr)
        for j, t, s, path in files:
            prefix = label(t, s)
            data, why = fs.read_checked(path, PRINT_LIMIT, binary=True, tail=True)
            if data is None:
                print(f"warning: file={path}: {why}; not printed; fix: remove it", file=sys.stderr)
                continue
            if len(data) >= PRINT_LIMIT:
                print(f"note: {path}: printing its last {PRINT_LIMIT >> 20} MiB only", file=sys.stderr)
            for line in data.decode("utf-8", errors="replace").splitlines():
                print(prefix + plain(line))
        return 0
    offsets: dict = {}
    partial: dict = {}
    last_check = 0.0
    try:
        while True:
            for j, t, s, path in selected():
                data = _read_from(path, offsets)
                if data:
                    text = partial.pop(path, "") + data.decode(errors="replace")
                    *whole, rest = text.split("\n")
                    if rest:
                        partial[path] = rest
                    for line in whole:
                        print(label(t, s) + plain(line), flush=True)
            if not r.active:
                break
            if time.monotonic() - last_check > 2:
                last_check = time.monotonic()
                r = state.load(r.dir)
                state.refresh([r])
                if r.reason == "squeue unavailable":
                    print(f"-- job {r.job_id}: squeue stopped answering; stopped following", file=sys.stderr)
                    return 1
                if not r.active:  # one more pass for what was written last
                    time.sleep(0.5)
                    continue
            time.sleep(0.3)
    except KeyboardInterrupt:
        return 0
    print(f"-- job {r.job_id}: {state.describe(r)}", flush=True)
    return 0


def _node_index(r: state.Run, node: str) -> int:
    if node.isdigit():
        return int(node)
    if node in r.hosts:
        return r.hosts.index(node)
    raise Usage(f"error: --node={node}: not a node of job {r.job_id} (nodes: {','.join(r.hosts) or 'not started'}); "
                "fix: a node index 0… or one of those hostnames")



"""What the plan needs of each node, checked before Ray (or torchrun) starts on it, so that a bad node costs seconds
of an allocation instead of a rendezvous timeout or a hang hours later.

On every node of a SLURM attempt (vrun.launch.slurm.gate, after cluster.node_setup) and on the machine a
`mode=preflight` runs on (vrun.launch.preflight):
- GPUs: the count the plan asks per node among the node's visible devices (CUDA_VISIBLE_DEVICES as the node's
  children will see it, and nvidia-smi's list where nvidia-smi is present), the model nvidia-smi reports against the
  plan's part (cluster.gpu), and no leftover compute process holding one (nvidia-smi's compute apps);
- the run dir and the checkpoint dir: readable and writable (a token file written and read back) and the same files
  seen from every node (each node's token seen by every other node within a bounded wait);
- the clock: each node's offset against the shared storage's time stamp (a token's mtime), compared with node 0's.
The verdicts are pure functions of the facts (`gpu_failures`, `dir_failure`, `shared_failures`, `clock_failures`,
`judge`); each failure is one line naming the node, the check, the numbers and a fix.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from vrun.core import fs, writer
from vrun.core.text import summarised, visible as terminal_safe

MAX_SKEW_S = 5.0       # clock skew against node 0 beyond which a node is refused (deadlines, stall times, tokens)
TOKEN_WAIT_S = 30.0    # how long a node waits to see every other node's token in a shared dir
TOKENS = ".vrun-nodecheck"  # the folder under each checked dir that holds the nodes' tokens, per attempt
SMI_TIMEOUT_S = 20
BUSY_MIB = 1024        # memory in use on a GPU no process of this job has touched yet: another's (its process may be
                       # in a container nvidia-smi cannot see into)


# ==================================================================== what the plan needs of a node
@dataclass(frozen=True)
class Need:
    gpus: int                      # GPUs per node (cluster.ray.num_gpus, else the mesh's)
    part: str                      # cluster.gpu
    dirs: tuple = ()               # (what, path): the run dir, the checkpoint dir
    skew_s: float = MAX_SKEW_S
    wait_s: float = TOKEN_WAIT_S

    def describe(self) -> str:
        """The plan's clause: what each node checks before Ray starts."""
        return (f"each node checks before Ray/torchrun start: {self.gpus} {self.part} GPU(s) visible and free, "
                f"{' and '.join(w for w, _ in self.dirs)} writable with the same files on every node (each node's "
                f"file seen by the others within {self.wait_s:g} s), clock within {self.skew_s:g} s of node 0; a node "
                "that fails is excluded and the job submitted again (cluster.max_requeues)")


def need_of(gpus: int, part: str, run_dir: str, checkpoint_dir: Optional[str]) -> Need:
    dirs = [("run dir", run_dir)]
    if checkpoint_dir and os.path.normpath(checkpoint_dir) != os.path.normpath(run_dir):
        dirs.append(("checkpoint dir", checkpoint_dir))
    return Need(int(gpus), str(part), tuple(dirs))


def need_for(plan) -> Need:
    """A plan's (vrun.planning.plan.Plan) need of each node: the GPUs Ray is given per node (cluster.ray.num_gpus,
    else the mesh's), cluster.gpu, the run dir and verl's checkpoint dir under it."""
    c = plan.config.cluster
    return need_of(c.ray.num_gpus or plan.mesh.gpus_per_node, c.gpu, plan.run_dir, f"{plan.run_dir}/checkpoints")


# ==================================================================== the facts of one node
@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi lists it."""
    index: str
    uuid: str
    name: str
    used_mib: int = 0
    procs: tuple = ()   # (pid, MiB) of the compute processes on it


@dataclass(frozen=True)
class Failure:
    host: str
    check: str      # gpus | gpu model | gpu busy | run dir | checkpoint dir | clock
    numbers: str
    fix: str

    def line(self) -> str:
        return f"node {self.host}: {self.check}: {self.numbers}; fix: {self.fix}"


def visible(environ: Mapping[str, str]) -> Optional[list]:
    """CUDA_VISIBLE_DEVICES as a list (indices or UUIDs); [] when it hides every GPU; None when it is unset."""
    v = environ.get("CUDA_VISIBLE_DEVICES")
    if v is None:
        return None
    v = v.strip()
    if v in ("", "-1", "none", "NoDevFiles"):
        return []
    out = []
    for d in (x.strip() for x in v.split(",")):
        if not d or d.startswith("-"):
            break  # the CUDA runtime stops at the first invalid entry
        out.append(d)
    return out


def parse_smi(gpus_csv: str, apps_csv: str) -> list:
    """nvidia-smi's --query-gpu=index,uuid,name,memory.used and --query-compute-apps=gpu_uuid,pid,used_memory
    (csv, noheader, nounits) as Gpu objects."""
    procs: dict = {}
    for row in apps_csv.splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) >= 3 and cells[1].isdigit():
            procs.setdefault(cells[0], []).append((int(cells[1]), int(cells[2]) if cells[2].isdigit() else 0))
    out = []
    for row in gpus_csv.splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) >= 4 and cells[0].isdigit():
            out.append(Gpu(cells[0], cells[1], cells[2], int(cells[3]) if cells[3].isdigit() else 0,
                           tuple(procs.get(cells[1], ()))))
    return out


def smi() -> Optional[list]:
    """The GPUs nvidia-smi lists on this machine; None where nvidia-smi is absent or does not answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        g = subprocess.run([exe, "--query-gpu=index,uuid,name,memory.used", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
        a = subprocess.run([exe, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return []  # present but hung: the node's driver is in trouble, and no GPU is counted
    return parse_smi(g.stdout, a.stdout) if g.returncode == 0 else []


# ==================================================================== the verdicts (pure)
DRAIN = "drain it (scontrol update nodename={h} state=drain reason=...) and check it with nvidia-smi"


def gpu_failures(host: str, need: Need, vis: Optional[list], listed: Optional[list]) -> list:
    """The node's GPUs against the plan: count, model, leftover processes. vis: CUDA_VISIBLE_DEVICES as the
    node's children see it (None: unset); listed: nvidia-smi's GPUs (None: no nvidia-smi). Neither: nothing to
    count by (Ray is told the count: cluster.ray.num_gpus), no verdict."""
    if vis is None and listed is None:
        return []
    if listed is None:
        have, where = list(vis), f"CUDA_VISIBLE_DEVICES={','.join(vis)}" if vis else "CUDA_VISIBLE_DEVICES hides all"
        gpus = []
    else:
        gpus = listed if vis is None else [g for d in vis for g in listed if d in (g.index, g.uuid)]
        have = [g.index for g in gpus]
        where = f"nvidia-smi lists {len(listed)}" + ("" if vis is None else f", CUDA_VISIBLE_DEVICES={','.join(vis)}")
    out = []
    if len(have) < need.gpus:
        out.append(Failure(host, "gpus", f"{len(have)} visible GPU(s) ({where}), the plan needs {need.gpus} per node",
                           DRAIN.format(h=host) + "; the job goes again without it"))
    wrong = [g for g in gpus if need.part and need.part.lower() not in g.name.lower()]
    if wrong:
        out.append(Failure(host, "gpu model", f"nvidia-smi reports {terminal_safe(wrong[0].name)} on "
                           f"{len(wrong)} GPU(s), the plan is for {need.part} (cluster.gpu)",
                           f"cluster.gpu=<this part> and plan again, or cluster.constraint=<the {need.part} nodes' "
                           "feature>"))
    busy = [g for g in gpus if g.procs or g.used_mib > BUSY_MIB]
    if busy:
        held = summarised([f"GPU {g.index}: pid {p} {mib} MiB" for g in busy for p, mib in g.procs] +
                          [f"GPU {g.index}: {g.used_mib} MiB in use" for g in busy if not g.procs], sep="; ")
        out.append(Failure(host, "gpu busy", f"another process holds {len(busy)} GPU(s) ({held})",
                           f"a process of an earlier job: end it, or {DRAIN.format(h=host)}"))
    return out


def dir_failure(host: str, what: str, path: str, error: Optional[str]) -> Optional[Failure]:
    """The node could not write and read back its token under the dir."""
    if error is None:
        return None
    return Failure(host, what, f"{path}: {terminal_safe(error)}",
                   f"mount it on this node as on the others (the same shared storage), or {DRAIN.format(h=host)}")


def shared_failures(what: str, path: str, seen: Mapping[str, frozenset], wait_s: float) -> list:
    """seen: for each node that wrote its token, the nodes whose tokens it saw. The nodes that see the most common
    set (a strict majority of the writers) share the storage; each other node sees other files. A tie: every node
    is named (no majority tells which storage is the run's)."""
    if len(seen) < 2:
        return []
    groups: dict = {}
    for host, s in seen.items():
        groups.setdefault(frozenset(s), []).append(host)
    if len(groups) == 1:
        return []
    common = max(groups.values(), key=len)
    majority = len(common) * 2 > len(seen)
    out = []
    for host in sorted(seen):
        if majority and host in common:
            continue
        others = sorted(set(seen) - {host})
        missing = sorted(set(others) - set(seen[host]))
        out.append(Failure(host, what, f"{path}: after {wait_s:g} s this node sees the files of "
                           f"{len(set(seen[host]) & set(others))} of the {len(others)} other node(s) (not "
                           f"{summarised(missing, sep=',')})" + ("" if majority else ": no majority tells which "
                                                                 "storage is the run's"),
                           "put it on storage every node mounts the same (cluster.node_local_paths lists the "
                           f"private ones), or {DRAIN.format(h=host)}"))
    return out


def clock_failures(offsets: Mapping[str, float], ref: str, bound_s: float) -> list:
    """offsets: each node's clock minus the shared storage's time stamp; ref: node 0's host."""
    if ref not in offsets:
        return []
    out = []
    for host, off in sorted(offsets.items()):
        skew = off - offsets[ref]
        if host != ref and abs(skew) > bound_s:
            out.append(Failure(host, "clock", f"{skew:+.1f} s against node 0 ({ref}), beyond {bound_s:g} s",
                               f"sync its clock (chronyc tracking / timedatectl), or {DRAIN.format(h=host)}"))
    return out


@dataclass
class Verdict:
    failures: list = field(default_factory=list)
    bad: list = field(default_factory=list)      # the hosts to exclude
    everyone: bool = False                       # every node failed: the plan or the storage, not a node

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        """One line: the nodes and why (each node's first failure, the others counted)."""
        first = {}
        for f in self.failures:
            first.setdefault(f.host, f)
        more = len(self.failures) - len(first)
        return "node check: " + " | ".join(f.line() for f in first.values()) + \
            (f" (+{more} more, in the run dir's events)" if more else "")


def judge(hosts: list, reports: Mapping[str, dict], need: Need) -> Verdict:
    """Node 0's verdict from the reports (`report`) of `hosts` (node 0 first): the failures each node found on
    itself, the dirs whose files differ, the clocks."""
    out: list = []
    for h in hosts:
        out += [Failure(h, f["check"], f["numbers"], f["fix"]) for f in reports[h].get("failures", [])]
    for what, path in need.dirs:
        seen = {h: frozenset(reports[h]["seen"][what]) for h in hosts if what in reports[h].get("seen", {})}
        out += shared_failures(what, path, seen, need.wait_s)
    offsets = {h: float(reports[h]["offset"]) for h in hosts if isinstance(reports[h].get("offset"), (int, float))}
    out += clock_failures(offsets, hosts[0], need.skew_s) if hosts else []
    bad = sorted({f.host for f in out})
    return Verdict(out, bad, bool(hosts) and set(bad) >= set(hosts))


# ==================================================================== this node's facts
def token_dir(path: str, tag: str) -> Path:
    """Where the nodes' tokens for a dir go: under the dir, or under its nearest existing parent where the dir is
    not made yet (verl makes the checkpoint dir at its first save: a check makes nothing the run has not)."""
    p = Path(path)
    while not os.path.lexists(p) and p.parent != p:
        p = p.parent
    return p / TOKENS / tag


def clean(dirs, tag: str) -> None:
    """An attempt's tokens removed once judged (best effort: a dir a node could not write holds none)."""
    for _, path in dirs:
        d = token_dir(path, tag)
        shutil.rmtree(d, ignore_errors=True)
        try:
            d.parent.rmdir()  # empty once no other attempt's check is under way
        except OSError:
            pass


def probe_dir(path: str, tag: str, host: str, body: str) -> tuple:
    """Write this node's token under <path>/.vrun-nodecheck/<tag>/ and read it back: (error or None, the clock
    offset against the token's mtime, which the storage stamps)."""
    d = token_dir(path, tag)
    token = d / host
    if os.path.islink(path) and not os.path.exists(path):
        return f"a link to {os.readlink(path)}, which is missing on this node", None
    try:
        d.mkdir(parents=True, exist_ok=True)
        real = d.parent.parent.resolve()  # a checkpoint dir may be a link to the storage that holds it
        token = real / TOKENS / tag / host
        writer.write_text(token, body, root=str(real))
        now = time.time()
        back, why = fs.read_checked(token, 1 << 12, own=True)
        if back != body:
            return why or "the token read back differs from what was written", None
        st, why = fs.stat(token)
        return None, (now - st.st_mtime) if st is not None else None
    except Exception as e:  # noqa: BLE001 - any error is this node's verdict on the dir
        return f"{type(e).__name__}: {getattr(e, 'strerror', None) or e}", None


def tokens_seen(path: str, tag: str, hosts: list, wait_s: float, pause=time.sleep, settled=frozenset) -> frozenset:
    """The hosts whose tokens this node sees under the dir, waiting up to wait_s for all of them. settled(): the
    hosts done writing (their reports published): a token of theirs not seen by now never will be."""
    d = token_dir(path, tag)
    end = time.monotonic() + wait_s
    while True:
        seen = frozenset(h for h in hosts if fs.is_file(d / h))
        if seen | settled() >= set(hosts) or time.monotonic() >= end:
            return seen
        pause(0.5)


def report(host: str, need: Need, environ: Mapping[str, str], tag: str, hosts: list, pause=time.sleep,
           settled=frozenset) -> dict:
    """This node's checks: its own failures, the tokens it sees per dir, its clock offset (plain values)."""
    failures = gpu_failures(host, need, visible(environ), smi())
    seen, offset = {}, None
    for what, path in need.dirs:
        error, off = probe_dir(path, tag, host, json.dumps({"host": host, "t": time.time()}))
        f = dir_failure(host, what, path, error)
        if f is not None:
            failures.append(f)
            continue
        offset = off if offset is None else offset
    for what, path in need.dirs:
        if not any(f.check == what for f in failures):
            seen[what] = sorted(tokens_seen(path, tag, hosts, need.wait_s, pause, settled))
    return {"host": host, "failures": [vars(f) for f in failures], "seen": seen, "offset": offset}


def here(need: Need, environ: Optional[Mapping[str, str]] = None) -> list:
    """mode=preflight on the target: this machine's GPU and dir checks (one node: no other tokens to wait for)."""
    import socket

    host = socket.gethostname()
    tag = f"preflight-{os.getpid()}"
    try:
        r = report(host, need, os.environ if environ is None else environ, tag, [host])
    finally:
        clean(need.dirs, tag)
    return [Failure(**f) for f in r["failures"]]

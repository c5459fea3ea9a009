"""A stall's stacks: on each node, the Python stack of every process of the run, and one line that sums up where
the ranks sit.

`dump_node` walks /proc below the node's own process (the ancestor of the Ray daemons and their workers, or of
torchrun and its ranks) and, for each Python process, records its pid, parent, command line (secrets masked),
RANK / LOCAL_RANK / WORLD_SIZE from its start-up environment, the Ray actor its process title names, and its stack:

- by `py-spy dump --nonblocking` (read live, never paused), one py-spy per process, each with its own timeout;
- where py-spy may not read it (Yama's ptrace_scope 2 or 3 without CAP_SYS_PTRACE, py-spy refused or missing), by
  the process itself: the stack hook (vrun/launch/stackhook/sitecustomize.py, first on the run's PYTHONPATH) dumps
  every thread on SIGURG into a file of its own, read back through /proc/<pid>/fd. The signal is sent only to a
  process whose /proc/<pid>/status shows SIGURG caught (its default action is to ignore it anyway).

A rank is a process started with RANK in its environment whose parent was not started with the same one (a
DataLoader worker inherits its rank's): verl's RayWorkerGroup starts every worker with RANK, WORLD_SIZE,
MASTER_ADDR/PORT and RAY_LOCAL_WORLD_SIZE in its Ray runtime env (verl/single_controller/ray/base.py,
`_create_worker`; LOCAL_RANK only reaches os.environ later, so it is absent there), torchrun sets RANK, LOCAL_RANK
and WORLD_SIZE in each rank's. Files in out_dir: `<host>.json` (per process), `<host>.txt` (the stacks as text),
`<host>-nvidia-smi.txt` where nvidia-smi exists, `<host>.done` last. Every file goes through vrun.core.writer.

`summarize` reads every node's `<host>.json`: the ranks grouped by where they sit (`classify`: the torch.distributed
collective, data loading, a checkpoint save, or the innermost frame of the program's own code), the largest group
counted, every other rank named with its node. Standard library only; nothing here raises on what /proc, py-spy or
a process gives.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from vrun.core import fs, ptrace, writer
from vrun.planning import watch as watching

PROC = "/proc"
HOOK_DIR = Path(__file__).resolve().parent / "stackhook"   # first on the run's PYTHONPATH (vrun.planning.plan)
HOOK_SIGNAL = signal.SIGURG                                 # the hook's (see its docstring for why this one)
TRACER_ENV = "VRUN_STACK_TRACER"                            # the hook names this pid its ptracer (Yama scope 1)
HOOK_FILE = re.compile(r"/vrun-stack\.[^/]*\.(\d+)(?: \(deleted\))?$")
MAX_PARALLEL = 16
ENV_KEYS = (b"RANK", b"LOCAL_RANK", b"WORLD_SIZE")

# torch.distributed's collectives by their function names (distributed_c10d.py, _functional_collectives.py)
COLLECTIVES = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "all_reduce_inplace": "all_reduce",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "all_gather_base": "all_gather",
    "all_gather_object": "all_gather", "all_gather_tensor": "all_gather", "all_gather_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "broadcast": "broadcast", "broadcast_object_list": "broadcast",
    "barrier": "barrier", "monitored_barrier": "barrier",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "send": "send/recv", "recv": "send/recv", "isend": "send/recv", "irecv": "send/recv",
    "batch_isend_irecv": "send/recv", "send_object_list": "send/recv", "recv_object_list": "send/recv",
    "reduce": "reduce", "gather": "gather", "gather_object": "gather", "scatter": "scatter",
    "scatter_object_list": "scatter",
    "wait": "wait/synchronize", "wait_tensor": "wait/synchronize", "synchronize": "wait/synchronize",
}
SAVE_FNS = {"save", "save_checkpoint", "save_state_dict", "async_save", "save_training_checkpoint", "save_model",
            "save_pretrained", "save_file", "write_data", "save_sharded_model", "save_optimizer"}
SAVE_PATH = re.compile(r"torch/distributed/checkpoint/|dist_checkpointing/|/checkpoint|torch/serialization\.py|"
                       r"safetensors/")
DATA_PATH = re.compile(r"torch/utils/data/|/torchdata/|verl/utils/dataset/|/datasets/|dataloader", re.I)
LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib(?:64)?/python\d+\.\d+/|^<frozen |^<string>|^<")
PYSPY_FRAME = re.compile(r"^\s+(.+?) \((.*):(\d+)\)\s*$")
FAULT_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+?)\s*$')
THREAD = re.compile(r'^(?:Thread (\S+) \(([^)]*)\)(?:: "(.*)")?|(Current thread|Thread) 0x[0-9a-fA-F]+ .*:)\s*$')
RAY_TITLE = re.compile(r"^ray::([A-Za-z_][\w]*)(?:\.([\w<>]+))?")
SECRET_ARG = re.compile(r"^(-{0,2})([A-Za-z_][\w.-]*)=(.*)$", re.S)


# ------------------------------------------------------------------------------------------------ this machine
def py_spy() -> Optional[str]:
    return ptrace.py_spy()


def ptrace_scope() -> Optional[int]:
    return ptrace.scope(PROC)


def has_cap_sys_ptrace() -> bool:
    return ptrace.has_cap_sys_ptrace(PROC)


def attach_policy() -> tuple[bool, str]:
    """(whether to ask py-spy at all, why or why not) on this node: vrun.planning.watch's rule."""
    return watching.attach_rule(py_spy() is not None, ptrace_scope(), has_cap_sys_ptrace())


def ptrace_line() -> str:
    """How a stall's stacks are taken on this node, in the plan's words."""
    return watching.stacks_line(py_spy() is not None, ptrace_scope(), has_cap_sys_ptrace())


# ------------------------------------------------------------------------------------------------ /proc
def _read(path: str, limit: int = 1 << 20) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except (OSError, ValueError):
        return None


def _ppid(pid: int) -> Optional[int]:
    stat = _read(f"{PROC}/{pid}/stat", 4096)
    if not stat:
        return None
    try:
        return int(stat.rsplit(b")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


def descendants(root: int) -> list:
    """Every process below `root` (by parent id), parents before children."""
    children: dict = {}
    try:
        pids = [int(p) for p in os.listdir(PROC) if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        ppid = _ppid(pid)
        if ppid is not None and ppid != pid:
            children.setdefault(ppid, []).append(pid)
    out, seen, todo = [], {root}, [root]
    while todo:
        for c in sorted(children.get(todo.pop(0), [])):
            if c not in seen:
                seen.add(c)
                out.append(c)
                todo.append(c)
    return out


def _environ(pid: int) -> dict:
    """The start-up environment of a process (what /proc gives: the variables it was started with)."""
    raw = _read(f"{PROC}/{pid}/environ", 4 << 20) or b""
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def _is_python(pid: int) -> bool:
    try:
        name = os.path.basename(os.readlink(f"{PROC}/{pid}/exe"))
    except (OSError, ValueError):
        return False
    return name.startswith("python") or name.startswith("pypy")


def catches(pid: int, signum: int = HOOK_SIGNAL) -> bool:
    """Whether the process has a handler for signum (SigCgt in /proc/<pid>/status)."""
    for line in (_read(f"{PROC}/{pid}/status", 1 << 16) or b"").decode(errors="replace").splitlines():
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def hook_file(pid: int) -> Optional[str]:
    """The stack hook's file of this process, as /proc/<pid>/fd/<n>, or None."""
    base = f"{PROC}/{pid}/fd"
    try:
        fds = os.listdir(base)
    except OSError:
        return None
    found = None
    for fd in fds:
        try:
            target = os.readlink(f"{base}/{fd}")
        except OSError:
            continue
        m = HOOK_FILE.search(target)
        if m:
            if m.group(1) == str(pid):
                return f"{base}/{fd}"
            found = found or f"{base}/{fd}"  # a forked child still on its parent's file
    return found


def mask_args(args: list, env: dict) -> str:
    """A command line as one string, secrets hidden: `--name=value` / `NAME=value` / `--name value` where the
    name looks secret (vrun.core.writer.is_secret_name), the URL credentials and the values of the process's own
    secret variables."""
    out, hide_next = [], False
    for a in args:
        if hide_next:
            out.append(writer.HIDDEN)
            hide_next = False
            continue
        m = SECRET_ARG.match(a)
        if m and writer.is_secret_name(m.group(2).replace("-", "_")) and m.group(3):
            out.append(f"{m.group(1)}{m.group(2)}={writer.HIDDEN}")
            continue
        if a.startswith("-") and "=" not in a and writer.is_secret_name(a.lstrip("-").replace("-", "_")):
            hide_next = True
        out.append(a)
    return writer.mask(" ".join(out), env)


def _int(v) -> Optional[int]:
    return int(v.strip()) if isinstance(v, str) and v.strip().isdigit() else None


def _process(pid: int) -> Optional[dict]:
    """One process's record without its stack; None when it is not Python or has gone."""
    if not _is_python(pid):
        return None
    env = _environ(pid)
    raw = _read(f"{PROC}/{pid}/cmdline", 64 << 10) or b""
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if len(args) == 1 and " " in args[0]:  # a process title (setproctitle): one string
        args = args[0].split()
    cmdline = mask_args(args, env)[:2000]
    title = RAY_TITLE.match(cmdline)
    actor = method = None
    if title and title.group(1) != "IDLE":
        actor, method = title.group(1), title.group(2)
    return {"pid": pid, "ppid": _ppid(pid), "cmdline": cmdline, "rank": _int(env.get("RANK")),
            "local_rank": _int(env.get("LOCAL_RANK")), "world_size": _int(env.get("WORLD_SIZE")),
            "ray_actor": actor, "ray_method": method, "_secrets": writer.secret_values(env)}


# ------------------------------------------------------------------------------------------------ stacks
def py_spy_dump(tool: str, pid: int, timeout_s: float) -> tuple[str, str]:
    """(stack text, why none) of one live process, by py-spy, never pausing it."""
    try:
        p = subprocess.run([tool, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid)],
                           capture_output=True, text=True, errors="replace", timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "", f"py-spy took over {timeout_s:g} s"
    except (OSError, ValueError) as e:
        return "", f"py-spy could not run: {e}"
    if p.returncode or not p.stdout.strip():
        lines = [x.strip() for x in p.stderr.splitlines() if x.strip() and not x.startswith(" ")]
        errs = [x for x in lines if x.startswith(("Error", "Caused", "0:", "1:"))] or lines
        return "", "py-spy: " + ("; ".join(errs[:3]) or f"exit {p.returncode}")[:300]
    lines = p.stdout.splitlines()
    first = next((i for i, x in enumerate(lines) if THREAD.match(x)), None)
    if first is None:
        return "", "py-spy gave no thread"
    # from the first thread on: py-spy's header repeats the command line (its secrets unmasked)
    return "\n".join(lines[first:]).strip("\n") + "\n", ""


def signal_dump(pid: int, timeout_s: float = 10.0) -> tuple[str, str]:
    """(stack text, why none) by the process itself: SIGURG to a process whose stack hook is in place (its file
    open, the signal caught), its dump read back from the hook's file. The process keeps running."""
    path = hook_file(pid)
    if path is None:
        return "", "no stack hook in the process (vrun/launch/stackhook not first on its PYTHONPATH)"
    if not catches(pid):
        return "", f"the process does not catch {HOOK_SIGNAL.name}: not signalled"
    try:
        with open(path, "rb") as f:
            before = len(f.read())
    except OSError as e:
        return "", f"its stack file cannot be read: {e.strerror or e}"
    try:
        os.kill(pid, HOOK_SIGNAL)
    except OSError as e:
        return "", f"could not signal it: {e.strerror or e}"
    end, last, since = time.monotonic() + timeout_s, before, time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.02)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return "", "it exited before its stack was read"
        if len(data) != last:
            last, since = len(data), time.monotonic()
        elif last > before and time.monotonic() - since > 0.15:
            return data[before:].decode(errors="replace"), ""
    if last > before:
        return data[before:].decode(errors="replace"), ""
    return "", f"no stack from it within {timeout_s:g} s (stopped, or its signals blocked)"


def _stack(tool: Optional[str], use_py_spy: bool, why_not: str, pid: int, timeout_s: float) -> tuple[str, str, str]:
    """(stack, how, why none)."""
    refused = why_not
    if use_py_spy and tool:
        text, refused = py_spy_dump(tool, pid, timeout_s)
        if text:
            return text, "py-spy", ""
    if not os.path.isdir(f"{PROC}/{pid}"):
        return "", "", "it exited during the dump"
    text, why = signal_dump(pid, min(timeout_s, 10.0))
    if text:
        return text, "signal", ""
    return "", "", f"{refused}; {why}" if refused else why


# ------------------------------------------------------------------------------------------------ where
def threads(stack: str) -> list:
    """[(thread name or "", [(function, path, line), ...innermost first])] from py-spy's or faulthandler's text."""
    out: list = []
    for line in (stack or "").splitlines():
        t = THREAD.match(line)
        if t:
            out.append((t.group(3) or "", []))
            continue
        m = PYSPY_FRAME.match(line)
        if m:
            frame = (m.group(1), m.group(2), m.group(3))
        else:
            m = FAULT_FRAME.match(line)
            if not m:
                continue
            frame = (m.group(3), m.group(1), m.group(2))
        if not out:
            out.append(("", []))
        out[-1][1].append(frame)
    return [t for t in out if t[1]]


def _last(fn: str) -> str:
    return fn.rsplit(".", 1)[-1].strip("_").lower()


def _kind(frames: list) -> Optional[str]:
    """A thread's place, collective first: the collective, `checkpoint save`, `data loading`, or None."""
    for fn, path, _ in frames:
        name = _last(fn)
        if name in COLLECTIVES and ("torch/distributed/" in path or (name == "synchronize" and "torch/" in path)):
            return COLLECTIVES[name]
    for fn, path, _ in frames:
        name = _last(fn)
        if name in SAVE_FNS and (SAVE_PATH.search(path) or not LIBRARY.search(path)) or \
                ("save" in name and re.search(r"torch/distributed/checkpoint/|dist_checkpointing/", path)):
            return "checkpoint save"
    for fn, path, _ in frames:
        if DATA_PATH.search(path) or _last(fn) in ("getitem", "getitems") and not LIBRARY.search(path):
            return "data loading"
    return None


def _is_main(name: str, frames: list) -> bool:
    return name == "MainThread" or (not name and frames[-1][0] == "<module>")


def _own_frame(frames: list) -> str:
    for fn, path, line in frames:
        if not LIBRARY.search(path):
            return f"{fn} ({os.path.basename(path)}:{line})"
    fn, path, line = frames[0]
    return f"{fn} ({os.path.basename(path)}:{line})"


def classify(stack_text: str) -> str:
    """Where a process sits, from its stack (py-spy's or faulthandler's): the torch.distributed collective it waits
    in (`all_reduce`, `all_gather`, `reduce_scatter`, `broadcast`, `barrier`, `all_to_all`, `send/recv`,
    `wait/synchronize`, ...), `checkpoint save`, `data loading`, or the innermost frame of the program's own code,
    `fn (file.py:12)`; "" without a stack. The main thread decides; another thread only with a collective or a save
    (a pin-memory thread idles in torch.utils.data all along)."""
    ts = threads(stack_text)
    if not ts:
        return ""
    main = next((t for t in ts if _is_main(*t)), None)
    if main is not None:
        kind = _kind(main[1])
        if kind:
            return kind
    others = [t for t in ts if t is not main]
    for t in others:
        kind = _kind(t[1])
        if kind and (kind != "data loading" or main is None):
            return kind
    return _own_frame((main or ts[0])[1])


# ------------------------------------------------------------------------------------------------ one node
def job_pids(pids: list) -> list:
    """The given processes and every process below each (a rank's DataLoader workers), each once, in order."""
    out: list = []
    for pid in pids:
        for p in [pid] + descendants(pid):
            if p not in out:
                out.append(p)
    return out


def dump_node(out_dir: Path, root_pid: int, timeout_s: float = 30, pids: Optional[list] = None,
              host: Optional[str] = None) -> Path:
    """Every Python process below root_pid on this node (or, with `pids`, those processes and the ones below
    them: a Ray job's workers, which share their raylet with other jobs'), with its stack, into out_dir (see the
    module's docstring), its files named by `host` (default: the hostname); returns out_dir. Never raises on what
    the processes or /proc do."""
    t0 = time.monotonic()
    out_dir = Path(out_dir)
    host = host or socket.gethostname()
    root = str(out_dir.parent.parent)  # the run dir: the writer writes nowhere else
    os.makedirs(out_dir, exist_ok=True)
    tool = py_spy()
    use_py_spy, why = attach_policy()
    why_not = "" if use_py_spy else why
    chosen = job_pids(pids) if pids is not None else descendants(root_pid)
    procs = [p for p in (_process(pid) for pid in chosen) if p is not None]
    by_pid = {p["pid"]: p for p in procs}
    for p in procs:  # a child started with its parent's RANK (a DataLoader worker) is not a rank of its own
        parent = by_pid.get(p["ppid"])
        p["rank_process"] = p["rank"] is not None and not (parent is not None and parent["rank"] == p["rank"] and
                                                           parent["world_size"] == p["world_size"])
    smi_out: dict = {}
    smi = shutil.which("nvidia-smi")
    if smi:
        def nvidia() -> None:
            try:
                r = subprocess.run([smi], capture_output=True, text=True, errors="replace",
                                   timeout=min(timeout_s, 30))
                smi_out["text"] = r.stdout + r.stderr
            except (OSError, subprocess.SubprocessError) as e:
                smi_out["text"] = f"nvidia-smi: {e}\n"
        smi_thread = threading.Thread(target=nvidia, daemon=True)
        smi_thread.start()
    gate = threading.Semaphore(MAX_PARALLEL)
    results: dict = {}

    def one(pid: int) -> None:
        with gate:
            try:
                results[pid] = _stack(tool, use_py_spy, why_not, pid, timeout_s)
            except Exception as e:  # noqa: BLE001 - one process's trouble is its own line
                results[pid] = ("", "", f"{type(e).__name__}: {e}")

    workers = [threading.Thread(target=one, args=(p["pid"],), daemon=True) for p in procs]
    for w in workers:
        w.start()
    deadline = time.monotonic() + timeout_s * (1 + len(procs) // MAX_PARALLEL) + 15
    for w in workers:
        w.join(max(deadline - time.monotonic(), 0.1))
    text = []
    for p in procs:
        stack, how, no = results.get(p["pid"], ("", "", f"no answer within {timeout_s:g} s"))
        secrets = p.pop("_secrets")
        for v in sorted(secrets, key=len, reverse=True):
            stack = stack.replace(v, writer.HIDDEN)
        p.update(where=classify(stack), how=how, stack=stack, no_stack=no)
        rank = f"rank {p['rank']}/{p['world_size']}" if p["rank"] is not None else "no rank"
        actor = f", Ray actor {p['ray_actor']}" if p["ray_actor"] else ""
        head = f"=== pid {p['pid']} (parent {p['ppid']}) {rank}{actor} on {host}: {p['cmdline']}"
        body = f"[{how}] where: {p['where']}\n{stack}" if stack else f"no stack: {no}\n"
        text.append(f"{head}\n{body}")
    summary = {"host": host, "root_pid": root_pid, "stacks": ptrace_line(), "py_spy": tool,
               "took_s": round(time.monotonic() - t0, 2), "processes": procs}
    writer.write_text(out_dir / f"{host}.json", json.dumps(summary, indent=1) + "\n", root=root)
    writer.write_text(out_dir / f"{host}.txt", "\n".join(text) or
                      f"no Python process below pid {root_pid} on {host}\n", root=root)
    if smi:
        smi_thread.join(max(min(timeout_s, 30) + 2 - (time.monotonic() - t0), 0.1))
        if smi_out.get("text"):
            writer.write_text(out_dir / f"{host}-nvidia-smi.txt", smi_out["text"], root=root)
    writer.write_text(out_dir / f"{host}.done", "1\n", root=root)
    return out_dir


# ------------------------------------------------------------------------------------------------ every node
def _nodes(out_dir: Path) -> list:
    out = []
    try:
        files = sorted(p for p in Path(out_dir).iterdir() if p.suffix == ".json" and p.name != "ray.json")
    except OSError:
        return []
    for f in files:
        try:
            data = json.loads(fs.read_small(f, 256 << 20) or "{}")
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("processes"), list):
            out.append(data)
    return out


def _where(p: dict) -> str:
    return str(p.get("where") or "") or "no stack: " + str(p.get("no_stack") or "?")


def groups(out_dir: Path) -> tuple[list, list]:
    """(ranks as (rank, host, where), hosts dumped)."""
    ranks, hosts = set(), []
    for node in _nodes(out_dir):
        host = str(node.get("host"))
        hosts.append(host)
        for p in node["processes"]:
            if isinstance(p, dict) and isinstance(p.get("rank"), int) and not isinstance(p.get("rank"), bool) \
                    and p.get("rank_process", True):
                ranks.add((p["rank"], host, _where(p)))
    return sorted(ranks), hosts


def _majority(ranks: list) -> Optional[str]:
    """The largest group's place; between groups of one size, a collective (where ranks wait for the odd one),
    then the earliest rank's."""
    if not ranks:
        return None
    counts = Counter(w for _, _, w in ranks)
    top = max(counts.values())
    tied = [w for _, _, w in ranks if counts[w] == top]
    return next((w for w in tied if w in COLLECTIVES.values()), tied[0])


def odd(out_dir: Path) -> list:
    """The ranks outside the largest group: (rank, host, where)."""
    ranks, _ = groups(out_dir)
    common = _majority(ranks)
    return [r for r in ranks if r[2] != common]


def odd_hosts(out_dir: Path) -> list:
    """The nodes of the odd ranks, when they are fewer than the nodes dumped (a requeue excludes them)."""
    _, hosts = groups(out_dir)
    found = sorted({h for _, h, _ in odd(out_dir)})
    return found if found and len(found) < len(set(hosts)) else []


def _phrase(where: str) -> str:
    return f"without a stack ({where[len('no stack: '):]})" if where.startswith("no stack: ") else f"in {where}"


def summarize(out_dir: Path, step: Optional[int], stalled_for_s: float) -> str:
    """`stalled at step 312 for 41 min: 255 ranks in all_reduce, rank 133 on n17 in data loading → stalls/1/`."""
    out_dir = Path(out_dir)
    head = f"stalled at {'step ' + str(step) if step is not None else 'the first step'} for {duration(stalled_for_s)}"
    tail = f" → {out_dir.parent.name}/{out_dir.name}/"
    ranks, hosts = groups(out_dir)
    if not ranks:
        nodes = _nodes(out_dir)
        n = sum(len(node["processes"]) for node in nodes)
        where = ", ".join(sorted(set(hosts)))
        if not nodes:
            return f"{head}: no node's stacks arrived{tail}"
        return (f"{head}: no training process found on {where} ({n} Python process{'es' if n != 1 else ''} "
                f"without RANK){tail}")
    common = _majority(ranks)
    n = sum(1 for r in ranks if r[2] == common)
    parts = [f"{n} rank{'s' if n != 1 else ''} {_phrase(common)}"]
    by_place: dict = {}
    for r, h, w in ranks:
        if w != common:
            by_place.setdefault((w, h), []).append(r)
    places = sorted(by_place.items(), key=lambda x: x[1][0])
    for (w, h), rs in places[:8]:
        name = f"rank {rs[0]}" if len(rs) == 1 else \
            f"ranks {','.join(map(str, rs[:8]))}" + ("…" if len(rs) > 8 else "")
        parts.append(f"{name} on {h} {_phrase(w)}")
    if len(places) > 8:
        parts.append(f"{sum(len(rs) for _, rs in places[8:])} more ranks elsewhere")
    return f"{head}: {', '.join(parts)}{tail}"


def duration(s: float) -> str:
    s = int(round(s))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s / 3600:.1f} h"

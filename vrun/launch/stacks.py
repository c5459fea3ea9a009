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

vrun.launch.stall_summary reads the dumps back (`classify`, `summarize`, `odd_hosts`: their names are importable
from here too). Standard library only; nothing here raises on what /proc, py-spy or a process gives.
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
from pathlib import Path
from typing import Optional

from vrun.core import ptrace, writer
from vrun.launch.stall_summary import (  # noqa: F401 - a dump is read back there; its names importable from here
    THREAD, classify, duration, groups, odd, odd_hosts, summarize, threads)
from vrun.planning import watch as watching

PROC = "/proc"
HOOK_DIR = Path(__file__).resolve().parent / "stackhook"   # first on the run's PYTHONPATH (vrun.planning.plan)
HOOK_SIGNAL = signal.SIGURG                                 # the hook's (see its docstring for why this one)
TRACER_ENV = "VRUN_STACK_TRACER"                            # the hook names this pid its ptracer (Yama scope 1)
HOOK_FILE = re.compile(r"/vrun-stack\.[^/]*\.(\d+)(?: \(deleted\))?$")
MAX_PARALLEL = 16
ENV_KEYS = (b"RANK", b"LOCAL_RANK", b"WORLD_SIZE")
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

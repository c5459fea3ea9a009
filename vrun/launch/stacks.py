"""A stall's stacks: on each node, the Python stack of every training process, and one line that sums up where the
ranks sit.

`dump_node` walks this node's process tree below the node's own process (the ancestor of the Ray daemons and their
workers, or of torchrun and its ranks), and dumps each Python process with `py-spy dump --nonblocking` (live, never
paused). A rank is a process started with RANK in its environment: verl's RayWorkerGroup starts every worker with
RANK/WORLD_SIZE/LOCAL_RANK in its runtime env (verl/single_controller/ray/base.py), torchrun sets them in each
rank's. Attaching needs ptrace: allowed to an ancestor under Yama's ptrace_scope 0 and 1; under 2 and 3 (or without
py-spy) each process is listed with why no stack was taken, and the summary says so. `nvidia-smi` is kept where it
exists. Files: `<host>.json` (per process), `<host>.txt` (the stacks), `<host>-nvidia-smi.txt`, `<host>.done` last.

`summarize` reads every node's `<host>.json`: the ranks grouped by where they sit (`classify`: the torch.distributed
collective, data loading, a checkpoint save, or the innermost frame of the program's own code), the largest group
counted, every other rank named with its node. Standard library only; nothing here raises on what /proc or py-spy
give.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Optional

from vrun.core import fs, writer

COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "reduce_scatter",
               "all_to_all_single", "all_to_all", "broadcast", "barrier", "send", "recv", "isend", "irecv",
               "monitored_barrier", "reduce", "gather", "scatter")
DATA = re.compile(r"torch/utils/data/|dataloader|_next_data|__getitem__|/data/.*dataset|rl_dataset|sampler", re.I)
SAVE = re.compile(r"save_checkpoint|checkpoint/|distributed/checkpoint|torch/serialization\.py.*save|dcp\.save", re.I)
LIBRARY = re.compile(r"site-packages|dist-packages|/lib/python3|<frozen|threading\.py")
FRAME = re.compile(r"^\s+(\S+) \((.+?):(\d+)\)")


def py_spy() -> Optional[str]:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if fs.is_file(here) else shutil.which("py-spy")


def _read(path: str, limit: int = 1 << 20) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except (OSError, ValueError):
        return None


def descendants(root: int) -> list:
    """Every process below `root` (by parent id), from /proc."""
    children: dict = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        stat = _read(f"/proc/{pid}/stat", 4096)
        if not stat:
            continue
        try:
            ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        except (IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.append(c)
                todo.append(c)
    return out


def _environ(pid: int) -> dict:
    raw = _read(f"/proc/{pid}/environ") or b""
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k in (b"RANK", b"LOCAL_RANK", b"WORLD_SIZE"):
            out[k.decode()] = v.decode(errors="replace")
    return out


def _is_python(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False


def classify(stack: str) -> str:
    """Where a stack sits: `all_reduce` (or another collective), `data loading`, `checkpoint save`, or the innermost
    frame of the program's own code (`fn (file.py:12)`); "" for no stack."""
    frames = [m.groups() for m in (FRAME.match(line) for line in stack.splitlines()) if m]
    if not frames:
        return ""
    for fn, path, _ in frames:  # innermost first (py-spy's order)
        if "torch/distributed" in path and fn.lstrip("_") in COLLECTIVES:
            return fn.lstrip("_")
        if "torch/distributed" in path and fn in ("wait", "synchronize"):
            return "wait"
    text = "\n".join(f"{fn} {path}" for fn, path, _ in frames)
    if SAVE.search(text):
        return "checkpoint save"
    if DATA.search(text):
        return "data loading"
    for fn, path, line in frames:
        if not LIBRARY.search(path):
            return f"{fn} ({os.path.basename(path)}:{line})"
    fn, path, line = frames[0]
    return f"{fn} ({os.path.basename(path)}:{line})"


def _dump(tool: Optional[str], pid: int, timeout_s: float) -> tuple[str, str]:
    """(stack text, why none) of one live process."""
    if tool is None:
        return "", "py-spy is not installed here (pip install py-spy)"
    try:
        p = subprocess.run([tool, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "", f"py-spy took over {timeout_s:g} s"
    except OSError as e:
        return "", f"py-spy could not run: {e}"
    if p.returncode:
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:200]
        return "", f"py-spy could not attach: {why}"
    return p.stdout, ""


def dump_node(out_dir: Path, root_pid: int, timeout_s: float = 30.0) -> Path:
    """This node's training processes below root_pid, their stacks into out_dir (see the module's docstring)."""
    out_dir = Path(out_dir)
    host = socket.gethostname()
    root = str(out_dir.parent.parent)  # the run dir: the writer writes nowhere else
    tool = py_spy()
    found = []
    for pid in descendants(root_pid):
        if not _is_python(pid):
            continue
        title = (_read(f"/proc/{pid}/cmdline", 4096) or b"").replace(b"\0", b" ").decode(errors="replace").strip()
        env = _environ(pid)
        found.append({"pid": pid, "title": title[:300], "rank": _int(env.get("RANK")),
                      "local_rank": _int(env.get("LOCAL_RANK")), "world_size": _int(env.get("WORLD_SIZE"))})
    results: dict = {}

    def one(p: dict) -> None:
        results[p["pid"]] = _dump(tool, p["pid"], timeout_s)

    threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in found]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 5)
    text = []
    for p in found:
        stack, why = results.get(p["pid"], ("", "no answer"))
        p["where"], p["stack"], p["no_stack"] = classify(stack), stack, why
        text.append(f"=== pid {p['pid']} rank {p['rank']} on {host}: {p['title']}\n{stack or why}\n")
    writer.write_text(out_dir / f"{host}.json", json.dumps({"host": host, "processes": found,
                                                             "ptrace": ptrace_note()}, indent=1) + "\n", root=root)
    writer.write_text(out_dir / f"{host}.txt", "\n".join(text) or "no Python process below the node's own\n",
                      root=root)
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            p = subprocess.run([smi], capture_output=True, text=True, timeout=30)
            writer.write_text(out_dir / f"{host}-nvidia-smi.txt", p.stdout + p.stderr, root=root)
        except (OSError, subprocess.SubprocessError):
            pass
    writer.write_text(out_dir / f"{host}.done", "1\n", root=root)
    return out_dir


def ptrace_note() -> str:
    text = fs.read_small("/proc/sys/kernel/yama/ptrace_scope", 16)
    scope = text.strip() if text else None
    if scope in (None, "0", "1"):
        return "py-spy attaches (" + (f"ptrace_scope {scope}" if scope else "no Yama") + ")"
    return f"ptrace_scope {scope}: attaching is forbidden; no stacks"


def _int(v) -> Optional[int]:
    return int(v) if isinstance(v, str) and v.strip().isdigit() else None


def _nodes(out_dir: Path) -> list:
    out = []
    try:
        files = sorted(p for p in Path(out_dir).iterdir() if p.suffix == ".json" and p.name != "ray.json")
    except OSError:
        return []
    for f in files:
        try:
            data = json.loads(fs.read_small(f, 64 << 20) or "{}")
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("processes"), list):
            out.append(data)
    return out


def groups(out_dir: Path) -> tuple[list, list]:
    """(ranks as (rank, host, where), hosts dumped)."""
    ranks, hosts = [], []
    for node in _nodes(out_dir):
        hosts.append(str(node.get("host")))
        for p in node["processes"]:
            if isinstance(p, dict) and isinstance(p.get("rank"), int):
                where = p.get("where") or ("no stack: " + str(p.get("no_stack") or "?"))
                ranks.append((p["rank"], str(node.get("host")), where))
    return sorted(set(ranks)), hosts


def odd(out_dir: Path) -> list:
    """The ranks outside the largest group: (rank, host, where)."""
    ranks, _ = groups(out_dir)
    if not ranks:
        return []
    common = Counter(w for _, _, w in ranks).most_common(1)[0][0]
    return [r for r in ranks if r[2] != common]


def odd_hosts(out_dir: Path) -> list:
    """The nodes of the odd ranks, when they are fewer than the nodes dumped (a requeue excludes them)."""
    _, hosts = groups(out_dir)
    found = sorted({h for _, h, _ in odd(out_dir)})
    return found if found and len(found) < len(set(hosts)) else []


def summarize(out_dir: Path, step: Optional[int], stalled_for_s: float) -> str:
    """`stalled at step 312 for 41 min: 255 ranks in all_reduce, rank 133 on n17 in data loading → stalls/1/`."""
    out_dir = Path(out_dir)
    head = f"stalled at {'step ' + str(step) if step is not None else 'the first step'} for {_dur(stalled_for_s)}"
    ranks, hosts = groups(out_dir)
    tail = f" → stalls/{out_dir.name}/"
    if not ranks:
        return f"{head}: no training process found on {', '.join(hosts) or 'any node'}{tail}"
    counts = Counter(w for _, _, w in ranks)
    common, n = counts.most_common(1)[0]
    parts = [f"{n} rank{'s' if n != 1 else ''} in {common}"]
    by_where: dict = {}
    for r, h, w in odd(out_dir):
        by_where.setdefault((w, h), []).append(r)
    for (w, h), rs in sorted(by_where.items(), key=lambda x: x[1][0]):
        name = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {','.join(map(str, rs[:8]))}" + ("…" if len(rs) > 8 else "")
        parts.append(f"{name} on {h} in {w}")
    return f"{head}: {', '.join(parts)}{tail}"


def _dur(s: float) -> str:
    s = int(round(s))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s / 3600:.1f} h"

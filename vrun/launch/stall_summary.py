"""A stall's dumps read back: each process's stack split into threads and frames (py-spy's text and faulthandler's),
where it sits (`classify`: the torch.distributed collective, data loading, a checkpoint save, or the innermost frame
of the program's own code), and every node's `<host>.json` summed up in one line (`summarize`: the ranks grouped by
where they sit, the largest group counted, every other rank named with its node; `odd`, `odd_hosts`). Standard
library only; nothing here raises on what a dump holds. vrun.launch.stacks takes the dumps."""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Optional

from vrun.core import fs
from vrun.core.text import summarised
from vrun.core.units import clock


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
        where = summarised(sorted(set(hosts)))
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
    """How long a stall has lasted, in whole seconds as the watch says them."""
    return clock(round(s))

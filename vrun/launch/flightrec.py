"""A stall's stuck collective, named from torch's flight recorder (the environment that turns it on, what the
installed torch can, and the plan's row: vrun.planning.recorder).

On a stall the watchdog's collect (node 0 of a SLURM job, the local launch, a Ray job's entry) first `ask`s every
rank for its dump — a token in <run dir>/stalls/fr/request, which each rank's listener (the stack hook's
vrun_frdump) answers with its recorder's JSON dumps, stalls/fr/rank_<r> (gloo and the other CPU backends) and
stalls/fr/nccl_rank_<r> (a CUDA build's NCCL), and a byte into each NCCL debug-info pipe a process on this node holds
open, which NCCL's own watchdog answers with its pickled dump stalls/nccl/rank_<r> — then, after the stacks,
`gather`s them into the stall's dir (stalls/<n>/fr/, stalls/<n>/nccl/). The pickled ones are kept for torch's own
command line (python -m torch.distributed.flight_recorder.fr_trace); nothing here unpickles.

`analyse` reads the JSON dumps (regular files of this user, bounded in size) and hands them to torch's own analyser
(torch.distributed.flight_recorder.components.builder.build_db, partial ranks allowed), in a thread given
ANALYSE_TIMEOUT_S: a hung or failing analyser never holds up the watchdog. The verdict — the first collective the
ranks do not agree on (its kind, process group, sequence number and size; the ranks in it and the ranks that never
entered it), else the last one recorded — is written to stalls/<n>/fr/collective.json and told in one clause
(`clause`): `all_reduce #412 on pg 0 (8 MiB): ranks 0–6 in it, rank 7 never entered`. Where there is none, the reason
is told instead (no dump came, the torch cannot, the analyser failed).
"""
from __future__ import annotations

import json
import os
import stat as st_mod
import time
from pathlib import Path
from typing import Optional

from vrun.core import fs, writer
from vrun.planning import recorder
from vrun.planning.recorder import FR, NCCL, PREFIX, STALLS

ANALYSE_TIMEOUT_S = 120.0
DUMP_LIMIT = 256 << 20      # one rank's dump at most (2,000 entries are a few MB)
NCCL_PREFIX = "nccl_rank_"  # a CUDA build's NCCL recorder, dumped by the listener beside the CPU one
VERDICT = "collective.json"
SETUP_HOOK = "vrun.launch.stackhook.vrun_frdump.start"
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1,
               "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "ComplexFloat": 8}


def nccl_env(run_dir: str) -> dict:
    """The recorder's environment (vrun.planning.recorder.env); the name the launchers have always used."""
    return recorder.env(run_dir)


def ask(run_dir: str) -> int:
    """Ask every rank for its dump: a new token in stalls/fr/request (one the ranks have not seen in the last
    30 s: node 0 and each node's own dump ask once for one stall), then NCCL's pipes on this node. Returns how many
    NCCL pipes were poked."""
    try:
        for d in (Path(run_dir) / STALLS, Path(run_dir) / STALLS / FR):
            if not writer.contained(str(d / "x"), run_dir):  # never made or written through a link
                raise writer.UnsafePath(f"{d} is not the run dir's own")
            try:
                os.mkdir(d, 0o755)
            except FileExistsError:
                pass
        req = d / "request"
        t = fs.mtime(req)
        if t is None or time.time() - t > 30:
            writer.write_text(req, f"{time.time_ns()}\n", root=run_dir)
    except OSError:
        pass
    return _poke_pipes(Path(run_dir) / STALLS / NCCL)


def _poke_pipes(base: Path) -> int:
    n = 0
    try:
        pipes = [p for p in base.iterdir() if p.name.endswith(".pipe")]
    except OSError:
        return 0
    for p in pipes:
        try:
            fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader on this node (ENXIO), or gone
            continue
        try:
            if st_mod.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, b"1")
                n += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return n


def gather(run_dir: str, out: Path, wait_s: float = 5.0) -> int:
    """The dumps the ranks wrote (stalls/nccl/rank_<r>, stalls/fr/[nccl_]rank_<r>[.none]) moved into out/nccl/, out/fr/
    (the ranks answer within a second or two of the request; wait_s more are given); the run dir's own dirs only,
    never through a link, and no dump older than a minute before the request. Returns how many."""
    bases = [b for b in (Path(run_dir) / STALLS / NCCL, Path(run_dir) / STALLS / FR)
             if fs.is_dir(b) and not fs.is_link(b) and writer.contained(str(b / "x"), run_dir)]
    if not bases:
        return 0
    time.sleep(wait_s)
    asked = fs.mtime(Path(run_dir) / STALLS / FR / "request")
    # a dump older than that (a late answer to an earlier stall) is not this one's
    since = asked - 60 if asked is not None else 0.0
    moved = 0
    for base in bases:
        try:
            dumps = [p for p in base.iterdir() if p.name.startswith((PREFIX, NCCL_PREFIX))
                     and not p.name.endswith(".pipe")
                     and fs.is_file(p) and not fs.is_link(p) and (fs.mtime(p) or 0) >= since]
        except OSError:
            continue
        if not dumps:
            continue
        dest = out / base.name
        try:
            dest.mkdir(exist_ok=True)
        except OSError:
            continue
        for p in dumps:
            try:
                os.replace(p, dest / p.name)
                moved += 1
            except OSError:
                pass
    return moved


# ------------------------------------------------------------------------------------------------ the analysis
def load(d: Path, prefix: str = PREFIX) -> tuple[dict, list]:
    """({file: the analyser's detail of one rank}, [why a file was left out]) for the <prefix><rank> JSON dumps in
    d (torch's JSON dump format; the analyser's own loader unpickles, which nothing here does)."""
    details, skipped = {}, []
    try:
        files = sorted(p for p in Path(d).iterdir() if p.name.startswith(prefix))
    except OSError:
        return {}, []
    for p in files:
        if p.name.endswith(".none"):
            skipped.append(f"{p.name[:-5]}: {(fs.read_small(p, 400) or '').strip()}")
            continue
        rank = p.name[len(prefix):]
        if not rank.isdigit():
            continue
        data, why = fs.read_checked(p, DUMP_LIMIT, own=True)
        try:
            dump = json.loads(data) if data is not None else None
        except ValueError as e:
            why, dump = f"not JSON: {str(e)[:100]}", None
        if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list) or \
                not all(isinstance(e, dict) for e in dump["entries"]):
            skipped.append(f"{p.name}: {why or 'not a flight-recorder dump'}")
            continue
        for e in dump["entries"]:  # the pickled format's tuple, which the analyser was written against
            if isinstance(e.get("process_group"), list):
                e["process_group"] = tuple(e["process_group"])
        details[p.name] = {"host_name": f"rank{rank}", "rank": int(rank), "entries": dump["entries"],
                           "version": str(dump.get("version", "")), "pg_config": dump.get("pg_config") or {}}
    return details, skipped


def verdict_of(details: dict) -> dict:
    """torch's analyser on the ranks' dumps: the collective it could not match across its group, else the last
    one recorded; {"why": ...} where there is none."""
    import copy
    import logging

    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig

    raw = copy.deepcopy(details)
    version = next(iter(details.values()))["version"]
    args = JobConfig().parse_args(["--allow-incomplete-ranks", "."])
    logging.getLogger("Flight Recorder").setLevel(logging.CRITICAL)
    db = build_db(details, args, version)
    if not db.collectives:
        return {"why": "the dumps hold no collective"}
    odd = [c for c in db.collectives if c.missing_ranks or not c.pass_check]
    c = odd[0] if odd else max(db.collectives, key=lambda c: c.collective_seq_id)
    expected = sorted(int(r) for r in c.expected_ranks)
    missing = sorted(int(r) for r in (c.missing_ranks or ()))
    dumped = sorted(d["rank"] for d in raw.values())
    kind = str(c.collective_name).split(":")[-1]
    pg, desc = str(c.pg_desc).split(":", 1) if ":" in str(c.pg_desc) else (str(c.pg_desc), "")
    return {"collective": kind, "backend": str(c.collective_name).split(":")[0], "pg": pg, "pg_desc": desc,
            "seq": int(c.collective_seq_id), "input_sizes": c.input_sizes, "bytes": _bytes(raw, c),
            "expected_ranks": expected, "missing_ranks": missing,
            "in_it": [r for r in expected if r not in missing and r in dumped],
            "no_dump": [r for r in expected if r not in dumped], "matched": not odd,
            "state": str(c.collective_state), "analyser": "torch.distributed.flight_recorder build_db"}


def _bytes(raw: dict, c) -> Optional[int]:
    for d in raw.values():
        for e in d["entries"]:
            if e.get("collective_seq_id") == c.collective_seq_id and e.get("profiling_name") == c.collective_name:
                total = 0
                for shape, dtype in zip(e.get("input_sizes") or [], e.get("input_dtypes") or []):
                    n = 1
                    for x in shape:
                        n *= int(x)
                    total += n * DTYPE_BYTES.get(str(dtype), 0)
                return total or None
    return None


def analyse(out: Path, timeout_s: float = ANALYSE_TIMEOUT_S) -> dict:
    """The verdict for a stall's dir (its fr/ dumps; the one naming missing ranks first), written to
    out/fr/collective.json; {"why": ...} where there is none. Each dir is analysed in a daemon thread given timeout_s:
    an analyser that does not return never holds up the stall's report. (In this process, not a child: a Ray job's
    driver is where a child of it failed to load torch's libraries.)"""
    sets = [(out / FR, p) for p in (PREFIX, NCCL_PREFIX) if fs.is_dir(out / FR) and
            any(f.name.startswith(p) for f in (out / FR).iterdir())]
    v: dict = {} if sets else {"why": "no rank's flight-recorder dump came"}
    for d, prefix in sets:
        got = _bounded(d, prefix, timeout_s)
        if "collective" in got and (not v.get("collective") or got.get("missing_ranks")):
            v = got
        elif not v:
            v = got
    try:  # inside fr/: every other .json of the stall's dir is a node's dump (vrun.launch.stall_summary)
        os.makedirs(out / FR, exist_ok=True)
        writer.write_text(out / FR / VERDICT, json.dumps(v, indent=1) + "\n", root=str(out.parent.parent))
    except OSError:
        pass
    return v


def _bounded(d: Path, prefix: str, timeout_s: float) -> dict:
    import threading

    box: dict = {}

    def run() -> None:
        try:
            box["v"] = verdict_dir(d, prefix)
        except Exception as e:  # noqa: BLE001 - the analyser's failure is the verdict's reason
            box["v"] = {"why": f"torch's analyser failed: {type(e).__name__}: {str(e).strip()[:200]}"}

    t = threading.Thread(target=run, name="vrun-fr-analyse", daemon=True)
    t.start()
    t.join(timeout_s)
    return box.get("v") or {"why": f"torch's analyser did not return within {timeout_s:g} s"}


def verdict_dir(d: Path, prefix: str = PREFIX) -> dict:
    """The verdict on the <prefix><rank> dumps in one dir (skipped files said beside it)."""
    import logging

    logging.getLogger("Flight Recorder").setLevel(logging.CRITICAL)  # the analyser logs its tables
    details, skipped = load(d, prefix)
    if not details:
        return {"why": "no readable dump" + (f" ({'; '.join(skipped)})" if skipped else "")}
    v = verdict_of(details)
    return {**v, "skipped": skipped} if skipped and "collective" in v else v


def clause(v: dict) -> str:
    """`all_reduce #412 on pg 0 (8 MiB): ranks 0–6 in it, rank 7 never entered`, or why there is no verdict."""
    if "collective" not in v:
        return f"no collective named: {v.get('why', 'no verdict')}"
    size = f" ({_size(v['bytes'])})" if v.get("bytes") else ""
    head = f"{v['collective']} #{v['seq']} on pg {v['pg']}{size}"
    parts = [f"{_ranks(v['in_it'])} in it"] if v.get("in_it") else []
    if v.get("missing_ranks"):
        parts.append(f"{_ranks(v['missing_ranks'])} never entered")
    elif v.get("matched"):
        parts = [f"all {len(v['expected_ranks'])} ranks in it (the last collective recorded)"]
    if v.get("no_dump"):
        parts.append(f"no dump from {_ranks(v['no_dump'])}")
    return f"{head}: {', '.join(parts)}"


def _ranks(rs: list) -> str:
    rs = sorted(rs)
    runs, start = [], 0
    for i in range(1, len(rs) + 1):
        if i == len(rs) or rs[i] != rs[i - 1] + 1:
            a, b = rs[start], rs[i - 1]
            runs.append(str(a) if a == b else f"{a}–{b}" if b > a + 1 else f"{a},{b}")
            start = i
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(runs[:8]) + ("…" if len(runs) > 8 else "")


def _size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.3g} {unit}"
    return f"{n} B"


def named(out: Path) -> dict:
    """The `stalled` event's field: {"collective": the clause} or {"no_collective": why there is none}."""
    v = analyse(out)
    if "collective" in v:
        return {"collective": clause(v)}
    why = v.get("why", "no verdict")
    if why.startswith("no rank's"):
        s = recorder.support()
        cannot = s.why_not("gloo") and s.why_not("nccl")
        why = cannot or (why + " (no rank of a torch.distributed group answered within the dump's wait)")
    return {"no_collective": why}


def with_clause(summary: str, found: dict) -> str:
    """The stall's summary line with the clause before its `→ stalls/<n>/`."""
    if "collective" not in found:
        return summary
    head, arrow, tail = summary.rpartition(" → ")
    return f"{head}; {found['collective']}{arrow}{tail}" if arrow else f"{summary}; {found['collective']}"


def ray_runtime_env(run_dir: str, environ) -> dict:
    """What a Ray job's entry adds to the runtime env verl's driver starts Ray with (dotted keys under it): the
    recorder's variables the job does not set already (Ray refuses a variable set twice), and the listener started
    in every worker by Ray's worker_process_setup_hook (the stack hook's PYTHONPATH does not reach a Ray worker;
    vrun travels in the job's py_modules)."""
    out = {f"env_vars.{k}": v for k, v in recorder.env(run_dir).items() if k not in environ}
    out["worker_process_setup_hook"] = SETUP_HOOK
    return out


# the names the launchers call (node 0's and each node's collect, the local launch)
poke_nccl, collect_nccl = ask, gather

"""A rank's flight-recorder dump on request, in torch's JSON dump format: the process-wide recorder gloo writes to
(`torch._C._distributed_c10d._dump_fr_trace_json`), and a CUDA build's NCCL recorder (`_dump_nccl_trace_json`).

`start()` (called by the stack hook's sitecustomize at start-up, and on a Ray worker by Ray's
worker_process_setup_hook) starts one daemon thread when $VRUN_FR_DIR names a directory. Every POLL_S it reads
`<dir>/request` (a token the watchdog writes on a stall, vrun.launch.flightrec.ask); when the token is new and the
process is a rank (torch.distributed already imported by the process and initialized: nothing is imported here that
the process did not import itself), it writes the recorder's dump to `<dir>/rank_<global rank>` (NCCL's to
`<dir>/nccl_rank_<global rank>`; a temp file beside it, then a rename; never through a link). A rank blocked in a gloo collective answers: gloo's
wait releases the GIL. The JSON dump holds no stack traces (the pickled one's wait for the thread the rank is
blocked in), and is read back without unpickling anything.

The recorder's `pg_config` of a gloo group can come out empty (torch 2.13: name '' and no ranks), which leaves
torch's analyser unable to place an entry in its group; the dump's pg_config is then completed from
torch.distributed's own table of groups (name, description, global ranks), the rest of the dump left as torch wrote
it. A torch without either dump writes `rank_<r>.none` with the reason. Standard library only; nothing here raises.
"""
import os
import sys
import threading
import time

ENV = "VRUN_FR_DIR"
REQUEST = "request"
PREFIX = "rank_"
NCCL_PREFIX = "nccl_rank_"
POLL_S = 1.0

_started = {"pid": None}


def start():
    """The listener thread of this process (once per process; a forked child starts its own if it calls this)."""
    d = os.environ.get(ENV, "")
    if not d or _started["pid"] == os.getpid():
        return
    _started["pid"] = os.getpid()
    try:
        threading.Thread(target=_watch, args=(d,), name="vrun-frdump", daemon=True).start()
    except Exception:  # noqa: BLE001 - a process must start whatever happens here
        pass


def _token(d):
    try:
        with open(os.path.join(d, REQUEST), "rb") as f:
            return f.read(128)
    except OSError:
        return None


def _watch(d):
    seen = _token(d)  # a request older than this process is not for it
    while True:
        time.sleep(POLL_S)
        token = _token(d)
        if token is not None and token != seen:
            seen = token
            try:
                _dump(d)
            except Exception:  # noqa: BLE001
                pass


def _groups(dist):
    """{group name: {"name", "desc", "ranks"}} as torch.distributed knows its groups (global ranks)."""
    world = dist.distributed_c10d._world
    out = {}
    for pg, name in list(world.pg_names.items()):
        ranks = sorted(world.pg_group_ranks.get(pg, {}))
        out[str(name)] = {"name": str(name), "desc": str(getattr(pg, "group_desc", "undefined")),
                          "ranks": str(ranks)}
    return out


def _dump(d):
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    rank = dist.get_rank()
    c10d = sys.modules.get("torch._C._distributed_c10d")
    wrote = False
    for prefix, name in ((PREFIX, "_dump_fr_trace_json"), (NCCL_PREFIX, "_dump_nccl_trace_json")):
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        data = fn(includeCollectives=True, onlyActive=False)
        _write(d, f"{prefix}{rank}", _completed(data, dist))
        wrote = True
    if not wrote:
        torch = sys.modules.get("torch")
        _write(d, f"{PREFIX}{rank}.none", (f"torch {getattr(torch, '__version__', '?')} has no flight recorder "
                                           "dump to ask for (no _dump_fr_trace_json)\n").encode())


def _completed(data, dist):
    """The dump with its pg_config completed where an entry's group is missing from it."""
    import json

    try:
        dump = json.loads(data)
        config = dump.get("pg_config") or {}
        names = {str((e.get("process_group") or [""])[0]) for e in dump.get("entries") or []}
        if any(n not in config for n in names):
            dump["pg_config"] = {**{k: v for k, v in config.items() if k}, **_groups(dist)}
            return json.dumps(dump).encode()
    except Exception:  # noqa: BLE001 - the dump as torch wrote it
        pass
    return data if isinstance(data, bytes) else str(data).encode()


def _write(d, name, data):
    tmp = os.path.join(d, f".{name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(tmp, flags, 0o644)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(d, name))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass

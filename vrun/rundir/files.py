"""A run dir's JSON files read back and validated before anything uses them: a file that is missing, not UTF-8,
not JSON, not an object, of a newer format, or whose known fields have the wrong type is one line naming the file
and what is wrong (RunDirError). Standard library and vrun.core only."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from vrun.core import fs


class RunDirError(Exception):
    """Bad input: one line naming the thing, the value, why, and the fix."""

    def __init__(self, thing: str, value, why: str, fix: str):
        super().__init__(f"error: {thing}={value}: {why}; fix: {fix}")


# slurm_job.json's fields and types (spec: the sbatch job, what resubmit submits again with the run dir's plan.json)
SLURM_FIELDS = {"job_id": (str, int), "stdout": str, "stderr": str, "folder": str, "spec": dict, "mode": str,
                "attempt": int}
SLURM_REQUIRED = ("job_id", "folder")


# the most a run dir's JSON file holds (plan.json of a large plan is ~100 kB)
LIMIT = 16 << 20
# the most GPUs (and so nodes) a run dir may claim: the planner's own limit (vrun.planning.plan refuses a larger
# mesh), so a file claiming more was not written by it
MAX_WORLD = 1_000_000


class _NotFinite(ValueError):
    pass


def _no_constant(name: str):
    raise _NotFinite(name)


def read_object(path: Path, fields: dict, required: tuple = ()) -> dict:
    """The JSON object in `path`, its known fields type-checked; RunDirError naming the file otherwise. Read as the
    state dir's files are (vrun.core.fs.read_checked): a regular file of the user's own, at most LIMIT bytes, never a
    link, FIFO or device; NaN and Infinity, which the runner never writes, are refused."""
    raw, why = fs.read_checked(path, LIMIT, own=True, binary=True)
    if raw is None:
        if why == "no such file":
            raise RunDirError(str(path), "missing", "no such file", "plan the run again")
        raise RunDirError(str(path), "refused", why, "plan the run again into a dir of your own")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RunDirError(str(path), "not UTF-8", "not text the runner writes", "plan the run again") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except _NotFinite as e:
        raise RunDirError(str(path), str(e), "not a finite number (the runner never writes one)",
                          "plan the run again") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise RunDirError(str(path), "not JSON", f"{getattr(e, 'msg', 'too deeply nested')}", "plan the run "
                          "again") from None
    if not isinstance(data, dict):
        raise RunDirError(str(path), type(data).__name__, "not a JSON object", "plan the run again")
    for k in required:
        if k not in data:
            raise RunDirError(str(path), k, "a field the file must have is missing", "plan the run again")
    for k, t in fields.items():
        v = data.get(k)
        if v is not None and (not isinstance(v, t) or isinstance(v, bool) and t is int):
            raise RunDirError(f"{path} {k}", type(v).__name__, f"not a {_name(t)}", "plan the run again")
    return data


def optional_object(path: Path) -> Optional[dict]:
    """A run dir's optional JSON object (manifest.json, preflight.json): None when it is missing or anything
    read_object refuses."""
    try:
        return read_object(path, {})
    except RunDirError:
        return None


def _name(t) -> str:
    ts = t if isinstance(t, tuple) else (t,)
    return " or ".join({dict: "JSON object", list: "JSON list", str: "string", int: "integer"}[x] for x in ts)


def slurm_job(d: Path) -> Optional[dict]:
    """slurm_job.json, validated; None when the run was never submitted."""
    f = d / "slurm_job.json"
    if not fs.exists(f) and not fs.is_link(f):
        return None
    data = read_object(f, SLURM_FIELDS, SLURM_REQUIRED)
    from vrun.rundir import records as rundir

    if not rundir.job_id_ok(data["job_id"]):
        raise RunDirError(f"{f} job_id", "<not a job id>", "not a SLURM job id (a positive whole number)",
                          "submit the run again")
    nodes = (data.get("spec") or {}).get("nodes", 1)
    if not count_ok(nodes):
        raise RunDirError(f"{f} spec.nodes", str(nodes)[:40], f"not a node count (an integer 1–{MAX_WORLD:,})",
                          "submit the run again")
    return data


def count_ok(n) -> bool:
    """A count of nodes or GPUs a run dir may hold: an integer from 1 to MAX_WORLD."""
    return isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_WORLD

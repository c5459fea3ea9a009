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


def read_object(path: Path, fields: dict, required: tuple = ()) -> dict:
    """The JSON object in `path`, its known fields type-checked; RunDirError naming the file otherwise."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise RunDirError(str(path), "missing", "no such file", "plan the run again") from None
    except OSError as e:
        raise RunDirError(str(path), "unreadable", e.strerror or str(e), "check the file's permissions") from None
    except UnicodeDecodeError:
        raise RunDirError(str(path), "not UTF-8", "not text the runner writes", "plan the run again") from None
    try:
        data = json.loads(text)
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
    return data

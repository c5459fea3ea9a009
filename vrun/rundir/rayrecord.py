"""A cluster=ray run's record of its job (ray_job.json): what identifies the job, never anything to run. Its address
must be a dashboard URL and its job id Ray's grammar (`raysubmit_<letters and digits>`, or the id this project
chooses, `vrun-<run id>-<attempt>`, which must name this run); anything else makes the record refused in one line.
Standard library and vrun.core only (vrun.rundir.state reads it for every run)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

from vrun.core import fs, remote

RAY_JOB = "ray_job.json"
SUBMISSION = re.compile(r"raysubmit_[A-Za-z0-9]{1,64}|vrun-([0-9a-f]{20})-(0|[1-9][0-9]{0,5})")


def submission_id(run_id: str, attempt: int) -> str:
    """The job's id as this project chooses it: the run's id and the attempt (a job is recognisable as its run's)."""
    return f"vrun-{run_id}-{attempt}"


def job_id_problem(job_id, run_id: str) -> str:
    """Why `job_id` read back is not this run's job id ("" when it is)."""
    if not isinstance(job_id, str):
        return "not a string"
    m = SUBMISSION.fullmatch(job_id)
    if not m:
        return "not a Ray submission id (raysubmit_<letters and digits>, or vrun-<run id>-<attempt>)"
    if m.group(1) and m.group(1) != run_id:
        return f"the id of another run's job (run id {m.group(1)}, this run's is {run_id})"
    return ""


def load(run_dir) -> tuple[Optional[dict], str]:
    """({"address", "job_id"}, "") from ray_job.json; (None, "") when there is none; (None, one line) when it is
    refused (not a regular file of the user's own, not JSON, an address or job id of no dashboard / no job)."""
    from vrun.rundir.records import run_id

    path = Path(run_dir) / RAY_JOB
    if not fs.exists(path):
        return None, ""
    text, why = fs.read_checked(path, 1 << 20, own=True)
    if text is None:
        return None, f"error: {path}: {why}; fix: remove it, then python -m vrun resubmit {quoted(run_dir)}"
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return None, f"error: {path}: not a JSON object; fix: remove it, then python -m vrun resubmit {quoted(run_dir)}"
    try:
        address = str(remote.url_of(data.get("address")))
    except ValueError as e:
        return None, (f"error: {path} address={remote.shown(data.get('address'), 80)}: {e}; fix: remove "
                      f"{RAY_JOB}, then python -m vrun resubmit {quoted(run_dir)}")
    why = job_id_problem(data.get("job_id"), run_id(str(run_dir)))
    if why:
        return None, (f"error: {path} job_id={remote.shown(data.get('job_id'), 80)}: {why}: nothing is asked of the "
                      f"cluster about it; fix: remove {RAY_JOB}, then python -m vrun resubmit {quoted(run_dir)}")
    return {"address": address, "job_id": data["job_id"]}, ""


def quoted(path) -> str:
    import shlex

    return shlex.quote(str(path))



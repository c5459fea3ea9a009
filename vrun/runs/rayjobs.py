"""The runs verbs on a cluster=ray run (a run dir holding ray_job.json, vrun.launch.rayjobs): status, logs (-f),
cancel and resubmit through Ray's Job Submission API, at the address and job id the run dir keeps. Every request
carries cluster.ray.dashboard_timeout_s (the plan's, else 15 s): a lost dashboard is one line naming it, exit 2.
`python -m vrun` hands these verbs here when the run dir is a Ray job's (vrun.runs.cli.main); everything else is
the other clusters' code, untouched."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from vrun.core import fs
from vrun.launch import rayjobs
from vrun.runs.common import Usage

VERBS = ("status", "logs", "cancel", "resubmit")
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


def job_of(path: str) -> Optional[tuple]:
    """(run dir, ray_job.json) where `path` is one cluster=ray run dir; None otherwise."""
    d = Path(path)
    job = rayjobs.load(d) if fs.is_dir(d) else None
    return (d, job) if job and job.get("job_id") and job.get("address") else None


def timeout_of(d: Path) -> float:
    """The plan's cluster.ray.dashboard_timeout_s, read through the bounded reader; 15 s where plan.json does not say
    a finite one within the plan's own bounds (0, 600]."""
    import math

    text, _ = fs.read_checked(d / "plan.json", 16 << 20, own=True)
    try:
        t = float(json.loads(text)["cluster_group"]["ray"]["dashboard_timeout_s"])
    except (ValueError, KeyError, TypeError):
        return 15.0
    return t if math.isfinite(t) and 0 < t <= 600 else 15.0


# Ray's job states → the runs' own words
STATES = {"PENDING": "pending", "RUNNING": "running", "SUCCEEDED": "completed", "FAILED": "failed",
          "STOPPED": "cancelled"}
# `runs` asks each dashboard once, at most this long (a listing never waits a dashboard's whole timeout)
LIST_TIMEOUT_S = 5.0


def refresh(runs: list) -> None:
    """cluster=ray rows of `runs`: each job's state from its dashboard (one request per address, GET /api/jobs/,
    bounded in time and size); a dashboard that does not answer leaves the row's state and says why."""
    by_address: dict = {}
    for r in runs:
        found = job_of(str(r.dir))
        if found:
            by_address.setdefault(found[1]["address"], []).append((r, found[1]))
    for address, rows in by_address.items():
        try:
            listed = rayjobs.get_json(address, "/api/jobs/", min(LIST_TIMEOUT_S, timeout_of(rows[0][0].dir)))
        except rayjobs.DashboardError:
            for r, _ in rows:
                r.reason = "Ray dashboard unreachable"
            continue
        jobs = {j.get("submission_id") or j.get("job_id"): j for j in (listed if isinstance(listed, list) else [])
                if isinstance(j, dict)}
        for r, job in rows:
            j = jobs.get(job["job_id"])
            status = str(j.get("status")) if j else ""
            if status in STATES:
                message = str(j.get("message") or "")[:120]
                r.state = STATES[status]
                r.phase = f"ray job {status}" + (f": {message}" if message else "")


def dispatch(a) -> Optional[int]:
    """The verb's exit code when it names a cluster=ray run dir, None to leave it to the other clusters."""
    if a.verb not in VERBS:
        return None
    paths = a.runs if a.verb == "cancel" else [a.run]
    found = [job_of(p) for p in paths]
    if not any(found):
        return None
    if not all(found):
        raise Usage(f"error: runs={' '.join(paths)}: cluster=ray runs mixed with others; fix: cancel them apart")
    try:
        return {"status": status, "logs": logs, "cancel": cancel, "resubmit": resubmit}[a.verb](a, found)
    except rayjobs.DashboardError as e:
        raise Usage(f"error: cluster.ray.address={found[0][1]['address']}: {e}; fix: check that the cluster is up "
                    "and its dashboard reachable from here, then run the verb again") from None


def _client(d: Path, job: dict):
    return rayjobs.client(job["address"], timeout_of(d))


def status(a, found) -> int:
    (d, job), = found
    info = _client(d, job).get_job_info(job["job_id"])
    row = {"run": str(d), "cluster": "ray", "address": job["address"], "job_id": job["job_id"],
           "state": str(info.status.value if hasattr(info.status, "value") else info.status),
           "message": info.message, "start_time": info.start_time, "end_time": info.end_time}
    if getattr(a, "json", False):
        print(json.dumps(row, indent=1))
    else:
        print(f"run     {d}\nray job {job['job_id']} at {job['address']}: {row['state']}"
              f"{' — ' + info.message if info.message else ''}")
    return 0


def logs(a, found) -> int:
    (d, job), = found
    c = _client(d, job)
    if not getattr(a, "follow", False):
        sys.stdout.write(c.get_job_logs(job["job_id"]))
        return 0
    import asyncio

    async def tail() -> None:
        async for chunk in c.tail_job_logs(job["job_id"]):
            sys.stdout.write(chunk)
            sys.stdout.flush()

    asyncio.run(tail())
    return 0


def cancel(a, found) -> int:
    for d, job in found:
        c = _client(d, job)
        state = str(c.get_job_status(job["job_id"]).value)
        if state in ENDED:
            raise Usage(f"error: run={d}: ray job {job['job_id']} has ended ({state}); fix: nothing to cancel "
                        f"(python -m vrun resubmit {d} runs it again)")
        c.stop_job(job["job_id"])
        from vrun.rundir import records

        records.record(str(d), "cancel_requested", attempt=0, job_id=job["job_id"])
        print(f"stopping ray job {job['job_id']} ({d})", flush=True)
    return 0


def resubmit(a, found) -> int:
    """The same run dir submitted again as a new job (the plan as written; verl resumes from its checkpoints)."""
    (d, job), = found
    c = _client(d, job)
    state = str(c.get_job_status(job["job_id"]).value)
    if state not in ENDED:
        raise Usage(f"error: run={d}: ray job {job['job_id']} is {state}; fix: python -m vrun cancel {d} first")
    from vrun.core import writer
    from vrun.rundir import records

    new = c.submit_job(entrypoint=job["entrypoint"], runtime_env=job["runtime_env"],
                       metadata={"vrun_run_dir": str(d), "vrun_replaces": job["job_id"]})
    writer.write_text(d / rayjobs.RAY_JOB, json.dumps({**job, "job_id": new, "replaces": job["job_id"]}, indent=1)
                      + "\n", root=str(d))
    records.record(str(d), "submitted", attempt=0, cluster="ray", ray_job=new, replaces=job["job_id"])
    print(f"submitted {new} to {job['address']} (replacing {job['job_id']})", flush=True)
    return 0

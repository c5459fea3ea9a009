"""A cluster=ray run's job: its record in the run dir (vrun.rundir.rayrecord: what identifies it, nothing to run) and
what the cluster's dashboard says of it, through Ray's Job REST routes (the installed Ray's
dashboard/modules/job/job_head.py: GET /api/jobs/, GET /api/jobs/{id}, GET /api/jobs/{id}/logs,
POST /api/jobs/{id}/stop), each request bounded in time and size by vrun.core.remote and its answer's shape checked.

The job to run is always rebuilt from plan.json, never read from the record.

What the runs verbs read of a job (`follow`): its state in the run's own words, `lost` when the cluster no longer
knows it (a head restarted: the job history lives in the head), a run cancelled with `vrun cancel` kept cancelled
whatever the dashboard says, its elapsed time, and the first decisive line of a failed job's log. What the verbs
learn from the dashboard is shown, never stored: the run dir holds only what the job's entry wrote of its own run
(vrun.launch.rayjob_own: its start, its end, its log). Standard library and vrun.core only."""
from __future__ import annotations

import os
from typing import Optional
from urllib.parse import quote

from vrun.core import remote
from vrun.rundir.rayrecord import quoted

# Ray's job states → the runs' own words
STATES = {"PENDING": "pending", "RUNNING": "running", "SUCCEEDED": "completed", "FAILED": "failed",
          "STOPPED": "cancelled"}
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
DEFAULT_TIMEOUT_S = 15.0
# the most of a job's log its entry keeps in the run dir (job.log: what a lost job's log is read from)
LOG_KEEP = 8 << 20


def timeout_of(plan) -> float:
    """The plan's cluster.ray.dashboard_timeout_s within the plan's own bounds (0, 600]; 15 s otherwise."""
    import math

    try:
        t = float(plan.cluster_group["ray"]["dashboard_timeout_s"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return DEFAULT_TIMEOUT_S
    return t if math.isfinite(t) and 0 < t <= 600 else DEFAULT_TIMEOUT_S


# ==================================================================== the dashboard's Job routes
def headers() -> dict:
    """Ray's token header where the cluster uses token authentication (RAY_AUTH_MODE=token), as Ray's own client."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return {}
    try:
        from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled
    except ImportError:
        return {}
    try:
        return dict(get_auth_headers_if_auth_enabled({}))
    except Exception:  # noqa: BLE001 - no token here: the dashboard answers 401, said as such
        return {}


def _job_path(job_id: str, tail: str = "") -> str:
    return f"/api/jobs/{quote(job_id, safe='')}{tail}"


def _job(entry, source: str) -> dict:
    """One job of the dashboard's answer with the fields read checked."""
    if not isinstance(entry, dict):
        raise remote.RemoteError(source, "malformed", "answered a job that is not a JSON object")
    for key, types in (("submission_id", (str,)), ("status", (str,)), ("message", (str,)), ("metadata", (dict,)),
                       ("start_time", (int, float)), ("end_time", (int, float))):
        remote.need(entry, key, types, source, optional=True)
    return entry


def jobs(address: str, timeout: float) -> dict:
    """submission id → job, every submitted job the cluster knows (GET /api/jobs/)."""
    a = remote.request(address, "/api/jobs/", timeout, headers=headers())
    listed = a.json(list)
    out = {}
    for entry in listed:
        j = _job(entry, a.source)
        if j.get("submission_id"):
            out[j["submission_id"]] = j
    return out


def info(address: str, job_id: str, timeout: float) -> Optional[dict]:
    """The job (GET /api/jobs/{id}), None when the cluster does not know it (404)."""
    try:
        a = remote.request(address, _job_path(job_id), timeout, headers=headers())
    except remote.RemoteError as e:
        if e.kind == "http" and e.status == 404:
            return None
        raise
    j = _job(a.json(dict), a.source)
    if j.get("submission_id") not in (None, job_id):
        raise remote.RemoteError(a.source, "malformed", f"answered job {remote.shown(j['submission_id'], 60)} for "
                                 f"job {job_id}")
    return j


def logs(address: str, job_id: str, timeout: float) -> str:
    """The job's driver log (GET /api/jobs/{id}/logs: {"logs": text})."""
    a = remote.request(address, _job_path(job_id, "/logs"), timeout, headers=headers())
    return remote.need(a.json(dict), "logs", (str,), a.source)


def stop(address: str, job_id: str, timeout: float) -> bool:
    """Ask the cluster to stop the job (POST /api/jobs/{id}/stop: {"stopped": bool})."""
    a = remote.request(address, _job_path(job_id, "/stop"), timeout, method="POST", body=b"", headers=headers())
    return bool(remote.need(a.json(dict), "stopped", (bool,), a.source))


def not_this_runs(job: dict, run_dir, run_id: str) -> str:
    """Why the job the cluster reports is not this run's ("" when it is): its metadata, set at submission, must
    name this run dir and this run's id."""
    meta = job.get("metadata") or {}
    have_dir, have_id = meta.get("vrun_run_dir"), meta.get("vrun_run_id")
    if have_id != run_id or have_dir != str(run_dir):
        return (f"the cluster's job belongs to another run (its metadata: vrun_run_dir="
                f"{remote.shown(have_dir, 120)!s}, vrun_run_id={remote.shown(have_id, 40)!s})")
    return ""


# ==================================================================== a run's state from its job
def lost_words(run, address: str, job_id: str) -> str:
    return (f"lost: the cluster at {address} no longer knows job {job_id} (its head restarted, or the job history "
            f"was cleared); python -m vrun resubmit {quoted(run.dir)} submits it again, resuming from the last whole "
            "checkpoint")


# `runs` asks each dashboard at most this long (a listing never waits a dashboard's whole timeout)
LIST_TIMEOUT_S = 5.0


def refresh(runs: list, with_logs: str = "active", budget_s: float = 30.0) -> None:
    """Every cluster=ray run's job from its dashboard: one list request per address (GET /api/jobs/), then, for
    the runs `with_logs` selects ("all", "active": running or failed, "none"), the job's log (run.ray_log: its
    steps, its cause; held in memory, never stored). All within budget_s; a dashboard that gives no word leaves the
    run's state as last recorded and says why (run.ray_error, run.reason)."""
    import time

    from vrun.rundir import state

    deadline = time.monotonic() + budget_s
    by_address: dict = {}
    for r in runs:
        if r.ray_problem:
            r.ray_error = r.reason = r.ray_problem
        elif r.ray and r.attempts:
            by_address.setdefault(r.ray["address"], []).append(r)
    for address, rows in by_address.items():
        left = deadline - time.monotonic()
        t = min(timeout_of(rows[0].plan), max(left, 0.5), LIST_TIMEOUT_S if len(runs) > 1 else 600)
        try:
            known = jobs(address, t)
        except remote.RemoteError as e:
            for r in rows:
                r.ray_error, r.ray_error_kind = f"the Ray dashboard at {address} {e.detail}", e.kind
                r.reason = f"dashboard unreachable: {e.kind}"
            continue
        for r in rows:
            job_id = r.attempts[-1].job_id or r.ray["job_id"]
            job = known.get(job_id)
            text = None
            want = with_logs == "all" or with_logs == "active" and str((job or {}).get("status")) in ("RUNNING", "FAILED")
            if job is not None and want and time.monotonic() < deadline:
                try:
                    text = logs(address, job_id, min(timeout_of(r.plan), max(deadline - time.monotonic(), 0.5)))
                    r.ray_log = text
                except remote.RemoteError:
                    text = None
            follow(r, job, address, text)
            if r.state not in state.ACTIVE and r.state != "lost":
                r.reason = ""


def follow(run, job: Optional[dict], address: str, log_text: Optional[str] = None) -> None:
    """Put the dashboard's word on the job (`job`: its entry, None when the cluster does not know it) over what the
    run's own lines say of its current attempt. The run's own `cancelled` line wins; a job the cluster does not
    know is lost unless the run's lines say it ended. log_text: the job's log, for a failure's cause and steps."""
    from vrun.rundir import state

    cur = run.attempts[-1] if run.attempts else None
    if cur is None:
        return
    if job is None:
        if cur.state in state.ACTIVE:
            cur.state, cur.phase = "lost", lost_words(run, address, run.ray["job_id"])
            cur.end = cur.phase
        state.settle(run)
        return
    status = str(job.get("status") or "")
    message = remote.shown(job.get("message") or "", 200)
    t0, t1 = job.get("start_time"), job.get("end_time")
    if isinstance(t0, (int, float)) and t0 > 0 and cur.started is None:
        cur.started = t0 / 1000.0
    if isinstance(t1, (int, float)) and t1 > 0 and status in ENDED:
        cur.ended = t1 / 1000.0
    if cur.state == "cancelled":  # `vrun cancel` recorded it: cancelled whatever the dashboard answers
        state.settle(run)
        return
    word = STATES.get(status)
    if word is None:
        state.settle(run)
        return
    cur.state = word
    if word == "pending":
        cur.phase = "pending" + (f" ({message})" if message else "")
    elif word == "running":
        from vrun.rundir import joblog

        steps = joblog.parse((log_text or "").splitlines()[-20000:]).steps
        cur.phase = f"running: step {max(steps)}" if steps else "running (ray job RUNNING)"
    elif word == "completed":
        cur.phase = "completed (ray job SUCCEEDED)"
    elif word == "cancelled":
        cur.phase = "cancelled outside vrun (ray job stop, or the dashboard) (ray job STOPPED)"
    else:
        from vrun.rundir.cause import decisive_line

        cause = decisive_line((log_text or "").splitlines()[-20000:]) if log_text else None
        cur.failure = {"node": "the job", "error": cause or message or "ray job FAILED"}
        cur.phase = f"failed: {cur.failure['error']}"
    if word not in state.ACTIVE:
        cur.end = cur.phase
    state.settle(run)


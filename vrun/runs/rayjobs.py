"""The runs verbs on a cluster=ray run (a run dir whose plan is cluster=ray, with its job in ray_job.json): the job's
state, logs (-f), cancel and resubmit through the dashboard's Job routes (vrun.rundir.rayjob: every request one
deadline, cluster.ray.dashboard_timeout_s, and a size bound; every answer's shape checked).

- ray_job.json is a record: the job id and address are validated, and nothing to run is read from it. `resubmit`
  rebuilds the job from plan.json (vrun.launch.rayjobs.submit), as a SLURM resubmit does.
- `cancel` proves the job is the run's before stopping it: the job's metadata as the cluster reports it names this
  run dir and run id. A job the cluster no longer knows (lost) has nothing to stop.
- A dashboard that gives no word is one line: the address, what came back, the run's last known state, the fix.
`status` and `runs` are vrun.runs.listing's, with the dashboard's word put over the run's own lines."""
from __future__ import annotations

import shlex
import sys
import time

from vrun.core import remote
from vrun.rundir import rayjob, state
from vrun.runs.common import Usage

DASHBOARD_FORM = "http://<head>:8265"


def q(path) -> str:
    return shlex.quote(str(path))


def attempt_no(r: state.Run) -> int:
    """The current attempt's number as its `submitted` line records it (the job's own lines carry the same)."""
    cur = r.attempts[-1] if r.attempts else None
    n = next((e.get("attempt") for e in (cur.events if cur else []) if e["event"] == "submitted"), None)
    return n if isinstance(n, int) and not isinstance(n, bool) else r.attempt


def refused_record(r: state.Run, verb: str) -> None:
    """ray_job.json refused, or missing on a submitted run: one line, nothing asked of any cluster."""
    if r.ray_problem:
        raise Usage(r.ray_problem)
    if r.ray is None:
        raise Usage(f"error: run={r.dir}: planned for cluster=ray but never submitted (no ray_job.json); fix: "
                    f"submit it with the command that planned it and mode=train (manifest.json holds it)"
                    if verb != "resubmit" else
                    f"error: run={r.dir}: never submitted (no ray_job.json); fix: submit it with mode=train")


def unreachable(r: state.Run, what: str) -> Usage:
    """The dashboard gave no word (r.ray_error): one line with the run's last known state and the fix its answer
    calls for."""
    address, job = r.ray["address"], r.job_id or r.ray["job_id"]
    fix = {"too_large": f"read the job on the cluster itself (ray job logs --address {q(address)} {q(job)} | tail)",
           "http": "check the dashboard's own log on the head (dashboard.log under Ray's temp dir), then run the verb "
                   "again",
           "malformed": f"check that cluster.ray.address is the cluster's dashboard ({DASHBOARD_FORM})",
           "not_http": f"check that cluster.ray.address is the cluster's dashboard ({DASHBOARD_FORM})"}.get(
        r.ray_error_kind, "check that the cluster is up and its dashboard reachable from here, then run the verb "
                          "again")
    return Usage(f"error: cluster.ray.address={address}: {r.ray_error}; {what}; the run's last known state: "
                 f"{state.describe(r)}; fix: {fix}")


def failed(r: state.Run, e: remote.RemoteError, what: str) -> Usage:
    r.ray_error, r.ray_error_kind = f"the Ray dashboard at {r.ray['address']} {e.detail}", e.kind
    return unreachable(r, what)


def status_lines(r: state.Run) -> list:
    """`status`'s Ray lines: the job, where, what the dashboard said."""
    if not r.on_ray:
        return []
    if r.ray is None:
        return [f"ray job  none recorded{': ' + r.ray_problem if r.ray_problem else ''}"]
    out = [f"ray job  {r.job_id or r.ray['job_id']} at {r.ray['address']} (attempt {r.attempt}, "
           f"{len(r.attempts)} submission(s))"]
    if r.ray_error:
        out.append(f"note     {r.ray_error}: the state above is the run's last known one")
    return out


# ==================================================================== cancel
def cancel_one(r: state.Run) -> None:
    """Stop the run's current job once the cluster's record of it proves it is this run's; record `cancelled`."""
    from vrun.rundir import records
    from vrun.rundir.records import run_id

    refused_record(r, "cancel")
    address, job_id = r.ray["address"], r.job_id or r.ray["job_id"]
    t = rayjob.timeout_of(r.plan)
    try:
        job = rayjob.info(address, job_id, t)
    except remote.RemoteError as e:
        raise failed(r, e, "nothing stopped") from None
    if job is None:
        raise Usage(f"error: run={r.dir}: {rayjob.lost_words(r, address, job_id)}: nothing to stop; fix: "
                    f"python -m vrun resubmit {q(r.dir)} (or leave it)")
    why = rayjob.not_this_runs(job, r.dir, run_id(str(r.dir)))
    if why:
        raise Usage(f"error: run={r.dir}: job {job_id} at {address}: {why}: nothing stopped; fix: check it with "
                    f"ray job status --address {q(address)} {q(job_id)}, and stop it by hand only if it is this run's")
    if str(job.get("status")) in rayjob.ENDED:
        raise Usage(f"error: run={r.dir}: ray job {job_id} has ended ({remote.shown(job.get('status'), 20)}); "
                    f"nothing to cancel; fix: python -m vrun resubmit {q(r.dir)} runs it again")
    try:
        rayjob.stop(address, job_id, t)
    except remote.RemoteError as e:
        raise failed(r, e, "the stop may not have reached the cluster") from None
    records.record(str(r.dir), "cancelled", attempt=attempt_no(r), ray_job=job_id)
    print(f"stopping ray job {job_id}: {r.dir}", flush=True)


def stopped(r: state.Run) -> bool:
    """Whether the cluster says the run's job is no longer running (or no longer knows it); records how it ended."""
    try:
        job = rayjob.info(r.ray["address"], r.job_id or r.ray["job_id"], rayjob.timeout_of(r.plan))
    except remote.RemoteError:
        return False
    if job is not None and str(job.get("status")) not in rayjob.ENDED:
        return False
    if job is not None:
        record_end(r, job)
    return True


def record_end(r: state.Run, job: dict) -> None:
    """How the current attempt's job ended, in the run dir (the cluster may forget it): `ray_ended`."""
    from vrun.rundir import records

    t0, t1 = job.get("start_time"), job.get("end_time")
    word = rayjob.STATES.get(str(job.get("status")))
    n = attempt_no(r)
    if any(e["event"] == "ray_ended" and e.get("attempt") == n for e in r.events) or word is None:
        return
    records.record(str(r.dir), "ray_ended", attempt=n, ray_job=r.job_id, state=word,
                   **({"started": t0 / 1000.0, "ended": t1 / 1000.0} if all(
                       isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in (t0, t1)) else {}))


# ==================================================================== resubmit
def resubmit(r: state.Run, detach: bool) -> int:
    """The plan's job submitted again, same run dir (verl resumes from the last whole checkpoint; the same tracker
    id: the job's env carries it), to the plan's address (`auto`: the environment's, else the last job's)."""
    import os

    from vrun.core.problems import PlanError
    from vrun.launch import rayjobs
    from vrun.rundir import lock
    from vrun.rundir.record import PlanRecord

    if r.ray_problem:
        raise Usage(r.ray_problem)
    if r.active and r.ray is not None:
        if r.ray_error:
            raise unreachable(r, "nothing submitted (its job may still run)")
        raise Usage(f"error: run={r.dir}: ray job {r.job_id} is still {state.describe(r)}; fix: python -m vrun "
                    f"cancel {q(r.dir)} first, or wait for it")
    held = lock.take(str(r.dir), "run", create=False)
    if held is not None:
        raise Usage(PlanError([held]).args[0])
    plan = PlanRecord.load(r.dir)
    if plan.cluster != "ray":
        raise Usage(f"error: run={r.dir}: planned for cluster={plan.cluster}, not ray; fix: resubmit it there")
    plan = _at(plan, r.dir)
    given = str((plan.cluster_group.get("ray") or {}).get("address") or "auto")
    try:
        if given == "auto" and not (os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")) \
                and r.ray is not None:
            url = r.ray["address"]
            print(f"note: cluster.ray.address=auto and neither RAY_API_SERVER_ADDRESS nor RAY_ADDRESS is set: "
                  f"submitting to its last job's dashboard, {url}", file=sys.stderr)
        else:
            url = rayjobs.dashboard(given)
        if r.ray is not None and r.state not in ("lost",) and r.attempts:
            try:  # how the last attempt ended, before the next one starts
                job = rayjob.info(r.ray["address"], r.job_id or r.ray["job_id"], rayjob.timeout_of(r.plan))
                if job is not None:
                    record_end(r, job)
            except remote.RemoteError:
                pass
        last = (r.ray or {}).get("job_id")
        job = rayjobs.submit(plan, url, rayjob.timeout_of(plan), replaces=last if isinstance(last, str) else None)
    except rayjobs.DashboardError as e:
        raise Usage(f"error: cluster.ray.address={given}: {e}; nothing submitted; fix: check that the cluster is up "
                    f"and its dashboard reachable, then python -m vrun resubmit {q(r.dir)}") from None
    except ValueError as e:
        raise Usage(f"error: run={r.dir} plan.json argv: {e}; fix: plan the run again") from None
    finally:
        lock.release_all()
    before = f" (after {state.describe(r)})" if r.attempts else ""
    print(f"submitted {job} to {url}{before}: {r.dir}; python -m vrun status {q(r.dir)}; python -m vrun logs "
          f"{q(r.dir)}; python -m vrun cancel {q(r.dir)}", flush=True)
    if not detach:
        from vrun.launch import raywait

        raywait.until_ended([str(r.dir)])
    return 0


def _at(plan, d):
    """The plan record with its run dir where it is read from (a run dir moved keeps its own files)."""
    import dataclasses

    return dataclasses.replace(plan, run_dir=str(d))


# ==================================================================== logs
FOLLOW_POLL_S = 2.0


def logs(r: state.Run, follow: bool) -> int:
    """The job's log from the dashboard (each read bounded); -f reads it again every FOLLOW_POLL_S and prints what
    is new until the job ends (Ctrl-C: stops following). A lost job's log as its entry kept it (job.log) is printed,
    said so. Nothing is written."""
    from vrun.core import fs
    from vrun.core.text import visible

    refused_record(r, "logs")
    address, job_id = r.ray["address"], r.job_id or r.ray["job_id"]
    tty = sys.stdout.isatty()
    printed = 0
    try:
        while True:
            try:
                text = rayjob.logs(address, job_id, rayjob.timeout_of(r.plan))
            except remote.RemoteError as e:
                if e.kind == "http" and e.status == 404:
                    kept, _ = fs.read_checked(r.dir / "job.log", rayjob.LOG_KEEP + 1, own=True, tail=True)
                    print(f"note: {rayjob.lost_words(r, address, job_id)}; its log as last read (job.log):",
                          file=sys.stderr)
                    for line in (kept or "").splitlines():
                        print(visible(line, colours=tty))
                    return 0
                raise failed(r, e, "no log read") from None
            new = text[printed:] if len(text) >= printed else text
            lines = new.split("\n")
            rest = lines.pop()  # a line not ended yet (-f: printed once it is); the end of the log otherwise
            for line in lines + ([rest] if rest and not follow else []):
                print(visible(line, colours=tty), flush=follow)
            printed = len(text) - (len(rest) if follow else 0)
            if not follow:
                return 0
            r = state.load(r.dir)
            rayjob.refresh([r], with_logs="none", budget_s=rayjob.timeout_of(r.plan))
            if not r.active and not r.ray_error:
                print(f"-- ray job {job_id}: {state.describe(r)}", flush=True)
                return 0
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        return 0

"""cluster=ray: the planned points submitted to a standing Ray cluster through Ray's Job Submission API
(hydra/launcher=vrun_ray calls `launch`).

The address is the cluster's dashboard (`cluster.ray.address=http://head:8265`, an IPv6 head as `http://[::1]:8265`,
or `auto`: RAY_API_SERVER_ADDRESS, else RAY_ADDRESS, the order of Ray's own job CLI). The GCS address `ray start`
prints for joining (`<head>:6379`) answers in binary: it is refused in one line naming the dashboard's form. Before
anything is submitted every point gets the verdict the other clusters give (the plan's checks, and for preflight and
train alike every check train makes before submitting: `cluster_checks`) and the cluster's real shape read from the
dashboard: alive nodes and their GPUs (total and free), the GPU type where Ray exposes it (an `accelerator_type:*`
resource), and the cluster's Ray and Python versions, which must be this environment's (the plan's stack). mode=plan
reads the shape too where the address answers (a mesh the cluster cannot hold is refused), and plans offline with a
warning where it does not. A refusal is one line naming the cluster's figure and the plan's. The dashboard and the
cluster's shape are read in vrun.launch.ray_dashboard (its names importable from here).

The job runs the same hand-off as the other clusters: `python -m vrun.launch.entry ppo --config verl_config.yaml`
(stack check first, then verl's run_ppo), with plan.json and verl_config.yaml as the job's working_dir, the vrun
package in py_modules, and the plan's environment in env_vars. Secrets pass by name only (--pass-env): their values
are never put into the runtime env; the cluster's own environment must hold them. The driver joins the cluster it
runs on (ray_kwargs.ray_init.address=auto). The job's id is the run's (`vrun-<run id>-<attempt>`), its metadata names
the run dir and run id (what `cancel` checks before stopping it); <run dir>/ray_job.json keeps only the address and
the id. Every request, the client's own version check included, goes through vrun.core.remote: one deadline on the
whole request (cluster.ray.dashboard_timeout_s), a size bound, the answer's shape checked.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Optional

from vrun.core import remote
from vrun.core.problems import Problem
from vrun.launch.ray_dashboard import (  # noqa: F401 - the dashboard and the cluster's shape; importable from here
    ADDRESS_KEY, DASHBOARD_FORM, DashboardError, Shape, dashboard, get_json, here, read_shape, shape_problems,
    used_gpus, why)
from vrun.rundir.rayrecord import RAY_JOB, submission_id

# mode=plan waits at most this long for the cluster's shape (it plans offline past it, with a warning)
PLAN_TIMEOUT_S = 5.0
# ==================================================================== the job
ENTRY = ("-m", "vrun.launch.entry")


def entrypoint(plan) -> str:
    """The plan's argv as the job runs it: the cluster's python, the config beside plan.json in the working_dir.
    Only the project's own entry (`python -m vrun.launch.entry ...`): ValueError for any other argv."""
    argv = ["python"] + list(plan.argv[1:])
    if tuple(argv[1:3]) != ENTRY or "--config" not in argv[:-1]:
        raise ValueError(f"the plan's argv does not run the project's entry (python {' '.join(ENTRY)} ...)")
    i = argv.index("--config")
    argv[i + 1] = "verl_config.yaml"
    return " ".join(shlex.quote(a) for a in argv)


def job_env(plan) -> dict:
    """A Ray job's env_vars: the plan's environment (secrets are not in it: they pass by name; ROCR/HIP, which the
    plan unsets, are the cluster's), the run's id, the experiment tracker's run id (a job submitted again with
    run.resume=true continues the same tracker run, as a requeued SLURM job does; unless the plan sets it), and the
    merge verl's own ray.init needs inside a job."""
    from vrun.launch.environment import tracker_env
    from vrun.rundir.records import run_id

    # PYTHONPATH names this checkout's paths, which do not travel
    env = {k: str(v) for k, v in plan.env.items() if k != "PYTHONPATH"}
    rid = run_id(plan.run_dir)
    env["VRUN_RUN_ID"] = rid
    env.update({k: v for k, v in tracker_env(rid).items() if k not in env})
    # verl's run_ppo calls ray.init with the config's runtime env (the same variables): inside a job Ray refuses
    # the repeated keys unless told to merge them
    env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] = "1"
    return env


# what the job reads from its working_dir: the plan and verl's config (checkpoints, logs and the rest stay in the
# run dir, which the job reaches by its absolute path: they are never uploaded)
JOB_FILES = ("plan.json", "verl_config.yaml")


def runtime_env(plan, working_dir: str, attempt: int = 0) -> dict:
    """working_dir: a folder holding the run's JOB_FILES; py_modules: this vrun (PYTHONPATH does not travel);
    env_vars: job_env, and the attempt (the job's own lines join it)."""
    import vrun

    return {"working_dir": str(working_dir), "py_modules": [str(Path(vrun.__file__).parent)],
            "env_vars": {**job_env(plan), "VRUN_ATTEMPT": str(attempt)}}


class _Answer:
    """What Ray's client reads of an answer (status, text, JSON), from vrun.core.remote's bounded one."""

    def __init__(self, a: remote.Answer):
        self.status_code, self.content = a.status, a.body
        self.text = a.body.decode("utf-8", errors="replace")

    def json(self):
        return json.loads(self.text)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise DashboardError(f"answered HTTP {self.status_code}", "http")


def client(url: str, timeout: float):
    """Ray's JobSubmissionClient with every request it makes — the version check of its constructor, the package
    uploads, the submission — sent through vrun.core.remote (one deadline each: `timeout`)."""
    from ray.job_submission import JobSubmissionClient

    class Bounded(JobSubmissionClient):
        def _do_request(self, method, endpoint, *, data=None, json_data=None, **kw):
            body = data if data is not None else (json.dumps(json_data).encode() if json_data is not None else None)
            hdrs = dict(getattr(self, "_headers", None) or {})
            if json_data is not None:
                hdrs["Content-Type"] = "application/json"
            try:
                return _Answer(remote.request(url, endpoint, timeout, method=method, body=body, headers=hdrs,
                                              ok=tuple(range(100, 600))))
            except remote.RemoteError as e:
                raise DashboardError(f"the Ray dashboard at {url} ({endpoint}) {why(e)}", e.kind) from None

    try:
        return Bounded(url)
    except DashboardError:
        raise
    except (RuntimeError, ConnectionError, ValueError, KeyError, TypeError) as e:
        raise DashboardError(f"the Ray dashboard at {url} did not answer Ray's version check as a dashboard "
                             f"({remote.shown(str(e).splitlines()[0] if str(e).strip() else type(e).__name__, 160)})",
                             "malformed") from None


def next_attempt(run_dir) -> int:
    """The attempt a new submission is: one past every submission the run recorded."""
    from vrun.rundir import records

    subs = [e.get("attempt") for e in records.events(str(run_dir)) if e["event"] == "submitted"]
    return max([a for a in subs if isinstance(a, int)], default=-1) + 1


def submit(plan, url: str, timeout: float, attempt: Optional[int] = None, replaces: Optional[str] = None) -> str:
    """The plan's job submitted to the dashboard at `url`: its entrypoint, runtime env and metadata from the plan
    alone; ray_job.json records the address and the job's id, a `submitted` line the attempt."""
    import tempfile

    from vrun.core import fs, writer
    from vrun.rundir import records as rundir

    d = Path(plan.run_dir)
    attempt = next_attempt(d) if attempt is None else attempt
    rid = rundir.run_id(str(d))
    job_id = submission_id(rid, attempt)
    command = entrypoint(plan)
    c = client(url, timeout)
    with tempfile.TemporaryDirectory(prefix="vrun-job-") as tmp:
        for name in JOB_FILES:  # the run dir's own files, read as every run-dir file is
            text, why_not = fs.read_checked(d / name, 64 << 20, own=True)
            if text is None:
                raise DashboardError(f"{d / name}: {why_not}: nothing was submitted", "address")
            Path(tmp, name).write_text(text)
        try:
            got = c.submit_job(entrypoint=command, runtime_env=runtime_env(plan, tmp, attempt), submission_id=job_id,
                               metadata={"vrun_run_dir": str(d), "vrun_run_id": rid, "vrun_attempt": str(attempt)})
        except DashboardError:
            raise
        except (RuntimeError, ValueError, TypeError, KeyError) as e:  # the SDK's words on a refused submission
            text = str(e).strip().splitlines()
            raise DashboardError(f"the Ray dashboard at {url} refused the job ({remote.shown(text[-1] if text else type(e).__name__, 200)})",
                                 "http") from None
    if got != job_id:
        raise DashboardError(f"the Ray dashboard at {url} answered job id {remote.shown(got, 80)} for {job_id}",
                             "malformed")
    writer.write_text(d / RAY_JOB, json.dumps({"address": url, "job_id": job_id}, indent=1) + "\n", root=str(d))
    rundir.record(str(d), "submitted", attempt=attempt, cluster="ray", ray_job=job_id,
                  **({"replaces": replaces} if replaces else {}))
    return job_id


# ==================================================================== the launcher
def cluster_checks(plan, shape: Optional[Shape]) -> list[Problem]:
    """Every check a cluster=ray point gets before submission, preflight and train alike: the cluster's shape
    against the plan, then the checks cluster=slurm makes before sbatch."""
    return (shape_problems(plan, shape) if shape is not None else []) + login_problems(plan)


def launch(sweep) -> list:
    from vrun.config import cli_errors
    from vrun.config.schema import Mode
    from vrun.launch import points as planned

    plans = sweep.plans
    checking = {p.config.mode for p in plans} != {Mode.plan}
    submitting = any(p.config.mode == Mode.train for p in plans)
    cluster = plans[0].config.cluster
    timeout = float(cluster.ray.dashboard_timeout_s)
    shape, url, offline = None, None, None
    try:
        url = dashboard(cluster.ray.address)
        shape = read_shape(url, timeout if checking else min(timeout, PLAN_TIMEOUT_S))
    except DashboardError as e:
        if checking or e.kind == "address" and cluster.ray.address != "auto":
            cli_errors.emit([Problem(ADDRESS_KEY, cluster.ray.address, f"{e}; nothing was submitted",
                                     f"start the cluster or give its dashboard address ({ADDRESS_KEY}="
                                     f"{DASHBOARD_FORM})").line()])
        offline = Problem(ADDRESS_KEY, cluster.ray.address, f"{e}: planned offline, not checked against the "
                          "cluster's shape", "check again once the cluster answers (mode=preflight)", warning=True)

    def check(point) -> list:
        p = point.plan
        if not checking:
            return ([offline] if offline else []) + (shape_problems(p, shape) if shape is not None else [])
        return cluster_checks(p, shape)

    planned.verdict(sweep, check, "refused before submission; nothing was submitted")
    if shape is not None:
        print(f"ray     {url}: {shape.describe()}", flush=True)
    for point in sweep.points:
        planned.write(point)
    if not submitting:
        print("plan only: nothing submitted" if not checking else "preflight: all checks passed against the "
              "cluster; nothing submitted", flush=True)
        return []
    followed = []
    for point in sweep.points:
        if point.plan.config.mode != Mode.train:
            continue
        d = str(point.plan.run_dir)
        try:
            job = submit(point.plan, url, timeout)
        except (DashboardError, ValueError) as e:
            cli_errors.emit([Problem(ADDRESS_KEY, url, f"{e}; the job may not have been submitted",
                                     f"check the dashboard, then python -m vrun resubmit {shlex.quote(d)}").line()])
        q = shlex.quote(d)
        print(f"submitted {job} to {url} (run dir {d}); python -m vrun status {q}; python -m vrun logs {q}; "
              f"python -m vrun cancel {q}", flush=True)
        followed.append(d)
    if followed and not cluster.detach:
        from vrun.launch import raywait

        raywait.until_ended(followed)
    return []


def login_problems(plan) -> list[Problem]:
    """The checks cluster=slurm makes before sbatch (vrun.launch.slurm.checks.login_problems), with this
    cluster's knob: they run here, the cluster's environment being assumed to be this one."""
    from vrun.launch import preflight

    return [p for p in preflight.collect(plan) if p.key != "mesh.gpus_per_node"]

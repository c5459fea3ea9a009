"""cluster=ray: the planned points submitted to a standing Ray cluster through Ray's Job Submission API
(hydra/launcher=vrun_ray calls `launch`).

The address is the cluster's dashboard (`cluster.ray.address=http://head:8265`, or `auto`: RAY_ADDRESS). Before
anything is submitted every point gets the verdict the other clusters give (the plan's checks, preflight's checks
that need no GPU, as cluster=slurm's login preflight) and the cluster's real shape read from the dashboard: alive
nodes and their GPUs (total and free), the GPU type where Ray exposes it (an `accelerator_type:*` resource), and
the cluster's Ray and Python versions, which must be this environment's (the plan's stack). A refusal is one line
naming the cluster's figure and the plan's.

The job runs the same hand-off as the other clusters: `python -m vrun.launch.entry ppo --config verl_config.yaml`
(stack check first, then verl's run_ppo), with the run dir as the job's working_dir (plan.json beside the config),
the vrun package in py_modules, and the plan's environment in env_vars. Secrets pass by name only (--pass-env):
their values are never put into the runtime env; the cluster's own environment must hold them. The driver joins the
cluster it runs on (ray_kwargs.ray_init.address=auto). The job's id is kept in <run dir>/ray_job.json, where the
runs verbs (vrun.runs.rayjobs) find it. Every request carries a timeout: a lost dashboard is one line, never a hang.
"""
from __future__ import annotations

import json
import os
import platform
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from vrun.core.problems import Problem

RAY_JOB = "ray_job.json"
# a dashboard answer larger than this is not read whole (a node summary of thousands of nodes is a few MB)
DASHBOARD_MAX_BYTES = 64 << 20
ADDRESS_KEY = "cluster.ray.address"


class DashboardError(Exception):
    """The dashboard did not answer (one line: the address, what failed)."""


def dashboard(address: str) -> str:
    """The dashboard URL of cluster.ray.address (`auto`: RAY_ADDRESS)."""
    a = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    if not a:
        raise DashboardError(f"{ADDRESS_KEY}=auto and RAY_ADDRESS is not set: the cluster's dashboard is unknown")
    return a if a.startswith(("http://", "https://")) else f"http://{a}"


def get_json(url: str, path: str, timeout: float) -> dict:
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout) as r:
            return json.loads(r.read(DASHBOARD_MAX_BYTES).decode())
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = getattr(e, "reason", None) or e
        raise DashboardError(f"the Ray dashboard at {url} did not answer {path} within {timeout:g}s ({why})") from None


@dataclass
class Shape:
    """What the cluster is, as its dashboard reports it."""
    ray_version: str
    python_version: Optional[str]
    nodes: list = field(default_factory=list)  # {"id", "ip", "gpus", "free_gpus", "gpu_type"} per alive node
    used_gpus: Optional[float] = None  # over the whole cluster, where the dashboard reports it

    @property
    def free_gpus(self) -> Optional[float]:
        if any(n["free_gpus"] is not None for n in self.nodes):
            return sum(n["free_gpus"] or 0 for n in self.nodes)
        return None if self.used_gpus is None else sum(n["gpus"] for n in self.nodes) - self.used_gpus

    def gpu_nodes(self, per_node: int) -> list:
        return [n for n in self.nodes if n["gpus"] >= per_node]

    def describe(self) -> str:
        sizes = sorted({n["gpus"] for n in self.nodes}, reverse=True)
        kinds = sorted({n["gpu_type"] for n in self.nodes if n["gpu_type"]})
        gpus = sum(n["gpus"] for n in self.nodes)
        free = self.free_gpus
        return (f"{len(self.nodes)} alive node(s), GPUs per node {'/'.join(f'{s:g}' for s in sizes) or 0}, "
                f"{'?' if free is None else f'{free:g}'} of {gpus:g} GPUs free"
                f"{', ' + '/'.join(kinds) if kinds else ''}; Ray {self.ray_version}, "
                f"Python {self.python_version or 'unknown'}")


def read_shape(url: str, timeout: float) -> Shape:
    meta = get_json(url, "/api/v0/cluster_metadata", timeout)
    meta = meta.get("data", meta)
    version = meta.get("rayVersion") or meta.get("ray_version") or get_json(url, "/api/version", timeout)["ray_version"]
    nodes = get_json(url, "/nodes?view=summary", timeout)
    summary = (nodes.get("data") or {}).get("summary") or []
    out = []
    for n in summary:
        raylet = n.get("raylet") or {}
        if raylet.get("state") != "ALIVE":
            continue
        total = raylet.get("resourcesTotal") or {}
        avail = raylet.get("resourcesAvailable")
        # accelerator_type:<kind>, which the dashboard spells acceleratorType:<kind>
        kinds = [k.split(":", 1)[1] for k in total if k.startswith(("accelerator_type:", "acceleratorType:"))]
        labels = raylet.get("labels") or {}
        kind = labels.get("ray.io/accelerator-type") or (kinds[0] if kinds else None)
        gpus = float(total.get("GPU", 0))
        out.append({"id": raylet.get("nodeId"), "ip": raylet.get("nodeManagerAddress") or n.get("ip"),
                    "gpus": gpus, "free_gpus": float(avail.get("GPU", 0)) if isinstance(avail, dict) else None,
                    "gpu_type": kind})
    shape = Shape(version, meta.get("pythonVersion") or meta.get("python_version"), out)
    shape.used_gpus = used_gpus(url, timeout)
    return shape


def used_gpus(url: str, timeout: float) -> Optional[float]:
    """GPUs in use over the cluster (the autoscaler's load report), None where the dashboard does not say."""
    try:
        status = get_json(url, "/api/cluster_status?format=0", timeout)
        usage = status["data"]["clusterStatus"]["loadMetricsReport"]["usage"]
        return float(usage.get("GPU", [0, 0])[0])
    except (DashboardError, KeyError, TypeError, IndexError, ValueError):
        return None


def here() -> dict:
    import ray

    return {"ray": ray.__version__, "python": platform.python_version()}


def shape_problems(plan, shape: Shape, stack: Optional[dict] = None) -> list[Problem]:
    """The cluster against the plan: enough alive nodes with the mesh's GPUs per node; the same Ray and Python as
    the environment that planned (and runs the entry)."""
    m, stack = plan.mesh, stack or here()
    out = []
    fit = shape.gpu_nodes(m.gpus_per_node)
    if len(fit) < m.nnodes:
        out.append(Problem("mesh", f"{m.nnodes}x{m.gpus_per_node}", f"the mesh needs {m.nnodes} node(s) of "
                           f"{m.gpus_per_node} GPUs; the Ray cluster has {len(fit)} such node(s) ({shape.describe()})",
                           f"mesh.nnodes={len(fit)} (or mesh=auto), or grow the cluster" if fit else
                           "a mesh.gpus_per_node the cluster's nodes have, or grow the cluster"))
    elif shape.free_gpus is not None and shape.free_gpus < m.nnodes * m.gpus_per_node:
        out.append(Problem("mesh", f"{m.nnodes}x{m.gpus_per_node}", "the cluster has the nodes but not that many "
                           f"free now ({shape.describe()}): the job waits for them", "wait, or cancel what holds "
                           "them", warning=True))
    kind = str(plan.config.cluster.gpu)
    kinds = {n["gpu_type"] for n in fit if n["gpu_type"]}
    if kinds and not any(kind.upper() in k.upper() for k in kinds):
        out.append(Problem("cluster.gpu", kind, f"the cluster's GPU nodes report {'/'.join(sorted(kinds))} "
                           "(accelerator_type): the memory estimate assumed another part",
                           f"cluster.gpu=<the cluster's part> (one of {sorted(kinds)})", warning=True))
    if shape.ray_version != stack["ray"]:
        out.append(Problem("ray", stack["ray"], f"the plan's stack has Ray {stack['ray']}; the cluster runs Ray "
                           f"{shape.ray_version}", f"install ray=={shape.ray_version} here and plan again, or a "
                           f"cluster on Ray {stack['ray']}"))
    py = shape.python_version
    if py and py.split(".")[:2] != stack["python"].split(".")[:2]:
        out.append(Problem("python", stack["python"], f"the plan's stack has Python {stack['python']}; the cluster "
                           f"runs Python {py}", f"plan from a Python {'.'.join(py.split('.')[:2])} environment, or "
                           f"a cluster on Python {'.'.join(stack['python'].split('.')[:2])}"))
    return out


# ==================================================================== the job
def entrypoint(plan) -> str:
    """The plan's argv as the job runs it: the cluster's python, the config beside plan.json in the working_dir."""
    import shlex

    argv = ["python"] + list(plan.argv[1:])
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


def runtime_env(plan) -> dict:
    """working_dir: the run dir (plan.json, verl_config.yaml); py_modules: this vrun (PYTHONPATH does not travel);
    env_vars: job_env."""
    import vrun

    return {"working_dir": str(plan.run_dir), "py_modules": [str(Path(vrun.__file__).parent)],
            "env_vars": job_env(plan)}


def client(url: str, timeout: float):
    from ray.job_submission import JobSubmissionClient

    try:
        c = JobSubmissionClient(url)
    except Exception as e:  # noqa: BLE001 - ConnectionError, RuntimeError from the version check
        raise DashboardError(f"the Ray dashboard at {url} refused the connection "
                             f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})") from None
    _timeout(c, timeout)
    return c


def _timeout(c, timeout: float) -> None:
    """Every request of the client with a timeout (the SDK's requests carry none)."""
    do = c._do_request

    def bounded(*a, **kw):
        import requests

        kw.setdefault("timeout", timeout)
        try:
            return do(*a, **kw)
        except requests.exceptions.RequestException as e:
            raise DashboardError(f"the Ray dashboard at {c._address} did not answer within {timeout:g}s "
                                 f"({type(e).__name__})") from None

    c._do_request = bounded


def submit(plan, url: str, timeout: float) -> str:
    from vrun.rundir import records as rundir
    from vrun.core import writer

    c = client(url, timeout)
    job = c.submit_job(entrypoint=entrypoint(plan), runtime_env=runtime_env(plan),
                       metadata={"vrun_run_dir": str(plan.run_dir)})
    # what resubmit needs: the same entrypoint and runtime env (no secret is in either)
    writer.write_text(Path(plan.run_dir) / RAY_JOB, json.dumps({"address": url, "job_id": job, "entrypoint":
                                                               entrypoint(plan), "runtime_env": runtime_env(plan)},
                                                              indent=1) + "\n", root=plan.run_dir)
    # the Ray job's id is not a SLURM job id (the `job_id` of a progress line): it is kept as ray_job
    rundir.record(plan.run_dir, "submitted", attempt=0, cluster="ray", ray_job=job)
    return job


def load(run_dir) -> Optional[dict]:
    """ray_job.json through the bounded reader (a FIFO, a link or another user's file is not a job); None when it
    is not there or not a JSON object."""
    from vrun.core import fs

    text, _ = fs.read_checked(Path(run_dir) / RAY_JOB, 1 << 20, own=True)
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# ==================================================================== the launcher
def launch(sweep) -> list:
    from vrun.config import cli_errors
    from vrun.config.schema import Mode
    from vrun.launch import points as planned

    plans = sweep.plans
    checking = {p.config.mode for p in plans} != {Mode.plan}
    submitting = any(p.config.mode == Mode.train for p in plans)
    cluster = plans[0].config.cluster
    timeout = float(cluster.ray.dashboard_timeout_s)
    shape, url = None, None
    if checking:
        try:
            url = dashboard(cluster.ray.address)
            shape = read_shape(url, timeout)
        except DashboardError as e:
            cli_errors.emit([Problem(ADDRESS_KEY, cluster.ray.address, f"{e}; nothing was submitted",
                                     "start the cluster or give its dashboard address "
                                     "(cluster.ray.address=http://<head>:8265)").line()])
    def check(point) -> list:
        p = point.plan
        if not checking:
            return []
        return shape_problems(p, shape) + (login_problems(p) if p.config.mode == Mode.train else _memory(p))

    planned.verdict(sweep, check, "refused before submission; nothing was submitted")
    if shape is not None:
        print(f"ray     {url}: {shape.describe()}", flush=True)
    for point in sweep.points:
        planned.write(point)
    if not submitting:
        print("plan only: nothing submitted" if not checking else "preflight: all checks passed against the "
              "cluster; nothing submitted", flush=True)
        return []
    for point in sweep.points:
        if point.plan.config.mode != Mode.train:
            continue
        try:
            job = submit(point.plan, url, timeout)
        except DashboardError as e:
            cli_errors.emit([Problem(ADDRESS_KEY, url, f"{e}; the job may not have been submitted",
                                     "check the dashboard, then python -m vrun resubmit <run dir>").line()])
        print(f"submitted {job} to {url} (run dir {point.plan.run_dir}); python -m vrun status|logs|cancel "
              f"{point.plan.run_dir}", flush=True)
    return []


def login_problems(plan) -> list[Problem]:
    """The checks cluster=slurm makes before sbatch (vrun.launch.slurm.checks.login_problems), with this
    cluster's knob: they run here, the cluster's environment being assumed to be this one."""
    from vrun.launch import preflight

    return [p for p in preflight.collect(plan) if p.key != "mesh.gpus_per_node"]


def _memory(plan) -> list[Problem]:
    from vrun.launch import preflight

    return preflight.memory_problems(plan)


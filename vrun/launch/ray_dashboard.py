"""A standing Ray cluster's dashboard and its real shape (cluster=ray): the address as the cluster's Job Submission
API takes it (`dashboard`: `http://head:8265`, an IPv6 head as `http://[::1]:8265`, or `auto`: RAY_API_SERVER_ADDRESS,
else RAY_ADDRESS; the GCS address refused in one line naming the dashboard's form), its answers read through
vrun.core.remote (bounded, their shape checked), the cluster's alive nodes, GPUs (total and free), GPU type, Ray and
Python versions (`read_shape`), and a plan's verdict against them (`shape_problems`): one line naming the cluster's
figure and the plan's.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import Optional

from vrun.core import remote
from vrun.core.problems import Problem
from vrun.core.text import summarised

ADDRESS_KEY = "cluster.ray.address"


DASHBOARD_FORM = "http://<head>:8265"


class DashboardError(Exception):
    """The dashboard did not answer as one (one line: the address, what came back)."""

    def __init__(self, text: str, kind: str = ""):
        super().__init__(text)
        self.kind = kind


def dashboard(address: str) -> str:
    """The dashboard URL of cluster.ray.address (`auto`: RAY_API_SERVER_ADDRESS, else RAY_ADDRESS, as Ray's job CLI
    reads them); DashboardError saying why it is none."""
    a = address
    if address == "auto":
        a = os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS") or ""
        if not a:
            raise DashboardError(f"{ADDRESS_KEY}=auto and neither RAY_API_SERVER_ADDRESS nor RAY_ADDRESS is set "
                                 "(RAY_ADDRESS is not set): the cluster's dashboard is unknown", "address")
    a = a.strip() if isinstance(a, str) else a
    if isinstance(a, str) and "://" not in a:
        a = f"http://{a}"
    try:
        return str(remote.url_of(a.rstrip("/") if isinstance(a, str) else a))
    except ValueError as e:
        raise DashboardError(f"{remote.shown(a, 120)} is not a dashboard address: {e} (the form is "
                             f"{DASHBOARD_FORM})", "address") from None


def why(e: remote.RemoteError) -> str:
    """A dashboard's failure in words, with what to do where the answer says it."""
    if e.kind == "not_http":
        return (f"{e.detail}: this looks like the GCS address `ray start` prints for joining nodes (port 6379 by "
                f"default), not the dashboard; the Job API answers on the dashboard ({DASHBOARD_FORM})")
    return e.detail


def get_json(url: str, path: str, timeout: float, expect: type = dict):
    """One bounded request for a JSON answer of the type `expect`; DashboardError naming the address otherwise."""
    try:
        return remote.request(url, path, timeout).json(expect)
    except remote.RemoteError as e:
        raise DashboardError(f"the Ray dashboard at {url} ({path.split('?')[0]}) {why(e)}", e.kind) from None


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
                f"{', ' + summarised(kinds, sep='/') if kinds else ''}; Ray {self.ray_version}, "
                f"Python {self.python_version or 'unknown'}")


def read_shape(url: str, timeout: float) -> Shape:
    """The cluster's shape from three dashboard routes, each answer's fields checked before they are read."""
    src = f"the Ray dashboard at {url}"
    try:
        meta = get_json(url, "/api/v0/cluster_metadata", timeout)
        meta = meta.get("data") if isinstance(meta.get("data"), dict) else meta
        version = meta.get("rayVersion") or meta.get("ray_version")
        if not isinstance(version, str):
            version = remote.need(get_json(url, "/api/version", timeout), "ray_version", (str,), src)
        py = meta.get("pythonVersion") or meta.get("python_version")
        nodes = get_json(url, "/nodes?view=summary", timeout)
        data = remote.need(nodes, "data", (dict,), src)
        summary = remote.need(data, "summary", (list,), src, optional=True) or []
        out = [node for n in summary for node in [_node(n, src)] if node is not None]
    except remote.RemoteError as e:
        raise DashboardError(f"{src} {e.detail}", e.kind) from None
    shape = Shape(remote.shown(version, 40), remote.shown(py, 40) if isinstance(py, str) else None, out)
    shape.used_gpus = used_gpus(url, timeout)
    return shape


def _node(n, src: str) -> Optional[dict]:
    """One alive node of /nodes?view=summary: its GPUs (total, free) and GPU type; None for a dead one."""
    raylet = remote.need(n, "raylet", (dict,), src, optional=True) if isinstance(n, dict) else None
    if not raylet or raylet.get("state") != "ALIVE":
        return None
    total = remote.need(raylet, "resourcesTotal", (dict,), src, optional=True) or {}
    avail = raylet.get("resourcesAvailable")
    # accelerator_type:<kind>, which the dashboard spells acceleratorType:<kind>
    kinds = [k.split(":", 1)[1] for k in total if isinstance(k, str) and k.startswith(("accelerator_type:",
                                                                                        "acceleratorType:"))]
    labels = raylet.get("labels") if isinstance(raylet.get("labels"), dict) else {}
    kind = labels.get("ray.io/accelerator-type") or (kinds[0] if kinds else None)
    gpus = remote.need(total, "GPU", (int, float), src, optional=True) or 0
    free = remote.need(avail, "GPU", (int, float), src, optional=True) or 0 if isinstance(avail, dict) else None
    return {"id": remote.shown(raylet.get("nodeId") or "?", 60),
            "ip": remote.shown(raylet.get("nodeManagerAddress") or n.get("ip") or "?", 60),
            "gpus": float(gpus), "free_gpus": None if free is None else float(free),
            "gpu_type": remote.shown(kind, 40) if isinstance(kind, str) else None}


def used_gpus(url: str, timeout: float) -> Optional[float]:
    """GPUs in use over the cluster (the autoscaler's load report), None where the dashboard does not say."""
    try:
        status = get_json(url, "/api/cluster_status?format=0", timeout)
        usage = status["data"]["clusterStatus"]["loadMetricsReport"]["usage"]
        return float(usage.get("GPU", [0, 0])[0])
    except (DashboardError, KeyError, TypeError, IndexError, ValueError, AttributeError):
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

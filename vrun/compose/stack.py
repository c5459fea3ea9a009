"""The stack a plan was composed against, and the one refusal when it runs on another.

A plan holds for the verl it was composed against (three verls in use differ in their config trees, and one's
dataclasses reject another's defaults) and for verl_mlite's config interface. `current()` describes this
environment: verl's version and a fingerprint of its config tree, verl_mlite's source (the real package and its
checkout's commit when known, or the project's record) and a fingerprint of its config groups. The record and the
real package at the recorded commit carry the same three group files, so a plan composed against the record is
not refused where the real package has the same interface. `mismatch()` compares a recorded stack with this one.
Reads files only: no verl, torch or verl_mlite import.
"""
from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Optional

from vrun.compose import mlite, verl_tree
from vrun.core import digest, fs
from vrun.core.problems import Problem

# verl_mlite's config groups the plan composes with (the same relative paths in the record)
MLITE_GROUPS = ("actor/mlite_actor.yaml", "engine/mlite.yaml", "ref/mlite_ref.yaml")


@functools.lru_cache(maxsize=1)
def verl_version() -> Optional[str]:
    """The installed verl's version (None when verl is not installed); read from its metadata, never imported
    (once per process: the metadata lookup scans every distribution on the path)."""
    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def verl_stack() -> dict:
    """The installed verl's version and config-tree fingerprint (once per process: a sweep records it at every
    point, and the installed package does not change under a running process)."""
    version = verl_version()
    if version is None:
        return {"version": None, "tree": None}
    return {"version": version, "tree": verl_tree.fingerprint()}


def _git_commit(checkout: Path) -> Optional[str]:
    """The commit of a Megatron-LM git checkout at exactly this folder (an unpacked archive has none)."""
    if not fs.exists(checkout / ".git"):
        return None
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def mlite_stack() -> dict:
    source = mlite.find_source()
    if source.kind == "record":
        root = Path(mlite.__file__).parent / "mlite_record" / "config"
        commit = mlite.record()["megatron_lm_commit"]
        location = None
    else:
        root = Path(source.location) / "config"
        # <checkout>/experimental/lite/examples/verl/verl_mlite
        commit = _git_commit(Path(source.location).parents[3])
        location = source.location
    return {"source": source.kind, "location": location, "commit": commit,
            "config": digest.files(root, [root / g for g in MLITE_GROUPS if fs.is_file(root / g)], parsed=True)}


@functools.lru_cache(maxsize=1)
def runtime() -> dict:
    """This environment's Ray (from its metadata, never imported; None where Ray is not installed) and Python: a Ray
    job's image or cluster must run the same Ray, and the same Python minor version, as the planner's."""
    import platform

    try:
        ray = metadata.version("ray")
    except metadata.PackageNotFoundError:
        ray = None
    return {"ray": ray, "python": platform.python_version()}


def current() -> dict:
    """This environment's stack, as plan.json and the manifest record it."""
    return {"verl": dict(verl_stack()), "verl_mlite": mlite_stack(), "runtime": dict(runtime())}


def _show(side: dict, what: str) -> str:
    if what == "verl":
        return f"verl {side.get('version')} (config tree {side.get('tree')})"
    where = side.get("location") or "the project's record"
    commit = f" at {side['commit'][:8]}" if side.get("commit") else ""
    return f"verl_mlite from {where}{commit} (config {side.get('config')})"


def mismatch(recorded: Optional[dict], here: Optional[dict] = None) -> list[Problem]:
    """One line per part of the stack that differs between the plan and this environment."""
    if not recorded:
        return [Problem("plan.json", "stack", "the plan records no stack (made by an older vrun)",
                        "plan again in this environment (the same command with mode=plan)")]
    here = here or current()
    out = []
    for part, keys in (("verl", ("version", "tree")), ("verl_mlite", ("config",))):
        a, b = recorded.get(part) or {}, here.get(part) or {}
        if any(a.get(k) != b.get(k) for k in keys):
            value = b.get("version") if part == "verl" else (b.get("location") or "record")
            out.append(Problem(part, value, f"the plan was composed against {_show(a, part)}; this "
                               f"environment has {_show(b, part)}", "plan again in this environment (the same "
                               "command with mode=plan), or run where the planned stack is installed"))
    return out


def _minor(version) -> Optional[str]:
    return ".".join(str(version).split(".")[:2]) if version else None


def runtime_mismatch(recorded: Optional[dict], here: Optional[dict] = None) -> list[Problem]:
    """Ray (the same version) and Python (the same minor version) of the plan (its stack's `runtime`) against this
    environment, where the plan records them (a plan of an older vrun does not): the job's entry checks them
    (vrun.launch.entry.stack_problems), so a Ray job's image or nodes run what the planner ran, or the job fails
    there, before any Ray work, one line each."""
    here = runtime() if here is None else here
    if not isinstance(recorded, dict) or not isinstance(here, dict):
        return []
    out = []
    want, have = recorded.get("ray"), here.get("ray")
    if want and want != have:
        out.append(Problem("ray", have or "missing", f"the plan was made with Ray {want}; this environment (the "
                           f"image or node the job runs on) has {f'Ray {have}' if have else 'no Ray'}",
                           f"an image (cluster.kuberay.image) or nodes with ray=={want}, or plan again with "
                           f"ray=={have} installed" if have else f"an image or nodes with ray=={want}"))
    want, have = _minor(recorded.get("python")), _minor(here.get("python"))
    if want and want != have:
        out.append(Problem("python", here.get("python") or "missing", f"the plan was made with Python "
                           f"{recorded.get('python')}; this environment (the image or node the job runs on) has "
                           f"Python {here.get('python')}", f"an image or nodes with Python {want}, or plan again "
                           f"from a Python {have} environment"))
    return out

"""The run manifest (what ran, from which code, with which packages): manifest.json, written by the launcher beside
each point's plan.json (vrun.launch.points.write)."""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from vrun.core.problems import SECRETISH

PACKAGES = ("verl", "ray", "hydra-core", "omegaconf", "torch", "submitit", "hydra-submitit-launcher", "vllm")


def redact(obj: Any) -> Any:
    """Values under secret-looking keys become '<redacted>'."""
    if isinstance(obj, dict):
        return {k: "<redacted>" if SECRETISH.search(str(k)) and v not in (None, "") else redact(v)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj


def redact_arg(arg: str) -> str:
    """An override with a secret key's value (vrun.config.overrides.shown_override's rule) redacted."""
    from vrun.config.overrides import shown_override

    key, eq, _ = arg.partition("=")
    return f"{key}=<redacted>" if eq and (SECRETISH.search(key) or shown_override(arg) != arg) else arg


@functools.lru_cache(maxsize=1)
def git_state() -> dict:
    root = Path(__file__).resolve().parent.parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"commit": commit, "dirty": dirty}


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    from importlib import metadata

    out = {}
    for name in PACKAGES:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        entry = {"version": dist.version}
        try:
            direct = json.loads(dist.read_text("direct_url.json") or "{}")
            if direct.get("vcs_info", {}).get("commit_id"):
                entry["commit"] = direct["vcs_info"]["commit_id"]
        except (json.JSONDecodeError, OSError):
            pass
        out[name] = entry
    return out


def _stack() -> dict:
    from vrun.compose import stack

    try:
        return stack.current()
    except ModuleNotFoundError as e:  # no verl: the plan itself says so
        return {"unavailable": str(e)}


def manifest(resolved: dict, output_dir: str, overrides: list[str]) -> dict:
    """resolved: the run config as plain containers, interpolations resolved (vrun.checks.composed.containers)."""
    run_cfg = {k: v for k, v in resolved.items() if k != "hydra"}
    return {
        "command": [Path(sys.argv[0]).name] + [redact_arg(a) for a in sys.argv[1:]],
        "overrides": [redact_arg(a) for a in overrides],
        "python": sys.executable,
        "run_dir": output_dir,
        "git": git_state(),
        "packages": versions(),
        "stack": _stack(),
        "config": redact(run_cfg),
    }


def write_manifest(resolved: dict, run_dir: str, overrides: list[str]) -> None:
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    from vrun.core import writer

    writer.write_text(out / "manifest.json", json.dumps(manifest(resolved, str(out), overrides), indent=2) + "\n",
                      root=out)


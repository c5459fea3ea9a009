"""SLURM, before sbatch: what the submitting machine can check so that a submitted job runs.

- login_problems: the local preflight's checks that need no GPU (checkpoint complete, data files, verl_mlite and
  the rollout engine importable, verl able to build the engine config, the model's own modules, the stack) when
  cluster.login_preflight (else the job's nodes run node_problems first thing); the memory verdict always.
- storage_problems: the run dir, the submitit folder, the checkout, the venv, the model and the data must be on
  storage the nodes share; a path under one of cluster.node_local_paths (e.g. /tmp, private per node) is refused.
- partition_problems: the request against the partition (scontrol show partition, sinfo): nodes, GPUs per node
  (gres), time limit.
- sbatch_problem: sbatch's own refusal mapped to a fix that fits it.
Every function returns Problems (one line each); none submits anything.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vrun.core.problems import Problem
from vrun.core import fs
from vrun.core.text import summarised

SKIP = "cluster.login_preflight=false"


# ==================================================================== the local preflight, before the allocation
def login_problems(plan) -> list[Problem]:
    """What refuses the submission of a mode=train job, checked here (warnings included)."""
    from vrun.launch import preflight

    out = preflight.memory_problems(plan)
    if not plan.config.cluster.login_preflight:
        return out
    env = [p for p in preflight.collect(plan) if p not in out]
    # the fix of a check that fails only because this machine is not a node: the knob that moves it onto the nodes
    return out + [p if p.warning else Problem(p.key, p.value, p.why + " (checked on this machine before sbatch)",
                                              f"{p.fix}; or {SKIP} where the nodes' environment differs from this "
                                              "machine's (the job then checks first thing)") for p in env]


def node_checks(plan) -> dict:
    """What a node checks first thing when the login preflight is skipped (plain values, carried with the job)."""
    from vrun.launch import preflight

    files = preflight.data_files(plan.verl)
    builds = plan.entrypoint.builds_mlite_workers(plan.config)
    modules = (["verl_mlite"] + list(plan.config.model.requires) + plan.entrypoint.runtime_modules(plan.verl)) \
        if builds else []
    return {"model": plan.model_path, "model_env": plan.config.model.path_env, "weights": builds,
            "files": files, "modules": modules, "weight_patterns": list(preflight.WEIGHTS)}


def node_problems(checks: dict) -> list[str]:
    """On a node, first thing (cluster.login_preflight=false): the same checks, one line each."""
    import importlib.util

    out = []
    model = checks.get("model")
    if model and model.startswith(("/", "~", ".")):
        p = Path(os.path.expanduser(model))
        if not fs.is_file(p / "config.json"):
            out.append(f"{checks['model_env']}={model}: no config.json here (not a checkpoint dir, or not on "
                       "storage this node sees)")
        elif checks.get("weights") and not any(f for pat in checks["weight_patterns"] for f in p.glob(pat)):
            out.append(f"{checks['model_env']}={model}: config.json but no weights")
    for key, f in checks.get("files", []):
        if not fs.exists(os.path.expanduser(f)):
            out.append(f"{key}={f}: no such file on this node")
    for mod in checks.get("modules", []):
        if importlib.util.find_spec(mod) is None:
            out.append(f"python module {mod}: not importable on this node, and the run imports it")
    return out


# ==================================================================== shared storage
def storage_problems(plan, folder: str) -> list[Problem]:
    """Paths the nodes must see, refused when they are under one of cluster.node_local_paths."""
    local = node_local(plan.config.cluster.node_local_paths)
    if not local:
        return []
    import vrun

    checkout = str(Path(vrun.__file__).resolve().parents[1])
    paths = [("hydra.sweep.dir", plan.run_dir, "the run dir"),
             ("hydra.launcher.submitit_folder", folder, "the job's log folder"),
             ("checkout", checkout, "the code the job runs"), ("venv", sys.prefix, "the Python the job runs")]
    if plan.model_path and plan.model_path.startswith(("/", "~", ".")):
        paths.append((plan.config.model.path_env, plan.model_path, "the checkpoint"))
    if os.environ.get("MLITE_ROOT"):
        paths.append(("MLITE_ROOT", os.environ["MLITE_ROOT"], "Megatron Lite"))
    out, seen = [], set()
    for key, path, what in paths:
        full = os.path.normpath(os.path.abspath(os.path.expanduser(str(path))))
        real = os.path.realpath(full)  # a link from shared storage into node-local storage is still node-local
        under = next((loc for loc in local for p in (full, real)
                      if p == loc or p.startswith(loc.rstrip("/") + "/")), None)
        if under and key not in seen:
            seen.add(key)
            out.append(Problem(key, full, f"{what} is under {under}, storage private to each node "
                               "(cluster.node_local_paths): the nodes would not see it and the job would end "
                               "without writing a line", f"put it outside {under}, on storage every node shares "
                               "(e.g. the project's filesystem)"))
    return out


def node_local(paths) -> list[str]:
    """cluster.node_local_paths as compared: `~` expanded, normalised, each also as its real path (a link such as
    /scratch → /local/scratch); relative entries are refused by the knob's own check (vrun.checks.values)."""
    out: list[str] = []
    for p in paths or []:
        if not isinstance(p, str) or not p.strip():
            continue
        full = os.path.normpath(os.path.expanduser(p.strip()))
        if os.path.isabs(full):
            out += [x for x in dict.fromkeys((full, os.path.realpath(full))) if x not in out]
    return out


# ==================================================================== the partition
@dataclass(frozen=True)
class Partition:
    name: str
    nodes: int
    max_nodes: Optional[int]
    max_time_min: Optional[int]
    gpus_per_node: Optional[int]   # the most GPUs a node of the partition has (gres gpu), None: none declared
    default: bool = False


def _slurm(*argv: str) -> Optional[str]:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def minutes(text: str) -> Optional[int]:
    """A SLURM time limit ([days-]hours:minutes:seconds, minutes, UNLIMITED) in minutes; None: no limit, or text
    that is not a time limit (scontrol's answer is read, not trusted)."""
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days, _, rest = text.rpartition("-")
    if not re.fullmatch(r"[0-9]{0,6}", days) or not re.fullmatch(r"[0-9]{1,9}(:[0-9]{1,9}){0,2}", rest):
        return None
    parts = [int(x) for x in rest.split(":")]
    if len(parts) == 1:
        h, m, s = 0, parts[0], 0
    elif len(parts) == 2:
        h, m, s = 0, parts[0], parts[1]
    else:
        h, m, s = parts[-3:]
    return (int(days or 0) * 24 + h) * 60 + m + (1 if s else 0)


def gres_gpus(gres: str) -> int:
    """GPUs in a gres string: gpu:4, gpu:h100:8(S:0-1), gpu:a100:4,nic:1 → 4, 8, 4."""
    n = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            n = max(n, int(m.group(1)))
    return n


def partitions() -> Optional[list[Partition]]:
    """Every partition this client sees; None where no SLURM client answers."""
    text = _slurm("scontrol", "show", "partition", "-o")
    if text is None:
        return None
    out = []
    for line in text.splitlines():
        kv = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "PartitionName" not in kv:
            continue
        name = kv["PartitionName"]
        gres = _slurm("sinfo", "-h", "-p", name, "-o", "%G") or ""
        gpus = max((gres_gpus(g) for g in gres.split()), default=0)
        maxn = kv.get("MaxNodes", "UNLIMITED")
        total = kv.get("TotalNodes", "0")
        out.append(Partition(name, int(total) if re.fullmatch(r"[0-9]{1,9}", total) else 0,
                             int(maxn) if re.fullmatch(r"[0-9]{1,9}", maxn) else None,
                             minutes(kv.get("MaxTime", "UNLIMITED")), gpus or None, kv.get("Default") == "YES"))
    return out


def partition_problems(sub, known: Optional[list] = None) -> list[Problem]:
    """The request against its partition; [] where no SLURM client answers (sbatch will say it)."""
    parts = partitions() if known is None else known
    if not parts:
        return []
    want = sub.parameters.get("partition")
    key = "cluster.partition"
    if want:
        part = next((p for p in parts if p.name == want), None)
        if part is None:
            return [Problem(key, want, f"no such partition (this cluster has {summarised(p.name for p in parts)})",
                            f"{key}=<one of those>")]
    else:
        part = next((p for p in parts if p.default), None)
        if part is None:
            return []
    out = []
    limit = min(x for x in (part.nodes, part.max_nodes) if x is not None) if part.nodes else part.max_nodes
    if limit is not None and sub.nodes > limit:
        out.append(Problem("mesh.nnodes", sub.nodes, f"partition {part.name} has {limit} node(s): the job would pend "
                           "forever (PartitionNodeLimit)", f"a mesh of at most {limit} node(s), or "
                           f"{key}=<a larger partition>"))
    if part.gpus_per_node is not None and sub.gpus_per_node > part.gpus_per_node:
        out.append(Problem("mesh.gpus_per_node", sub.gpus_per_node, f"the nodes of partition {part.name} have at most "
                           f"{part.gpus_per_node} GPU(s) (gres gpu:{part.gpus_per_node})",
                           f"mesh.gpus_per_node={part.gpus_per_node} (and more nodes), or {key}=<another>"))
    elif part.gpus_per_node is None and sub.gpus_per_node:
        out.append(Problem("mesh.gpus_per_node", sub.gpus_per_node, f"partition {part.name} declares no GPUs (no gres "
                           "gpu)", f"{key}=<a GPU partition>"))
    t = int(sub.parameters.get("time") or 0)
    if part.max_time_min is not None and t > part.max_time_min:
        out.append(Problem("cluster.time_min", t, f"partition {part.name} allows at most {part.max_time_min} min",
                           f"cluster.time_min={part.max_time_min} (the job requeues itself at the limit: "
                           "cluster.max_requeues)"))
    return out


# ==================================================================== sbatch's own refusals
def sbatch_problem(error: BaseException, sub) -> Problem:
    """sbatch's refusal (submitit's FailedJobError holds its stderr) as one line with a fix that fits it."""
    if isinstance(error, FileNotFoundError) or "No such file or directory: 'sbatch'" in str(error):
        return Problem("cluster", "slurm", "no SLURM client on this machine (sbatch not found)",
                       "submit from a machine of the cluster (a login node), or mode=plan to see the job")
    text = " ".join(str(error).split())
    m = re.search(r"sbatch: error: (.+?)(?: sbatch: error:|$)", text)
    why = (m.group(1) if m else text)[:300].strip() or type(error).__name__
    low = why.lower()
    parts = partitions() or []
    names = summarised(p.name + ("*" if p.default else "") for p in parts) or "sinfo lists them"
    if "invalid partition" in low:
        return Problem("cluster.partition", sub.parameters.get("partition"), f"sbatch: {why}",
                       f"cluster.partition=<one of {names}>")
    if "node configuration is not available" in low or "gres" in low:
        gres = summarised((f"{p.name}: {p.nodes} node(s), gpu:{p.gpus_per_node or 0}" for p in parts), sep="; ")
        return Problem("mesh", f"{sub.nodes}x{sub.gpus_per_node}", f"sbatch: {why}",
                       f"a mesh the partition offers ({gres or 'sinfo -o %P,%D,%G'}), or +cluster.additional_"
                       "parameters/cluster.constraint matching its nodes")
    if "time limit" in low:
        return Problem("cluster.time_min", sub.parameters.get("time"), f"sbatch: {why}",
                       "cluster.time_min=<at most the partition's MaxTime (scontrol show partition)>")
    if "account" in low:
        return Problem("cluster.account", sub.parameters.get("account"), f"sbatch: {why}",
                       "cluster.account=<an account of yours (sacctmgr show assoc user=$USER)>")
    if "qos" in low:
        return Problem("cluster.qos", sub.parameters.get("qos"), f"sbatch: {why}", "cluster.qos=<a QOS of yours>")
    if "node count" in low or "more processors" in low:
        return Problem("mesh.nnodes", sub.nodes, f"sbatch: {why}", f"a mesh within the partition ({names})")
    return Problem("sbatch", "refused", why, "read sbatch.sh in the run dir; the same command with mode=plan shows "
                   "the job without submitting")

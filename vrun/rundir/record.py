"""The plan as it travels: `PlanRecord` is what plan.json holds, what `python -m vrun` verbs, the SLURM node job and
`resubmit` read back, and the one (de)serialiser of it (`to_json`, `load`) with its format version.

The planner builds the record from its Plan (vrun.planning.report.record); every reader gets typed attributes. The
estimate sections (memory, time, cost, params, ...) are open maps of figures the picture and `status` show; the
fields the verbs and the node act on are typed. A file of another format, or whose fields have the wrong type, is
one line naming the file and the field (RunDirError). Standard library only.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from vrun.rundir.files import MAX_WORLD, RunDirError, count_ok, read_object

# plan.json's "format": what this vrun reads. Raise it when plan.json's fields change meaning.
FORMAT = 2
PLAN = "plan.json"


@dataclass(frozen=True)
class MeshRecord:
    world: int
    nnodes: int
    gpus_per_node: int
    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    etp: int
    edp: int
    vpp: int


@dataclass(frozen=True)
class ModelRecord:
    name: str
    path: Optional[str]
    path_from: str


@dataclass(frozen=True)
class MliteRecord:
    source: str
    location: Optional[str]


@dataclass(frozen=True)
class TorchrunRecord:
    """SFT on SLURM: what each node's torchrun starts."""
    python: str
    module: list[str]
    nproc_per_node: int


@dataclass(frozen=True)
class SlurmRecord:
    """The sbatch job (vrun.launch.slurm.submit.Submission: submitit's parameters) and where submitit writes."""
    parameters: dict
    max_num_timeout: int
    gpu_hours: float
    submitit_folder: str
    sbatch: str


@dataclass(frozen=True)
class PhaseBound:
    """One phase's bound (vrun.planning.phase_bounds): the seconds it may run, the plan's band it came from."""
    bound_s: float
    low_s: float
    high_s: float
    basis: str = ""


@dataclass(frozen=True)
class WatchRecord:
    """How the job is watched (vrun.planning.watch): seconds without a step before it counts as stalled (the first
    step of an attempt gets first_step_s), what a stall does and after how long."""
    stall_after_s: float
    first_step_s: float
    on_stall: str
    grace_s: float
    basis: str          # how stall_after_s was reached, in words
    stacks: str = ""    # how stacks are taken on this machine
    cluster: str = ""   # the cluster's name: what a stall can do there (vrun.planning.watch.line)
    # each phase's bound, in step order (vrun.planning.phase_bounds; empty: the whole step's bound only)
    phases: dict[str, PhaseBound] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class PlanRecord:
    format: int
    run_id: str
    mode: str                      # plan | preflight | train
    cluster: str                   # local | slurm
    entrypoint: str                # what the command runs (module:function)
    launcher: str                  # the entrypoint record's name (ppo on Ray, sft under torchrun)
    argv: list[str]
    env: dict[str, str]
    env_unset: list[str]
    pass_env: list[str]
    mesh: MeshRecord
    run_dir: str
    model: ModelRecord
    algo: str
    optimizer: str
    verl_config: str
    verl_config_name: str
    verl_groups: list[str]
    verl_overrides: list[str]
    mlite: MliteRecord
    stack: dict
    batch: dict
    memory: dict
    pipeline: list
    time: dict
    cost: dict
    warnings: list[str]
    cluster_group: dict            # the cluster group's values (the node types them again: vrun.config.schema)
    torchrun: TorchrunRecord
    node_checks: Optional[dict] = None   # what a node checks first when the login preflight was skipped
    mesh_search: Optional[dict] = None
    checkpoint: Optional[dict] = None
    params: Optional[dict] = None
    slurm: Optional[SlurmRecord] = None
    watch: Optional[WatchRecord] = None
    resume_mesh_change: bool = False     # run.resume_mesh_change: a checkpoint of another mesh may be resumed

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    def with_slurm(self, slurm: SlurmRecord) -> "PlanRecord":
        return dataclasses.replace(self, slurm=slurm)

    @classmethod
    def load(cls, run_dir: Path | str, written_by: Optional[Callable[[], Optional[str]]] = None) -> "PlanRecord":
        """<run dir>/plan.json, read and typed; RunDirError naming the file otherwise (written_by: the git commit
        of the vrun that wrote the run dir, for the fix of a file of another format)."""
        path = Path(run_dir) / PLAN
        data = read_object(path, {"format": int})
        fmt = data.get("format", 0)
        if fmt != FORMAT:
            when = "older" if isinstance(fmt, int) and fmt < FORMAT else "newer"
            commit = written_by() if written_by else None
            raise RunDirError(f"{path} format", fmt, f"written by an {when} vrun (this one reads format {FORMAT})",
                              "read it with the vrun that wrote it" + (f" (git commit {commit[:12]})" if commit
                                                                       else "") + ", or plan the run again with "
                              "this one")
        rec = typed(cls, data, str(path))
        _bounded(rec, str(path))
        return rec


def _bounded(rec: "PlanRecord", where: str) -> None:
    """The counts the verbs loop over or draw (the mesh, the nodes SLURM was asked for) within what the planner
    writes: an integer 1–MAX_WORLD, the mesh's world its nodes × GPUs per node."""
    m = rec.mesh
    counts = {f"mesh.{f.name}": getattr(m, f.name) for f in dataclasses.fields(m)}
    counts["torchrun.nproc_per_node"] = rec.torchrun.nproc_per_node
    if rec.slurm is not None:
        counts["slurm.parameters.nodes"] = rec.slurm.parameters.get("nodes", 1)
        counts["slurm.parameters.gpus_per_node"] = rec.slurm.parameters.get("gpus_per_node", 1)
    for k, n in counts.items():
        if not count_ok(n):
            raise RunDirError(f"{where} {k}", str(n)[:40], f"not a count the planner writes (an integer "
                              f"1–{MAX_WORLD:,})", "plan the run again")
    if m.world != m.nnodes * m.gpus_per_node:
        raise RunDirError(f"{where} mesh.world", m.world, f"not mesh.nnodes × mesh.gpus_per_node "
                          f"({m.nnodes}×{m.gpus_per_node})", "plan the run again")


def typed(cls: Any, data: Any, where: str, key: str = "") -> Any:
    """`data` (JSON) as `cls` (a dataclass, a builtin, list[T], dict[str, T], Optional[T]), checked field by field;
    unknown fields are dropped (a field added within a format has a default)."""
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin is typing.Union:  # Optional[T]
        if data is None:
            return None
        return typed(next(a for a in args if a is not type(None)), data, where, key)
    if dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise _wrong(where, key, data, "JSON object")
        hints = typing.get_type_hints(cls)
        out = {}
        for f in dataclasses.fields(cls):
            sub = f"{key}.{f.name}" if key else f.name
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise RunDirError(f"{where} {sub}", "missing", "a field the file must have is missing",
                                      "plan the run again")
                continue
            out[f.name] = typed(hints[f.name], data[f.name], where, sub)
        return cls(**out)
    if origin is list:
        if not isinstance(data, list):
            raise _wrong(where, key, data, "JSON list")
        return [typed(args[0], v, where, f"{key}[{i}]") for i, v in enumerate(data)] if args else data
    if origin is dict:
        if not isinstance(data, dict):
            raise _wrong(where, key, data, "JSON object")
        return {k: typed(args[1], v, where, f"{key}.{k}") for k, v in data.items()} if args else data
    want = {int: (int,), float: (int, float), str: (str,), bool: (bool,), dict: (dict,), list: (list,)}.get(cls)
    if want is None:
        return data
    if not isinstance(data, want) or (isinstance(data, bool) and cls is not bool):
        raise _wrong(where, key, data, {int: "integer", float: "number", str: "string", bool: "boolean",
                                        dict: "JSON object", list: "JSON list"}[cls])
    return float(data) if cls is float else data


def _wrong(where: str, key: str, data: Any, what: str) -> RunDirError:
    return RunDirError(f"{where} {key}".rstrip(), type(data).__name__, f"not a {what}", "plan the run again")

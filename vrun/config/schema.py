"""Typed schema of the run config (conf/run.yaml and its groups).

Registered in Hydra's ConfigStore as the base of the primary config, so a misspelled key or a value outside a
closed choice (mode, optimizer, algo entrypoint, cluster) fails at composition with the key named. After
composition `typed()` turns the config into these dataclasses once; everything after reads attributes.
The `engine`, `optim`, `recipe` and `verl` nodes hold verl keys: they are open here and checked against
verl's own tree at plan time (vrun.compose.verl_tree).
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Dict, List, Mapping, Optional

# omegaconf.MISSING's value, spelled here so that the schema imports without OmegaConf (the conf/ lint
# reads vrun.estimate.mesh, which uses Arch)
MISSING: Any = "???"


class Choice(str, Enum):
    """A closed choice: compares and prints as its value (interpolations, JSON and YAML see the plain string)."""

    def __str__(self) -> str:
        return self.value


class Mode(Choice):
    plan = "plan"            # write and print the plan only
    preflight = "preflight"  # plan + the checks that need the target environment
    train = "train"          # plan, preflight, launch


class OptimizerName(Choice):
    # Megatron Lite's optimizers (engine.impl_cfg.optimizer)
    fsdp2 = "fsdp2"
    dist_opt = "dist_opt"


class OnStall(Choice):
    report = "report"    # diagnose and report; the job keeps its allocation
    cancel = "cancel"    # report, then cancel the job once run.stall_grace_s more pass without a step
    requeue = "requeue"  # report, then (after the grace) submit it again excluding the odd rank's node, and cancel


class EntrypointName(Choice):
    ppo = "ppo"  # verl.trainer.main_ppo on Ray (GRPO, DAPO)
    sft = "sft"  # verl.trainer.sft_trainer under torchrun


class ClusterName(Choice):
    local = "local"  # this machine
    slurm = "slurm"  # submitted through submitit, one task per node
    ray = "ray"      # submitted to a standing Ray cluster through its Job Submission API
    kuberay = "kuberay"  # a RayJob manifest for a KubeRay operator (its own Ray cluster per job), kubectl-applied


@dataclass
class Arch:
    """Architecture facts the plan checks need (the checkpoint's config.json is the truth when present)."""
    layers: int = MISSING
    dense_layers: int = 0
    routed_experts: int = MISSING
    experts_per_token: int = MISSING
    shared_experts: int = 0
    heads: int = MISSING
    # null for MLA attention (no separate KV heads to shard)
    kv_heads: Optional[int] = None
    head_dim: Optional[int] = None
    hidden: int = MISSING
    vocab: Optional[int] = None
    mtp_layers: int = 0
    # DeepSeek-V4 output-projection groups: rollout TP must divide them
    o_groups: Optional[int] = None
    # Qwen3.5 gated-delta-net heads: TP must divide them
    gdn_k_heads: Optional[int] = None
    gdn_v_heads: Optional[int] = None
    # FFN widths for the memory estimate without a checkpoint (moe_intermediate_size, intermediate_size)
    expert_ffn_hidden: Optional[int] = None
    dense_ffn_hidden: Optional[int] = None
    # --- attention and extras for the parameter count and the KV cache (vrun/estimate/params.py, vrun/estimate/rollout.py) ---
    # mla | mla_dsa | csa | gdn_hybrid | gqa
    attention: str = "gqa"
    q_lora_rank: Optional[int] = None
    kv_lora_rank: Optional[int] = None
    qk_nope_head_dim: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None
    v_head_dim: Optional[int] = None
    # sparse-attention indexer (GLM-5 DSA, DeepSeek-V4 CSA): heads × head dim, keys selected per query
    index_heads: Optional[int] = None
    index_head_dim: Optional[int] = None
    index_topk: Optional[int] = None
    # DeepSeek-V4: grouped low-rank output, sliding window, per-layer compression (0 window only, 4, 128),
    # mHC residual streams
    o_lora_rank: Optional[int] = None
    sliding_window: Optional[int] = None
    compress_ratios: List[int] = field(default_factory=list)
    hc_mult: Optional[int] = None
    # Qwen3.5: gated-delta-net head dim and conv kernel, one full-attention layer every N, gated attention output
    gdn_head_dim: Optional[int] = None
    gdn_conv_kernel: int = 4
    full_attention_interval: Optional[int] = None
    attn_output_gate: bool = False
    shared_expert_ffn_hidden: Optional[int] = None
    # vision tower: its facts (depth, hidden, ffn, patch, temporal_patch, in_channels, merge, positions), or a
    # published parameter figure
    vision: Dict[str, int] = field(default_factory=dict)
    vision_params: Optional[int] = None
    # facts that are not sourced (shown with the counts)
    estimates: List[str] = field(default_factory=list)
    source: str = ""

    @classmethod
    def of(cls, m: Mapping[str, Any]) -> "Arch":
        """From a mapping that may hold only some of the fields (a model file read as YAML)."""
        return cls(**{f.name: m[f.name] for f in fields(cls) if f.name in m})

    def facts(self) -> dict:
        """The fields as a mapping, for the arithmetic that reads them by name (vrun.estimate.params, memory, rollout)."""
        return dict(vars(self))


@dataclass
class WeightFormats:
    dense: str = "bf16"
    experts: str = "bf16"
    source: str = ""


@dataclass
class Model:
    name: str = MISSING
    # Megatron Lite model family (engine.model_name): deepseek_v4, glm5, kimi_k2, qwen3_5
    mlite_name: str = MISSING
    # explicit checkpoint path; when null, path_env, then MODEL_PATH (single-model runs only), then default_path
    path: Optional[str] = None
    path_env: str = MISSING
    default_path: Optional[str] = None
    # TP and ETP values Megatron Lite implements for the family (every model file says; make lint checks)
    tp_allowed: List[int] = MISSING
    etp_allowed: List[int] = MISSING
    arch: Arch = field(default_factory=Arch)
    # the released checkpoint's weight formats, as vLLM loads them for the rollout (vrun/estimate/rollout.py Formats):
    # bf16, fp8 (block-scaled), fp4 (MXFP4) or int4; a checkpoint's config.json quantization_config wins
    weights: WeightFormats = field(default_factory=lambda: WeightFormats())
    # environment the model's runtime needs (vLLM switches and the like)
    env: Dict[str, str] = field(default_factory=dict)
    # Python modules the training runtime needs besides verl/verl_mlite (checked in preflight)
    requires: List[str] = field(default_factory=list)


@dataclass
class MeshConfig:
    # the mesh knobs as composed (conf/mesh); the validated mesh with DP/EDP derived is vrun.estimate.mesh.Mesh
    nnodes: int = 1
    gpus_per_node: int = 8
    # mesh=auto: search every valid mesh for nnodes × gpus_per_node and take the best (tp..cp are then ignored)
    search: bool = False
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int = 1
    cp: int = 1


@dataclass
class Optimizer:
    # Megatron Lite optimizer (engine.impl_cfg.optimizer): fsdp2 or dist_opt
    name: OptimizerName = MISSING


@dataclass
class Algo:
    name: str = MISSING
    # which verl entrypoint runs it: ppo (verl.trainer.main_ppo on Ray) or sft (verl.trainer.sft_trainer, torchrun)
    entrypoint: EntrypointName = MISSING
    # DAPO's dynamic sampling (algorithm.filter_groups): false plans DAPO without it, e.g. on a verl that lacks it
    dynamic_sampling: Optional[bool] = None


@dataclass
class Data:
    name: str = MISSING
    # the rows carry images (verl's data.image_key column): only a model with a vision tower reads them
    images: bool = False


@dataclass
class RayCfg:
    # "local": start a fresh local Ray instance; "auto" or "host:port": join a running cluster
    address: str = "local"
    num_cpus: Optional[int] = None
    num_gpus: Optional[int] = None
    # SLURM: network interface whose IPv4 address the nodes use (e.g. ib0); null: the hostname's address
    interface: Optional[str] = None
    # SLURM: seconds the head waits for every node to join before failing the job, naming the missing ones
    join_timeout_s: int = 300
    # RAY_AUTH_MODE, set identically on every node (a head with token auth rejects token-less workers)
    auth_mode: str = "disabled"
    # cluster=ray: seconds any request to the cluster's dashboard may take (a lost connection is one line)
    dashboard_timeout_s: float = 15.0


@dataclass
class KubeRayCfg:
    """cluster=kuberay: the RayJob the operator runs (vrun/launch/kuberay.py)."""
    # the pods' image: it holds this project, verl, verl_mlite and vLLM at the plan's stack (the entry checks it)
    image: Optional[str] = None
    namespace: str = "default"
    # a PersistentVolumeClaim (ReadWriteMany) mounted at mount_path in every pod: the run dir is under it
    # (plan.json, verl_config.yaml, checkpoints, progress), as on this machine
    claim: Optional[str] = None
    mount_path: Optional[str] = None
    # the Kubernetes Secret the pass_env variables come from (each under its own name as the key); their values never
    # enter the manifest
    env_from: Optional[str] = None
    # the resource name of one GPU in a pod's limits
    gpu_resource: str = "nvidia.com/gpu"
    # seconds the finished job's Ray cluster is kept before the operator deletes it
    ttl_s: int = 600
    # kubectl apply -f <run dir>/rayjob.yaml after the checks (kubectl on PATH); false: the file is the hand-off
    apply: bool = False
    # the uid/gid the pods run as (securityContext runAsUser/runAsGroup/fsGroup); null: the planner's own, who owns
    # the run dir. Another (a site's required uid): the job's entry is told to trust the planner's files
    run_as_uid: Optional[int] = None
    run_as_gid: Optional[int] = None


@dataclass
class Cluster:
    name: ClusterName = MISSING
    ray: RayCfg = field(default_factory=RayCfg)
    kuberay: KubeRayCfg = field(default_factory=KubeRayCfg)
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    # sbatch --time, minutes
    time_min: int = 240
    # torchrun rendezvous port of a local SFT run (on SLURM the port comes from the job id: jobs sharing a node)
    master_port: int = 29500
    # SLURM submission (vrun.launch.slurm.submit.Submission reads these; hydra.launcher.* given by hand sets them)
    cpus_per_task: Optional[int] = None
    mem_gb: Optional[int] = None
    constraint: Optional[str] = None
    # sbatch --job-name; null: run.experiment_name
    job_name: Optional[str] = None
    # lines in the sbatch script before srun (modules, containers, env activation)
    setup: List[str] = field(default_factory=list)
    # lines each node runs before Ray / torchrun starts (bash; a failure fails the node)
    node_setup: List[str] = field(default_factory=list)
    additional_parameters: Dict[str, Any] = field(default_factory=dict)
    # requeues on time limit; preemptions always requeue (submitit's checkpoint())
    max_requeues: int = 3
    # attempts in a row that end without a newer whole checkpoint (whatever ended each: a requeue, a stall's requeue,
    # a node failure, a Ray job submitted again) before the run is stopped instead of started again; 0: never
    no_progress_attempts: int = 3
    # seconds before the time limit SLURM signals the job (USR2) so it can requeue itself
    signal_delay_s: int = 120
    # submissions above this many GPU-hours need a confirmation (or cluster.yes=true when not interactive)
    confirm_gpu_hours: float = 1000.0
    yes: bool = False
    # submit, print the job ids and log paths, and return without waiting
    detach: bool = False
    # the GPU part (vrun/estimate/hardware.py lists them and their memory); gpu_mem_gib, when set, overrides its memory
    gpu: str = "H100"
    gpu_mem_gib: Optional[float] = None
    # price of one GPU-hour (any currency): the plan's cost line multiplies its GPU-hours by it when set
    gpu_hour_price: Optional[float] = None
    # SLURM mode=train: the preflight checks that need no GPU run on this machine before sbatch; false where the
    # nodes' environment differs from this one (each node then runs them first thing in the job)
    login_preflight: bool = True
    # paths private to each node: a run dir, checkout, venv, model or data under one is refused before sbatch
    node_local_paths: List[str] = field(default_factory=lambda: ["/tmp", "/dev/shm", "/run"])


@dataclass
class RunSettings:
    # the `run` group; a run dir read back is vrun.rundir.state.Run
    project_name: str = MISSING
    experiment_name: str = MISSING
    # write rollout generations under <run dir>/rollouts (verl's trainer.rollout_data_dir)
    dump_rollouts: bool = False
    # Ray actor class (import path) that verl's run_ppo starts; null: verl's own TaskRunner
    task_runner: Optional[str] = None
    # preflight fails when the memory estimate exceeds cluster.gpu_mem_gib, unless this is true
    allow_memory_overrun: bool = False
    # what torchrun runs for SFT (python -m ...); verl_mlite.launch applies Megatron Lite's runtime patches
    sft_entry: List[str] = field(default_factory=lambda: ["verl_mlite.launch", "verl.trainer.sft_trainer"])
    # plan into a dir that already holds this run (the same plan): continue it (verl resumes its checkpoints)
    resume: bool = False
    # a checkpoint saved under another mesh may be resumed (Megatron Lite reshards it; the plan says what changed)
    resume_mesh_change: bool = False
    # seconds without a verl step before the job counts as stalled; null: 3 × the plan's step high end, at least
    # 10 min (the first step of an attempt also gets the model load: vrun/planning/watch.py)
    stall_after_s: Optional[float] = None
    # what a stall does (after a diagnosis under <run dir>/stalls/<n>/): report | cancel | requeue
    on_stall: OnStall = OnStall.cancel
    # seconds after the report before cancel/requeue acts (a step in between calls it off); null: stall_after_s
    stall_grace_s: Optional[float] = None


@dataclass
class RunConfig:
    # plan: write and print the plan only; preflight: plan + target-environment checks; train: launch
    mode: Mode = Mode.train
    model: Model = field(default_factory=Model)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    optimizer: Optimizer = field(default_factory=Optimizer)
    algo: Algo = field(default_factory=Algo)
    data: Data = field(default_factory=Data)
    cluster: Cluster = field(default_factory=Cluster)
    run: RunSettings = field(default_factory=RunSettings)
    # verl engine keys (actor_rollout_ref.actor.engine for PPO, engine for SFT)
    engine: Dict[str, Any] = field(default_factory=dict)
    # verl optimizer keys (actor_rollout_ref.actor.optim for PPO, optim for SFT)
    optim: Dict[str, Any] = field(default_factory=dict)
    # verl keys per entrypoint, written by the group files: recipe.ppo (ppo_trainer), recipe.sft (sft_trainer)
    recipe: Dict[str, Any] = field(default_factory=dict)
    # extra environment for the run (set before Ray starts and carried to every worker)
    env: Dict[str, str] = field(default_factory=dict)
    # names of variables passed from the launching environment to the workers, values never written
    pass_env: List[str] = field(default_factory=list)
    # pass-through: any verl key of the entrypoint's tree, e.g. verl.trainer.save_freq=10
    verl: Dict[str, Any] = field(default_factory=dict)


def schema_node():
    from omegaconf import OmegaConf

    node = OmegaConf.structured(RunConfig)
    # the pass-through takes any key without a `+` (checked against verl's tree at plan time)
    for open_node in ("verl", "recipe", "engine", "optim", "env"):
        OmegaConf.set_struct(node[open_node], False)
    return node


def register() -> None:
    """The schema conf/ composes against (run_schema). The launchers register themselves where Hydra discovers
    plugins (hydra_plugins/vrun_launcher: `register` stores this schema too)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="run_schema", node=schema_node())


def typed(cfg: Any, resolved: Optional[dict] = None) -> RunConfig:
    """The composed config (Hydra's node, or the same as plain containers) as the schema's objects, resolved.
    resolved: that node already resolved into plain containers (OmegaConf.to_container(cfg, resolve=True)): its
    values passed the schema's checks when the node was composed, so they are put into the objects directly (a
    sweep does this at every point; tests/test_sweep.py holds both paths equal)."""
    from omegaconf import DictConfig, OmegaConf

    if resolved is not None and isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is RunConfig and \
            not _has_missing(resolved):  # a missing value: OmegaConf's own error below
        return _objects(RunConfig, resolved)
    if not (isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is RunConfig):
        cfg = OmegaConf.merge(schema_node(), cfg)
    return OmegaConf.to_object(cfg)


@functools.lru_cache(maxsize=None)
def _nested(cls) -> tuple:
    """(field name, its dataclass or None) for each field of a schema dataclass."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name] if dataclasses.is_dataclass(hints[f.name]) else None)
                 for f in dataclasses.fields(cls))


def _has_missing(x) -> bool:
    if isinstance(x, dict):
        return any(_has_missing(v) for v in x.values())
    if isinstance(x, list):
        return any(_has_missing(v) for v in x)
    return isinstance(x, str) and x == MISSING


def _objects(cls, values: dict):
    return cls(**{name: _objects(sub, values[name]) if sub is not None else values[name]
                  for name, sub in _nested(cls) if name in values})

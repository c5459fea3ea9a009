"""A plan: everything a run will do, computed and checked before anything starts.

make_plan() is the one place that turns a resolved run config into the verl config, the command, the
environment and the mesh; train mode executes exactly that plan. No torch, ray or verl imports here.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from vrun import checks, mlite, translate, verl_tree
from vrun.mesh import Mesh
from vrun.problems import SECRETISH, PlanError, Problem

UNSET_WITH_CUDA = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Plan:
    cfg: dict
    run_dir: str
    verl: dict
    request: translate.VerlRequest
    mesh: Mesh
    entrypoint: str
    argv: list
    env: dict
    env_unset: list
    pass_env: list
    model_path: Optional[str]
    model_path_source: str
    mlite: mlite.MliteSource
    warnings: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "entrypoint": self.entrypoint, "argv": self.argv, "env": self.env, "env_unset": self.env_unset,
            "pass_env": self.pass_env, "mesh": self.mesh.summary(), "run_dir": self.run_dir,
            "model": {"name": self.cfg["model"]["name"], "path": self.model_path, "path_from": self.model_path_source},
            "algo": self.cfg["algo"]["name"], "optimizer": self.cfg["optimizer"]["name"],
            "verl_config": f"{self.run_dir}/verl_config.yaml", "verl_config_name": self.request.config_name,
            "verl_groups": list(self.request.groups), "verl_overrides": [o.cli() for o in self.request.overrides],
            "mlite": {"source": self.mlite.kind, "location": self.mlite.location},
            "batch": batch_summary(self),
            "warnings": [w.line() for w in self.warnings],
        }


def resolve_model_path(model: dict, environ: dict, single_model: bool) -> tuple[Optional[str], str, list[Problem]]:
    if model.get("path"):
        return model["path"], "model.path", []
    env_name = model["path_env"]
    if environ.get(env_name):
        return environ[env_name], env_name, []
    if environ.get("MODEL_PATH"):
        if single_model:
            return environ["MODEL_PATH"], "MODEL_PATH", []
        return None, "MODEL_PATH", [Problem("MODEL_PATH", environ["MODEL_PATH"],
                                            "this sweep plans several models; MODEL_PATH would put every one on one "
                                            "checkpoint", f"set {env_name} (and each model's own variable)")]
    if model.get("default_path"):
        return model["default_path"], "default", []
    return None, "unset", [Problem(env_name, None, f"no checkpoint path for {model['name']}",
                                   f"export {env_name}=/path/to/checkpoint or model.path=...", warning=True)]


def run_env(cfg: dict, environ: dict) -> tuple[dict, list, list[Problem]]:
    """Variables the run sets (in the environment Ray/torchrun start from, and in Ray's runtime env)."""
    env: dict[str, str] = {}
    problems = []
    for src in (cfg.get("env") or {}, cfg["model"].get("env") or {}):
        for k, v in src.items():
            if SECRETISH.search(k):
                problems.append(Problem(f"env.{k}", "<hidden>", "a secret's value would be written into the plan "
                                        "and the verl config", f"export {k} and add it to pass_env instead"))
                continue
            env[k] = str(v)
    # Megatron Lite's paths (its sitecustomize must run in every worker), then this project (vrun.entry)
    paths = mlite.mlite_paths(environ) + [str(PROJECT_ROOT)]
    env["PYTHONPATH"] = ":".join(paths + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))
    unset = list(UNSET_WITH_CUDA) if environ.get("CUDA_VISIBLE_DEVICES") else []
    return env, unset, problems


def make_plan(cfg: dict, run_dir: str, *, single_model: bool = True, environ: Optional[dict] = None,
              python: Optional[str] = None) -> Plan:
    """cfg: the resolved run config as plain containers. Raises PlanError with every error found."""
    environ = dict(os.environ if environ is None else environ)
    run_dir = str(Path(run_dir).absolute())
    problems: list[Problem] = []
    path, path_from, p = resolve_model_path(cfg["model"], environ, single_model)
    problems += p
    env, unset, p = run_env(cfg, environ)
    problems += p
    req = translate.build(cfg, run_dir, env,
                          path if path else f"<unset: {cfg['model']['path_env']}>")
    problems += req.problems
    tree = verl_tree.base_tree(req.config_name, req.groups)
    problems += verl_tree.apply(tree, req.overrides)
    if [x for x in problems if not x.warning]:
        raise PlanError(problems)
    resolved = verl_tree.resolve(tree)
    problems += checks.check_all(cfg, resolved)
    if [x for x in problems if not x.warning]:
        raise PlanError(problems)
    mesh = Mesh.of(cfg["mesh"])
    python = python or sys.executable
    entry, argv = command(cfg, run_dir, mesh, python)
    source = mlite.find_source()
    warnings = [x for x in problems if x.warning]
    if source.kind == "record":
        warnings.append(Problem("verl_mlite", None, "not importable: planned against the project's record of "
                                f"its config (Megatron-LM {mlite.record()['megatron_lm_commit'][:8]})",
                                "export MLITE_ROOT=/path/to/Megatron-LM for preflight and train", warning=True))
    return Plan(cfg=cfg, run_dir=run_dir, verl=resolved, request=req, mesh=mesh, entrypoint=entry, argv=argv,
                env=env, env_unset=unset, pass_env=list(cfg.get("pass_env") or []), model_path=path,
                model_path_source=path_from, mlite=source, warnings=warnings)


def command(cfg: dict, run_dir: str, mesh: Mesh, python: str, node_rank: int = 0,
            master_addr: str = "127.0.0.1") -> tuple[str, list]:
    if cfg["algo"]["entrypoint"] == "ppo":
        argv = [python, "-m", "vrun.entry", "ppo", "--config", f"{run_dir}/verl_config.yaml"]
        if cfg["run"].get("task_runner"):
            argv += ["--task-runner", cfg["run"]["task_runner"]]
        for name in cfg.get("pass_env") or []:
            argv += ["--pass-env", name]
        return "verl.trainer.main_ppo:run_ppo", argv
    torchrun = Path(python).parent / "torchrun"
    argv = [str(torchrun) if torchrun.exists() else "torchrun", "--nnodes", str(mesh.nnodes),
            "--nproc_per_node", str(mesh.gpus_per_node), "--node_rank", str(node_rank),
            "--master_addr", master_addr, "--master_port", str(cfg["cluster"].get("master_port", 29500)),
            "-m", "verl_mlite.launch", "verl.trainer.sft_trainer",
            "--config-path", run_dir, "--config-name", "verl_config",
            f"hydra.run.dir={run_dir}/sft", "hydra.output_subdir=null"]
    return "verl.trainer.sft_trainer (torchrun, verl_mlite.launch)", argv


def batch_summary(plan: Plan) -> dict:
    v, m = plan.verl, plan.mesh
    g = checks._get
    if plan.cfg["algo"]["entrypoint"] == "ppo":
        tbs, n = g(v, "data.train_batch_size"), g(v, "actor_rollout_ref.rollout.n")
        mini = g(v, "actor_rollout_ref.actor.ppo_mini_batch_size")
        rtp = g(v, "actor_rollout_ref.rollout.tensor_model_parallel_size")
        return {"train_batch_size": tbs, "n": n, "samples_per_step": tbs * n, "mini_batch_size": mini,
                "updates_per_step": tbs // mini, "samples_per_dp_rank": tbs * n // m.dp,
                "dynamic_bsz": g(v, "actor_rollout_ref.actor.use_dynamic_bsz"),
                "max_token_len_per_gpu": g(v, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
                "prompt_length": g(v, "data.max_prompt_length"), "response_length": g(v, "data.max_response_length"),
                "rollout": {"engine": g(v, "actor_rollout_ref.rollout.name"), "tp": rtp,
                            "replicas": m.world // rtp, "gpu_memory_utilization":
                                g(v, "actor_rollout_ref.rollout.gpu_memory_utilization")}}
    tbs = g(v, "data.train_batch_size")
    return {"train_batch_size": tbs, "per_dp_rank": tbs // m.dp, "micro_batch_size_per_gpu":
            g(v, "data.micro_batch_size_per_gpu"), "dynamic_bsz": g(v, "data.use_dynamic_bsz"),
            "max_token_len_per_gpu": g(v, "data.max_token_len_per_gpu"), "max_length": g(v, "data.max_length")}


def write(plan: Plan) -> None:
    import yaml

    d = Path(plan.run_dir)
    d.mkdir(parents=True, exist_ok=True)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    (d / "verl_config.yaml").write_text(yaml.dump(plan.verl, Dumper=dumper, sort_keys=False,
                                                  default_flow_style=False))
    (d / "plan.json").write_text(json.dumps(plan.to_json(), indent=2) + "\n")


def table(plan: Plan) -> str:
    m, c = plan.mesh, plan.cfg
    b = batch_summary(plan)
    rows = [
        f"run     {c['model']['name']} · {c['algo']['name']} · optimizer {c['optimizer']['name']} · cluster "
        f"{c['cluster']['name']} · mode {c['mode']}",
        f"GPUs    {m.world} = {m.nnodes} node(s) × {m.gpus_per_node}",
        f"dense   TP{m.tp} · CP{m.cp} · PP{m.pp} · DP{m.dp} = {m.world}",
        f"expert  ETP{m.etp} · EP{m.ep} · PP{m.pp} · EDP{m.edp} = {m.world}   (vpp {m.vpp})",
    ]
    if c["algo"]["entrypoint"] == "ppo":
        r = b["rollout"]
        rows += [
            f"batch   {b['train_batch_size']} prompts × n {b['n']} = {b['samples_per_step']} samples/step; "
            f"mini {b['mini_batch_size']} → {b['updates_per_step']} update(s)/step; "
            f"{b['samples_per_dp_rank']} samples per DP rank",
            f"tokens  prompt {b['prompt_length']} + response {b['response_length']}; dynamic bsz "
            f"{b['dynamic_bsz']}, {b['max_token_len_per_gpu']} tokens/GPU",
            f"rollout {r['engine']} TP{r['tp']} × {r['replicas']} replicas, gpu_memory_utilization "
            f"{r['gpu_memory_utilization']}",
        ]
    else:
        rows += [f"batch   {b['train_batch_size']} sequences/step, {b['per_dp_rank']} per DP rank; dynamic bsz "
                 f"{b['dynamic_bsz']}, {b['max_token_len_per_gpu']} tokens/GPU, max_length {b['max_length']}"]
    rows += [
        f"model   {plan.model_path or '(unset)'}  [{plan.model_path_source}]",
        f"entry   {plan.entrypoint}",
        f"verl    {plan.request.config_name} + {len(plan.request.overrides)} overrides; verl_mlite from "
        f"{plan.mlite.kind}",
        f"run dir {plan.run_dir}",
    ]
    rows += [w.line() for w in plan.warnings]
    return "\n".join(rows)


def one_line(idx: int, overrides, plan: Plan) -> str:
    m = plan.mesh
    return (f"point {idx} [{' '.join(overrides)}]: {m.world} GPUs TP{m.tp} CP{m.cp} PP{m.pp} DP{m.dp} "
            f"EP{m.ep} ETP{m.etp} EDP{m.edp} → {plan.run_dir}")

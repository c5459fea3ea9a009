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

from vrun import checks, dotted, mlite, translate, verl_tree
from vrun.mesh import Mesh
from vrun.memory import GIB
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
    memory: Optional[object] = None          # vrun.memory.Estimate
    memory_note: str = ""
    search: Optional[dict] = None            # mesh=auto: what was searched and the top alternatives
    checkpoint: Optional[dict] = None        # parameter counts read from the checkpoint

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
            "memory": self.memory.summary() if self.memory is not None else {"unavailable": self.memory_note},
            "mesh_search": self.search,
            "checkpoint": self.checkpoint,
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
    placeholder = path if path else f"<unset: {cfg['model']['path_env']}>"
    req, resolved = _verl(cfg, run_dir, env, placeholder, problems)
    params, params_note, ckpt = model_params(cfg, path, problems)
    search = None
    if cfg["mesh"].get("search"):
        cfg, search = _search(cfg, resolved, params, params_note, problems)
        req, resolved = _verl(cfg, run_dir, env, placeholder, problems)
    found = checks.check_all(cfg, resolved)
    problems += found
    hints = mesh_hints(cfg, resolved, found)
    if [x for x in problems if not x.warning]:
        raise PlanError(problems, hints=hints)
    mesh = Mesh.of(cfg["mesh"])
    python = python or sys.executable
    entry, argv = command(cfg, run_dir, mesh, python)
    source = mlite.find_source()
    warnings = [x for x in problems if x.warning]
    if source.kind == "record":
        warnings.append(Problem("verl_mlite", None, "not importable: planned against the project's record of "
                                f"its config (Megatron-LM {mlite.record()['megatron_lm_commit'][:8]})",
                                "export MLITE_ROOT=/path/to/Megatron-LM for preflight and train", warning=True))
    est = memory_estimate(cfg, resolved, mesh, params) if params is not None else None
    if est is not None and not est.fits:
        warnings.append(Problem("memory", f"{est.peak / GIB:.1f}GiB", f"the estimate exceeds the "
                                f"{cfg['cluster']['gpu_mem_gib']} GiB per GPU of cluster.gpu_mem_gib "
                                f"(stage {est.stage}: {est.layers_on_stage} layers)",
                                "a larger PP·EP mesh, more offload, a smaller token budget, or mesh=auto",
                                warning=True))
    return Plan(cfg=cfg, run_dir=run_dir, verl=resolved, request=req, mesh=mesh, entrypoint=entry, argv=argv,
                env=env, env_unset=unset, pass_env=list(cfg.get("pass_env") or []), model_path=path,
                model_path_source=path_from, mlite=source, warnings=warnings, memory=est,
                memory_note=params_note, search=search, checkpoint=ckpt)


def _verl(cfg: dict, run_dir: str, env: dict, model_path: str, problems: list) -> tuple:
    """Compose verl's tree for this run config; raise on key problems."""
    req = translate.build(cfg, run_dir, env, model_path)
    tree = verl_tree.base_tree(req.config_name, req.groups)
    found = req.problems + verl_tree.apply(tree, req.overrides)
    if [x for x in problems + found if not x.warning]:
        raise PlanError(problems + found)
    return req, verl_tree.resolve(tree)


def model_params(cfg: dict, path: Optional[str], problems: list) -> tuple:
    """Parameter counts: the checkpoint's when it is on disk, else the model group's facts."""
    from vrun import memory

    if path and Path(os.path.expanduser(path)).is_dir():
        from vrun import checkpoint

        try:
            facts = checkpoint.read_checkpoint(os.path.expanduser(path))
        except (OSError, ValueError) as e:
            facts = None
            problems.append(Problem(cfg["model"]["path_env"], path, f"checkpoint headers unreadable ({e})",
                                    "check the checkpoint files", warning=True))
        if facts is not None:
            for line in checkpoint.cross_check(facts, cfg["model"]["arch"]):
                problems.append(Problem("model.arch", cfg["model"]["name"], line, "the checkpoint is the truth: "
                                        "fix conf/model or point at the right checkpoint", warning=True))
            p = params_from_checkpoint(facts, cfg["model"]["arch"])
            summary = checkpoint_summary(facts)
            if not facts.complete:
                problems.append(Problem("checkpoint", path, f"unknown tensor layouts: {facts.unknown[:3]}",
                                        "the counts exclude them", warning=True))
            return p, "", summary
    p, note = memory.params_from_arch(cfg["model"]["arch"])
    return p, note, None


def memory_inputs(cfg: dict, verl: dict) -> dict:
    """What the estimate reads from the run and verl configs (everything but the mesh)."""
    g = dotted.get
    ppo = cfg["algo"]["entrypoint"] == "ppo"
    eng = g(verl, "actor_rollout_ref.actor.engine" if ppo else "engine", {})
    optim = g(verl, "actor_rollout_ref.actor.optim" if ppo else "optim", {})
    if ppo:
        dyn = g(verl, "actor_rollout_ref.actor.use_dynamic_bsz")
        seq = (g(verl, "data.max_prompt_length") or 0) + (g(verl, "data.max_response_length") or 0)
        tokens = g(verl, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu") if dyn else \
            (g(verl, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") or 1) * seq
        rollout = g(verl, "actor_rollout_ref.rollout.gpu_memory_utilization") or 0.0
    else:
        dyn = g(verl, "data.use_dynamic_bsz")
        tokens = g(verl, "data.max_token_len_per_gpu") if dyn else \
            (g(verl, "data.micro_batch_size_per_gpu") or 1) * (g(verl, "data.max_length") or 0)
        rollout = 0.0
    recompute = g(eng, "impl_cfg.recompute")
    arch = cfg["model"]["arch"]
    return dict(
        optimizer=g(eng, "impl_cfg.optimizer"), hidden=arch["hidden"], vocab=arch.get("vocab") or 0,
        top_k=arch.get("experts_per_token") or 0, tokens_per_gpu=int(tokens or 0),
        recompute=bool(recompute) and recompute not in ("none", ["none"]),
        param_offload=bool(eng.get("param_offload")), grad_offload=bool(eng.get("grad_offload")),
        optimizer_offload=bool(eng.get("optimizer_offload")),
        offload_fraction=float(g(optim, "override_optimizer_config.offload_fraction") or 0.0),
        gpu_mem_gib=float(cfg["cluster"]["gpu_mem_gib"]), rollout_fraction=float(rollout),
        cross_entropy_fusion=bool(eng.get("cross_entropy_fusion") or g(eng, "impl_cfg.cross_entropy_fusion")))


def memory_estimate(cfg: dict, verl: dict, mesh: Mesh, params) -> object:
    from vrun import memory

    return memory.estimate(params, mesh, **memory_inputs(cfg, verl))


def _search(cfg: dict, verl: dict, params, note: str, problems: list) -> tuple:
    import time

    from vrun import search
    from vrun.mesh import Arch

    model = cfg["model"]
    m0 = cfg["mesh"]
    t = time.perf_counter()
    valid = search.valid_meshes(m0["nnodes"], m0["gpus_per_node"], Arch.of(model["arch"]), model["tp_allowed"],
                                model["etp_allowed"], model["name"], verl, cfg["algo"]["entrypoint"],
                                bool(dotted.get(cfg, "engine.impl_cfg.use_deepep", False)))
    if params is not None:
        from vrun import memory

        inputs = memory_inputs(cfg, verl)
        ranked = search.rank(valid, lambda m: memory.estimate(params, m, **inputs))
    else:
        ranked = search.rank(valid)
    seconds = time.perf_counter() - t
    if not ranked:
        raise PlanError(problems + [Problem("mesh", "auto", f"no mesh of {m0['nnodes']}×{m0['gpus_per_node']} GPUs "
                                            f"passes the plan's checks for {model['name']}",
                                            "change mesh.nnodes / mesh.gpus_per_node or the batch sizes")])
    best = ranked[0].mesh
    cfg = dict(cfg, mesh={**m0, **{k: getattr(best, k) for k in ("tp", "pp", "vpp", "ep", "etp", "cp")}})
    top = [{"overrides": " ".join(f"mesh.{k}={getattr(c.mesh, k)}" for k in ("tp", "pp", "ep", "cp", "etp")),
            "dp": c.mesh.dp, "edp": c.mesh.edp,
            "peak_gib": round(c.estimate.peak / GIB, 1) if c.estimate is not None else None, "fits": c.fits}
           for c in ranked[:6]]
    return cfg, {"valid_meshes": len(valid), "search_ms": round(seconds * 1000, 1), "chosen": top[0],
                 "alternatives": top[1:], "memory": "estimated" if params is not None else note,
                 "objective": "fits in memory, then smaller TP, smaller CP, EP within a node, fewer PP stages"}


def mesh_hints(cfg: dict, verl: dict, found: list) -> list[str]:
    """For mesh errors: valid meshes of the same GPU count that change one knob, then two."""
    if not any(p.key.startswith("mesh.") and not p.warning for p in found):
        return []
    from vrun import search
    from vrun.mesh import Arch

    model, m = cfg["model"], Mesh.of(cfg["mesh"])
    if any(not isinstance(getattr(m, k), int) or getattr(m, k) < 1 for k in ("nnodes", "gpus_per_node")):
        return []
    valid = search.valid_meshes(m.nnodes, m.gpus_per_node, Arch.of(model["arch"]), model["tp_allowed"],
                                model["etp_allowed"], model["name"], verl, cfg["algo"]["entrypoint"])
    one, two = search.neighbours(m, valid)
    out = []
    if one:
        out.append("valid meshes, one change: " + " | ".join(search.as_overrides(v, m) for v in one))
    if two:
        out.append("valid meshes, two changes: " + " | ".join(search.as_overrides(v, m) for v in two))
    if not valid:
        out.append(f"no mesh of {m.world} GPUs passes for {model['name']}: change mesh.nnodes")
    return out


def params_from_checkpoint(facts, arch: dict):
    """The estimate's units from the checkpoint's counts; a vision tower sits with the embedding on stage 0,
    the final norm with the output layer."""
    from vrun.memory import Params

    layers = max(list(facts.per_layer_dense) + list(facts.per_layer_expert) + [-1]) + 1
    n = facts.arch.get("layers") or layers
    dense = tuple(facts.per_layer_dense.get(i, 0) for i in range(n))
    expert = tuple(facts.per_layer_expert.get(i, 0) for i in range(n))
    t = facts.totals
    rest = t.get("dense", 0) - sum(dense) - facts.embedding - facts.output
    mtp = t.get("mtp", 0)
    m = (facts.arch.get("mtp_layers") or arch.get("mtp_layers") or 1) if mtp else 0
    return Params(embedding=facts.embedding + t.get("vision", 0), output=facts.output + max(rest, 0),
                  dense_per_layer=dense, expert_per_layer=expert, mtp_dense=mtp - facts.mtp_routed_expert,
                  mtp_expert=facts.mtp_routed_expert, mtp_layers=m, source=f"checkpoint ({facts.shards} shard(s))")


def checkpoint_summary(facts) -> dict:
    d = facts.to_dict()
    return {"path": d["path"], "model_type": d["model_type"], "totals": d["totals"], "complete": d["complete"],
            "excluded_scale_tensors": d["excluded_scale_tensors"], "dtypes": d["dtypes"],
            "per_layer_routed_expert": d["per_layer_expert"], "unknown": d["unknown"][:10],
            "problems": d["problems"][:10]}


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
            "-m", *cfg["run"].get("sft_entry", ["verl_mlite.launch", "verl.trainer.sft_trainer"]),
            "--config-path", run_dir, "--config-name", "verl_config",
            f"hydra.run.dir={run_dir}/sft", "hydra.output_subdir=null"]
    return "verl.trainer.sft_trainer (torchrun, verl_mlite.launch)", argv


def batch_summary(plan: Plan) -> dict:
    v, m = plan.verl, plan.mesh
    g = dotted.get
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
    rows += memory_rows(plan)
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


def memory_rows(plan: Plan) -> list[str]:
    rows = []
    if plan.search:
        s = plan.search
        rows.append(f"auto    {s['valid_meshes']} valid meshes searched in {s['search_ms']} ms; chosen "
                    f"{s['chosen']['overrides']} (peak {s['chosen']['peak_gib']} GiB)")
        for alt in s["alternatives"]:
            rows.append(f"        alternative {alt['overrides']}  DP{alt['dp']} EDP{alt['edp']}  peak "
                        f"{alt['peak_gib']} GiB{'' if alt['fits'] else '  (does not fit)'}")
    if plan.checkpoint:
        t = plan.checkpoint["totals"]
        b = lambda n: f"{n:,}"  # noqa: E731  (exact logical parameter counts)
        rows.append(f"params  checkpoint: {b(t['total'])} = dense {b(t['dense'])} + routed experts "
                    f"{b(t['routed_expert'])} + MTP {b(t['mtp'])} + vision {b(t['vision'])}"
                    f"{'' if plan.checkpoint['complete'] else ' (incomplete: unknown layouts)'}")
    e = plan.memory
    if e is None:
        rows.append(f"memory  no estimate: {plan.memory_note}")
        return rows
    g = lambda x: f"{x / GIB:.1f}"  # noqa: E731
    rows.append(f"memory  per GPU, stage {e.stage} ({e.layers_on_stage} layers): weights {g(e.weights)} + grads "
                f"{g(e.grads)} + optimizer {g(e.optimizer)} + activations {g(e.activations)} + logits "
                f"{g(e.logits)} = {g(e.train_peak)} GiB training")
    rows.append(f"        rollout {g(e.rollout)} + actor residents {g(e.rollout_residents)} GiB; peak {g(e.peak)} of "
                f"{g(e.gpu_mem)} GiB {'(fits)' if e.fits else '(DOES NOT FIT)'}  [params: {e.params_source}]")
    return rows

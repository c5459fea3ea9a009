"""The preflight task runner: verl's run_ppo starts it instead of verl's TaskRunner, on the run's own Ray
cluster. It inspects every node — hostname, the GPUs Ray gives a task and the CUDA devices the process sees,
the run's variables as a Ray worker on that node sees them, the checkpoint and data files, verl_mlite and vLLM
importable — and writes <run dir>/preflight.json. It is the run minus training."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import ray

from vrun.core import dotted, fs, writer
from vrun.entrypoints import PPO, ROLLOUT

WATCH_PREFIXES = ("CUDA_", "VLLM_", "NCCL_", "RAY_AUTH_MODE", "PYTHONPATH", "ROCR_", "HIP_", "HF_HOME")


def node_report(config: dict) -> dict:
    import importlib.util

    paths = {}
    model = dotted.get(config, f"{PPO.model}.path")
    paths["model"] = {"path": model, "readable": fs.readable(os.path.expanduser(model))}
    for key in ("train_files", "val_files"):
        v = config["data"].get(key)
        for f in ([v] if isinstance(v, str) else list(v or [])):
            paths[f"data.{key}:{f}"] = {"path": f, "readable": fs.readable(os.path.expanduser(f))}
    cuda = None
    try:
        import torch

        cuda = torch.cuda.device_count()
    except ImportError:
        pass
    return {
        "host": socket.gethostname(),
        "ray_gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_device_count": cuda,
        "env": {k: v for k, v in os.environ.items() if k.startswith(WATCH_PREFIXES)},
        "paths": paths,
        "modules": {m: importlib.util.find_spec(m) is not None
                    for m in {"verl_mlite", "vllm", "verl", rollout_module(config)} - {None}},
    }


def rollout_module(config: dict) -> str | None:
    """The module the rollout engine imports (actor_rollout_ref.rollout.name), None for none."""
    name = str(dotted.get(config, f"{ROLLOUT}.name", "") or "")
    return {"vllm": "vllm", "sglang": "sglang"}.get(name)


def node_problems(r: dict, config: dict) -> list:
    """What keeps a node from training: a module the run imports missing, GPUs Ray gives that torch cannot use."""
    out = [f"{r['host']}: python module {m} is not importable (the run imports it)"
           for m in ("verl", "verl_mlite", rollout_module(config)) if m and not r["modules"].get(m)]
    want = len(r["ray_gpu_ids"])
    if want and (r["cuda_device_count"] or 0) < want:
        out.append(f"{r['host']}: torch sees {r['cuda_device_count'] or 0} GPU(s) of the {want} Ray gives "
                   f"(CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']}): no usable GPU or driver")
    return out


@ray.remote(num_cpus=0)
class PreflightTaskRunner:
    def run(self, config) -> dict:
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(config, resolve=True)
        probe = ray.remote(num_cpus=0)(node_report)
        nodes = [n for n in ray.nodes() if n["Alive"]]
        refs = []
        for n in nodes:
            gpus = n["Resources"].get("GPU", 0)
            opts = {"resources": {f"node:{n['NodeManagerAddress']}": 0.001}}
            if gpus:
                opts["num_gpus"] = gpus
            refs.append(probe.options(**opts).remote(cfg))
        reports = ray.get(refs)
        env_vars = cfg["ray_kwargs"]["ray_init"]["runtime_env"].get("env_vars", {})
        problems = []
        for r in reports:
            for k, want in env_vars.items():
                if k in r["env"] and r["env"][k] != want and k != "PYTHONPATH":
                    problems.append(f"{r['host']}: {k}={r['env'][k]} but the run sets {want}")
                elif k.startswith(WATCH_PREFIXES) and k not in r["env"]:
                    problems.append(f"{r['host']}: {k} did not reach the Ray worker")
            if r["env"].get("CUDA_VISIBLE_DEVICES") and (r["env"].get("ROCR_VISIBLE_DEVICES") or
                                                         r["env"].get("HIP_VISIBLE_DEVICES")):
                problems.append(f"{r['host']}: ROCR/HIP_VISIBLE_DEVICES set beside CUDA_VISIBLE_DEVICES")
            for name, p in r["paths"].items():
                if not p["readable"]:
                    problems.append(f"{r['host']}: {name} is not readable")
            problems += node_problems(r, cfg)
        out = {"nodes": reports, "problems": problems, "config": cfg}
        run_dir = Path(cfg["trainer"]["default_local_dir"]).parent
        writer.write_text(run_dir / "preflight.json", json.dumps(out, indent=1, default=str), root=run_dir)
        for r in reports:
            print(f"preflight: {r['host']}: Ray GPUs {r['ray_gpu_ids']}, CUDA_VISIBLE_DEVICES "
                  f"{r['cuda_visible_devices']}, torch sees {r['cuda_device_count']}, modules {r['modules']}", flush=True)
        for line in problems:
            print(f"preflight: problem: {line}", flush=True)
        if problems:
            raise RuntimeError(f"preflight found {len(problems)} problem(s): {problems[0]}")
        return {"nodes": len(reports), "problems": problems}

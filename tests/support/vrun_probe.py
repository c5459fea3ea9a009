"""A verl task runner for the hand-off test: inside a Ray worker, it reports the config it received and the
environment it sees (secrets only as a digest), instead of building GPU workers (none exist here)."""
import hashlib
import json
import os
import socket
from pathlib import Path

import ray

WATCH = ("CUDA_DEVICE_MAX_CONNECTIONS", "VLLM_USE_V1", "VLLM_ALLREDUCE_USE_SYMM_MEM", "PYTHONPATH",
         "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "WANDB_RUN_ID", "WANDB_RESUME")
SECRETS = ("WANDB_API_KEY", "HF_TOKEN")


@ray.remote(num_cpus=0)
class ProbeTaskRunner:
    def run(self, config):
        from omegaconf import OmegaConf

        report = {
            "config": OmegaConf.to_container(config, resolve=True),
            "env": {k: os.environ.get(k) for k in WATCH},
            "secret_sha256": {k: hashlib.sha256(os.environ[k].encode()).hexdigest()
                              for k in SECRETS if k in os.environ},
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "in_ray_worker": ray.is_initialized(),
        }
        # the report must not carry the secrets it checks
        report["config"]["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"] = {
            k: v for k, v in report["config"]["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"].items()
            if k not in SECRETS}
        out = Path(config.trainer.default_local_dir).parent / "probe.json"
        out.write_text(json.dumps(report, indent=1))
        return str(out)

"""Shared helpers: compose the project's run config with Hydra, and plan it, in-process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vrun import schema  # noqa: E402

schema.register()

PY = sys.executable
MODELS = ["deepseek_v4_flash", "deepseek_v4_pro", "kimi_k2_6", "glm5_1", "qwen3_5_35b"]
PATH_ENV = {"deepseek_v4_flash": "FLASH_MODEL_PATH", "deepseek_v4_pro": "PRO_MODEL_PATH",
            "kimi_k2_6": "KIMI_K2_6_MODEL_PATH", "glm5_1": "GLM5_1_MODEL_PATH", "qwen3_5_35b": "QWEN3_5_35B_MODEL_PATH"}


def compose(overrides: list[str], conf_dir: Path = ROOT / "conf") -> dict:
    """The resolved run config for these overrides (as the runner's task would see it)."""
    from hydra import compose as hcompose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
        cfg = hcompose(config_name="run", overrides=overrides)
    GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg, resolve=True)


def plan(overrides: list[str], run_dir: str = "/tmp/vrun-test-run", environ: dict | None = None, **kw):
    from vrun.plan import make_plan

    env = dict(os.environ if environ is None else environ)
    return make_plan(schema.typed(compose(overrides)), run_dir, environ=env, **kw)


def problems_of(overrides: list[str], **kw) -> list[str]:
    """The error lines a plan raises (empty if it plans)."""
    from vrun.problems import PlanError

    try:
        plan(overrides, **kw)
    except PlanError as e:
        return [p.line() for p in e.problems]
    return []


def runner(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ if env is None else env)
    e.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([PY, str(ROOT / "runner.py"), *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout)

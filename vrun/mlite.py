"""Where `verl_mlite` comes from: the real package (MLITE_ROOT or PYTHONPATH) or the project's record."""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

RECORD_PKG = "vrun.mlite_record"


@dataclass(frozen=True)
class MliteSource:
    # "verl_mlite" (the real package) or "record"
    kind: str
    # Hydra search path entry for its config groups
    searchpath: str
    # where the real package lives, if found
    location: Optional[str]


def mlite_paths(env: dict | None = None) -> list[str]:
    """The launchers' PYTHONPATH entries from MLITE_ROOT (with MLITE_VERL_ROOT / MLITE_LITE_ROOT)."""
    env = os.environ if env is None else env
    if not env.get("MLITE_ROOT") and not env.get("MLITE_VERL_ROOT"):
        return []
    root = os.path.expanduser(env.get("MLITE_ROOT", "~/mlite"))
    out = [env.get("MLITE_VERL_ROOT", f"{root}/experimental/lite/examples/verl"),
           env.get("MLITE_LITE_ROOT", f"{root}/experimental/lite"), root]
    for extra in ("VERL_ROOT", "MEGATRON_ROOT"):
        if env.get(extra):
            out.append(env[extra])
    return out


@functools.lru_cache(maxsize=1)
def find_source() -> MliteSource:
    """Look for the real package without importing it (its sitecustomize imports torch)."""
    for p in reversed(mlite_paths()):
        if p not in sys.path:
            sys.path.insert(0, p)
    spec = importlib.util.find_spec("verl_mlite")
    if spec is not None and spec.submodule_search_locations:
        loc = list(spec.submodule_search_locations)[0]
        if (Path(loc) / "config" / "engine" / "mlite.yaml").is_file():
            return MliteSource("verl_mlite", "pkg://verl_mlite.config", loc)
    return MliteSource("record", f"pkg://{RECORD_PKG}.config", None)


@functools.lru_cache(maxsize=1)
def record() -> dict:
    import yaml

    return yaml.safe_load((Path(__file__).parent / "mlite_record" / "record.yaml").read_text())


def impl_cfg_fields(mlite_name: str) -> list[str]:
    r = record()["impl_cfg_fields"]
    return list(r["common"]) + list(r.get(mlite_name, []))


def mtp_layers_built(mlite_name: str, impl_cfg: dict, model_mtp_layers: int) -> int:
    """MTP layers the engine builds: the model's own count when impl_cfg.mtp_enable (default per model) is on, else
    none. DeepSeek-V4 takes an explicit count from impl_cfg.num_nextn_predict_layers, then mtp_num_layers."""
    enabled = impl_cfg.get("mtp_enable")
    if enabled is None:
        enabled = record()["impl_cfg_mtp_enable_default"].get(mlite_name, False)
    if not enabled:
        return 0
    if mlite_name == "deepseek_v4":
        for key in ("num_nextn_predict_layers", "mtp_num_layers"):
            if impl_cfg.get(key) is not None:
                return int(impl_cfg[key])
    return int(model_mtp_layers or 0)

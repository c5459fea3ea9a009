"""Where `verl_mlite` comes from: the real package (MLITE_ROOT or PYTHONPATH) or the project's record."""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vrun.core import fs

RECORD_PKG = "vrun.compose.mlite_record"


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
        if fs.is_file(Path(loc) / "config" / "engine" / "mlite.yaml"):
            return MliteSource("verl_mlite", "pkg://verl_mlite.config", loc)
    return MliteSource("record", f"pkg://{RECORD_PKG}.config", None)


@functools.lru_cache(maxsize=1)
def record() -> dict:
    import yaml

    return yaml.safe_load((Path(__file__).parent / "mlite_record" / "record.yaml").read_text())


def impl_cfg_fields(mlite_name: str) -> list[str]:
    return list(interface().impl_cfg_fields.get(mlite_name, ()))


def mtp_layers_built(mlite_name: str, impl_cfg: dict, model_mtp_layers: int) -> int:
    """MTP layers the engine builds: the model's own count when impl_cfg.mtp_enable (default per model) is on, else
    none. DeepSeek-V4 takes an explicit count from impl_cfg.num_nextn_predict_layers, then mtp_num_layers."""
    enabled = impl_cfg.get("mtp_enable")
    if enabled is None:
        enabled = interface().impl_cfg_mtp_enable_default.get(mlite_name, False)
    if not enabled:
        return 0
    if mlite_name == "deepseek_v4":
        for key in ("num_nextn_predict_layers", "mtp_num_layers"):
            if impl_cfg.get(key) is not None:
                return int(impl_cfg[key])
    return int(model_mtp_layers or 0)


@dataclass(frozen=True)
class Interface:
    """What the plan checks against verl_mlite and Megatron Lite: from the real package's source when it is in
    reach, else from the record. `interface()` is the one place that decides which."""
    source: str                               # "verl_mlite" or "record"
    impl_cfg_fields: dict                     # model family → every ImplConfig field (without `parallel`)
    engine_extra_fields: tuple                # MegatronLiteEngineConfig fields that engine/mlite.yaml does not list
    override_optimizer_config_keys: tuple     # optim.override_optimizer_config keys the engine reads
    router_replay_modes: tuple
    impl_cfg_optimizer_values: tuple
    impl_cfg_mtp_enable_default: dict         # model family → ImplConfig.mtp_enable's default


def interface_from_record() -> Interface:
    r = record()
    common = tuple(r["impl_cfg_fields"]["common"])
    families = [k for k in r["impl_cfg_fields"] if k != "common"]
    return Interface("record", {f: common + tuple(r["impl_cfg_fields"][f]) for f in families},
                     tuple(r["engine_extra_fields"]), tuple(r["override_optimizer_config_keys"]),
                     tuple(r["router_replay_modes"]), tuple(r["impl_cfg_optimizer_values"]),
                     dict(r["impl_cfg_mtp_enable_default"]))


def _class(path: Path, name: str):
    import ast

    return next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)


def _fields(cls) -> list:
    import ast

    return [s for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]


@functools.lru_cache(maxsize=4)
def interface_from_source(location: str) -> Interface:
    """Read (never import: verl_mlite's engine imports CUDA code) the real package and Megatron Lite's models."""
    import ast
    import re

    import yaml

    pkg = Path(location)
    lite = pkg.parents[2]
    families = list(record()["impl_cfg_fields"])
    families.remove("common")
    impl, mtp_default, optimizers = {}, {}, {None}
    for fam in families:
        proto = lite / "megatron" / "lite" / "model" / fam / "lite" / "protocol.py"
        fields_ = _fields(_class(proto, "ImplConfig"))
        impl[fam] = tuple(f.target.id for f in fields_ if f.target.id != "parallel")
        mtp = next(f for f in fields_ if f.target.id == "mtp_enable")
        mtp_default[fam] = bool(ast.literal_eval(mtp.value))
        optimizers |= set(re.findall(r'impl_cfg\.optimizer == "(\w+)"', proto.read_text()))
    engine_py = pkg / "engine" / "config.py"
    cls = _class(engine_py, "MegatronLiteEngineConfig")
    listed = set(yaml.safe_load((pkg / "config" / "engine" / "mlite.yaml").read_text()))
    extra = tuple(f.target.id for f in _fields(cls) if f.target.id not in listed)
    modes: tuple = ()
    for node in ast.walk(cls):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) \
                and node.left.attr == "router_replay_mode" and isinstance(node.ops[0], ast.NotIn):
            modes = tuple(ast.literal_eval(node.comparators[0]))
    keys = tuple(dict.fromkeys(re.findall(r'override\.get\(\s*"(\w+)"',
                                          (pkg / "engine" / "mlite_engine.py").read_text())))
    return Interface("verl_mlite", impl, extra, keys, modes,
                     tuple(sorted(optimizers, key=lambda v: (v is None, str(v)))), mtp_default)


def interface() -> Interface:
    source = find_source()
    return interface_from_source(source.location) if source.kind == "verl_mlite" else interface_from_record()

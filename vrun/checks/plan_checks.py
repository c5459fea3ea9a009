"""Plan-time checks on the run config and the resolved verl config: what verl or Megatron Lite would reject
at job start (or silently get wrong), found before the allocation. Pure functions of their inputs; the values
Megatron Lite allows come from its record (vrun/compose/mlite_record/record.yaml). The checks of one entrypoint (its
batch arithmetic, its algorithm) live with its record: vrun/entrypoints/ppo.py, vrun/entrypoints/sft.py."""
from __future__ import annotations

from vrun.compose import mlite
from vrun.compose.translate import TRAINER_SIZES
from vrun.core.dotted import get
from vrun.estimate.mesh import Mesh, Rules
from vrun.core.problems import Problem

def check_all(config, entrypoint, verl: dict, mesh: Mesh, rules: Rules) -> list[Problem]:
    """Every check of the plan: the mesh rules, the engine, then (on a valid mesh) the trainer, the entrypoint's
    mesh-dependent and recipe checks. `entrypoint`: the run's record (vrun.entrypoints)."""
    eng = get(verl, entrypoint.engine, {})
    out = rules.problems(mesh)
    if out:
        return out + engine_problems(eng) + modality_problems(config, verl)
    out += engine_problems(eng) + modality_problems(config, verl)
    out += trainer_problems(verl, mesh)
    out += entrypoint.mesh_problems(verl, mesh, rules)
    out += entrypoint.recipe_problems(verl, config.algo)
    return out


def modality_problems(config, verl: dict) -> list[Problem]:
    """A data set whose rows carry images for a model that reads text only (no vision tower in its facts): the
    data group says so (data.images), or a train file readable here has verl's image column (data.image_key)."""
    arch = config.model.arch
    if arch.vision or arch.vision_params:
        return []
    image_key = get(verl, "data.image_key", None) or "images"
    files = get(verl, "data.train_files", None)
    files = [files] if isinstance(files, str) else list(files or []) if isinstance(files, (list, tuple)) else []
    with_images = [f for f in files if isinstance(f, str) and image_key in parquet_columns(f)]
    if not (config.data.images or with_images):
        return []
    key, value, seen = ("data.train_files", with_images[0], f"it has verl's image column {image_key}") if with_images \
        else ("data", config.data.name, "its rows carry images")
    return [Problem(key, value, f"{seen}, and model={config.model.name} reads text only (no vision tower): verl would build "
                    "prompts without the images", "a text data set (data=gsm8k), or a model with a vision tower "
                    "(model=qwen3_5_35b or model=kimi_k2_6)")]


def parquet_columns(path: str) -> frozenset:
    """A parquet file's column names from its footer (no rows read); none for a file not readable here."""
    import os

    from vrun.core import fs

    p = os.path.expanduser(path)
    if not fs.is_file(p):
        return frozenset()
    try:
        import pyarrow.parquet as pq

        return frozenset(pq.read_schema(p).names)
    except Exception:  # noqa: BLE001 - unreadable or not parquet: the data set's own word stands
        return frozenset()


def engine_problems(eng: dict) -> list[Problem]:
    iface = mlite.interface()
    out = []
    pre = "engine"
    if get(eng, "impl_cfg.use_thd", True) is not True:
        out.append(Problem(f"{pre}.impl_cfg.use_thd", get(eng, "impl_cfg.use_thd"),
                           "the Megatron Lite engine only runs packed (THD) sequences", f"{pre}.impl_cfg.use_thd=true"))
    opt = get(eng, "impl_cfg.optimizer")
    optimizers = [v for v in iface.impl_cfg_optimizer_values if v is not None]
    if opt not in optimizers:
        out.append(Problem("optimizer.name", opt, f"Megatron Lite takes {' or '.join(optimizers)}",
                           f"optimizer={optimizers[-1]}"))
    rrm = get(eng, "router_replay_mode", "disabled")
    modes = list(iface.router_replay_modes)
    if rrm not in modes:
        out.append(Problem(f"{pre}.router_replay_mode", rrm, f"the Megatron Lite engine supports {' or '.join(modes)}",
                           f"{pre}.router_replay_mode={modes[-1]}"))
    if get(eng, "resync_config") and get(eng, "resync_format") is None:
        out.append(Problem(f"{pre}.resync_config", get(eng, "resync_config"), "resync_config needs resync_format",
                           f"set {pre}.resync_format (e.g. block_fp8)"))
    grads, params = bool(get(eng, "grad_offload")), bool(get(eng, "param_offload"))
    if grads != params:
        # the engine offloads gradients exactly when it offloads parameters; no Megatron Lite code reads grad_offload
        out.append(Problem(f"{pre}.grad_offload", grads, f"Megatron Lite ignores it: gradients are "
                           f"{'offloaded' if params else 'kept on the GPU'} because {pre}.param_offload={params}",
                           f"set {pre}.param_offload={str(grads).lower()} to {'offload' if grads else 'keep'} "
                           f"gradients, or {pre}.grad_offload={str(params).lower()} to say what happens",
                           warning=True))
    return out


def trainer_problems(verl: dict, mesh: Mesh) -> list[Problem]:
    out = []
    for key, field in TRAINER_SIZES.items():
        want = getattr(mesh, field)
        if get(verl, key) != want:
            out.append(Problem(key, get(verl, key), f"must equal the mesh's {want}", f"set mesh.{field} instead"))
    return out

"""A checkpoint's config.json as its readers take it: the architecture numbers it gives (ARCH_KEYS), each a
positive integer or refused; its quantization_config a map where a map belongs and the weight bits it names; the
numbers compared with the model group's facts (`cross_check`). CheckpointError is the one error a checkpoint's read
raises: the file and why, and a fix where the checkpoint's own facts disagree.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

from vrun.estimate.rollout import CONFIG_JSON_LIMIT as JSON_LIMIT  # config.json, the index

ARCH_KEYS = {
    "layers": ("num_hidden_layers",),
    "routed_experts": ("n_routed_experts", "num_experts", "num_local_experts"),
    "experts_per_token": ("num_experts_per_tok", "experts_per_token"),
    "heads": ("num_attention_heads",),
    "kv_heads": ("num_key_value_heads",),
    "hidden": ("hidden_size",),
    "vocab": ("vocab_size",),
    # Qwen3-Next/3.5 write mtp_num_hidden_layers; GLM/DeepSeek num_nextn_predict_layers (or num_nextn_predict)
    "mtp_layers": ("num_nextn_predict_layers", "mtp_num_hidden_layers", "mtp_num_layers", "num_nextn_predict"),
    "dense_layers": ("first_k_dense_replace",),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "intermediate_size": ("intermediate_size",),
}


# the keys cross_check compares with the model group's arch facts
CHECKED_KEYS = ("layers", "routed_experts", "experts_per_token", "heads", "kv_heads", "hidden", "vocab",
                "mtp_layers", "dense_layers")


_BITS_IN_NAME = re.compile(r"(?:fp|int|nf|uint)(\d+)|w(\d+)a", re.I)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read (names the file and why). With a fix: the checkpoint's own facts
    disagree (a word for a number, a negative shape, no weights, a quantization its tensors do not hold), and the
    plan is refused rather than sized from them."""

    def __init__(self, message: str, fix: Optional[str] = None):
        super().__init__(message)
        self.fix = fix


def refused(file: str, key: str, value: Any, why: str, fix: str) -> CheckpointError:
    return CheckpointError(f"{file} {key}={str(value)[:80]}: {why}", fix)


def quant_bits(q: dict) -> tuple[Optional[set], Optional[str]]:
    """Weight bit widths quantization_config names (None if it names none) and its quant_method."""
    bits = set()
    for key in ("bits", "w_bit", "wbits", "nbits", "weight_bits", "num_bits"):
        if is_int(q.get(key)):
            bits.add(q[key])
    groups = q.get("config_groups")
    if isinstance(groups, dict):
        for g in groups.values():
            w = g.get("weights") if isinstance(g, dict) else None
            if isinstance(w, dict) and is_int(w.get("num_bits")):
                bits.add(w["num_bits"])
    inner = q.get("quantization") if isinstance(q.get("quantization"), dict) else {}
    for algo in (q.get("quant_algo"), inner.get("quant_algo")):
        b = bits_of(algo)
        if b:
            bits.add(b)
    method = q.get("quant_method")
    if not bits:
        b = bits_of(method)
        if b:
            bits.add(b)
        elif q.get("load_in_4bit"):
            bits.add(4)
        elif q.get("load_in_8bit"):
            bits.add(8)
    return (bits or None), (str(method) if method is not None else None)


def bits_of(s: Any) -> Optional[int]:
    """4 from 'fp4'/'mxfp4'/'NVFP4'/'int4'/'W4A16', 8 from 'fp8'/'FP8_BLOCK'; None from anything else."""
    if not isinstance(s, str):
        return None
    m = _BITS_IN_NAME.search(s)
    return int(m.group(1) or m.group(2)) if m else None


def no_constant(name: str):
    raise ValueError(f"{name} is not a number a checkpoint holds")


def load_json(path: str) -> dict:
    """A checkpoint's JSON file: a regular file (a link to one, as the Hugging Face cache makes, is fine) of at
    most JSON_LIMIT bytes, read without blocking; NaN/Infinity refused."""
    from vrun.core import fs

    fix = f"restore {os.path.basename(path)} from the model's upstream repository (a regular JSON file)"
    text, why = fs.read_checked(path, JSON_LIMIT)
    if text is None:
        raise CheckpointError(f"{path}: {why}", fix)
    try:
        data = json.loads(text, parse_constant=no_constant)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})", fix) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a JSON object", fix)
    return data


def quantization_shape(cfg_path: str, top: dict, text: dict) -> None:
    """quantization_config as its readers take it (transformers' and vLLM's quantization configs, quant_bits,
    vrun.estimate.rollout.formats_from_config): null or a map; within it config_groups a map of maps whose
    `weights` is a map, and `quantization` a map. A list or a word where a map belongs is refused, naming it."""
    for where, cfg in (("", top), ("text_config.", text)):
        q = cfg.get("quantization_config")
        if q is None:
            continue
        parts = [(f"{where}quantization_config", q)]
        if isinstance(q, dict):
            groups = q.get("config_groups")
            parts += [(f"{where}quantization_config.config_groups", groups),
                      (f"{where}quantization_config.quantization", q.get("quantization"))]
            if isinstance(groups, dict):
                for name, g in groups.items():
                    parts.append((f"{where}quantization_config.config_groups.{name}", g))
                    if isinstance(g, dict):
                        parts.append((f"{where}quantization_config.config_groups.{name}.weights", g.get("weights")))
        for key, v in parts:
            if v is not None and not isinstance(v, dict):
                raise refused(cfg_path, key, json.dumps(v)[:80], f"a {type(v).__name__} where a map belongs (its "
                              "readers, transformers' and vLLM's quantization configs, take a map)",
                              f"write {key} as its upstream config.json has it (a JSON object), or remove it")


def numbers_are_numbers(cfg_path: str, cfg: dict) -> None:
    """Every architecture number config.json gives (ARCH_KEYS) is a positive integer (first_k_dense_replace and the
    MTP layer counts may be 0): a word, a float, a negative count is refused, never skipped for a guess."""
    zero_ok = set(ARCH_KEYS["mtp_layers"] + ARCH_KEYS["dense_layers"])
    for names in ARCH_KEYS.values():
        for n in names:
            v = cfg.get(n)
            if v is None:
                continue
            if not is_int(v) or v < (0 if n in zero_ok else 1):
                raise refused(cfg_path, n, v, f"not a {'non-negative' if n in zero_ok else 'positive'} integer "
                              f"({type(v).__name__})", f"write {n} as the model's integer in {cfg_path}, "
                              "as its upstream config.json has it")


def first_int(cfg: dict, names: tuple) -> Optional[int]:
    for n in names:
        if is_int(cfg.get(n)):
            return cfg[n]
    return None


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)

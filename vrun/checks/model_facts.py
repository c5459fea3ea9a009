"""The model group's facts as counts (conf/model: vrun.config.schema.Model and its Arch): integers in their
ranges, positive where they count layers or heads, the TP sizes a list of positive integers, the names identifiers.
"""
from __future__ import annotations

import re

from vrun.checks.paths import short as _short
from vrun.core.problems import Problem


# architecture facts that count something: a positive integer; the others (optional widths, ranks) ≥ 0
MAX_LAYERS, MAX_COUNT = 4096, 2 ** 40


ARCH_POSITIVE = ("layers", "routed_experts", "experts_per_token", "heads", "hidden", "gdn_conv_kernel")


def arch_problems(arch) -> list[Problem]:
    """The model group's facts (vrun.config.schema.Arch) as counts: integers, positive where they count layers/heads."""
    from dataclasses import fields

    out = []
    for f in fields(arch):
        if "int" not in str(f.type):
            continue
        v = getattr(arch, f.name)
        low = 1 if f.name in ARCH_POSITIVE else 0
        high = MAX_LAYERS if "layers" in f.name else MAX_COUNT
        vals = v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else [v]
        if any(x is not None and (isinstance(x, bool) or not isinstance(x, int) or not low <= x <= high)
               for x in vals):
            out.append(Problem(f"model.arch.{f.name}", _short(v), f"a count: an integer in [{low}, {high}]",
                               "fix conf/model/<model>.yaml (the checkpoint's config.json is the truth)"))
    if isinstance(arch.full_attention_interval, int) and arch.full_attention_interval == 0:
        out.append(Problem("model.arch.full_attention_interval", 0, "one full-attention layer every 0 layers",
                           "null (no hybrid layers) or a positive interval"))
    return out


def model_problems(model) -> list[Problem]:
    """The model group's own facts besides arch (vrun.config.schema.Model)."""
    out = arch_problems(model.arch)
    for key in ("tp_allowed", "etp_allowed"):
        v = getattr(model, key)
        if not v or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= 1024 for x in v):
            out.append(Problem(f"model.{key}", _short(v), "the TP sizes Megatron Lite implements for the family: "
                               "a non-empty list of positive integers", f"model.{key}=[1]"))
    for key in ("mlite_name", "path_env"):
        v = getattr(model, key)
        if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            out.append(Problem(f"model.{key}", _short(v), "an identifier", f"fix conf/model/{model.name}.yaml"))
    return out

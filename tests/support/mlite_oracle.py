"""Megatron Lite's own code as the judge of meshes: reads cases (JSON on stdin), prints verdicts (JSON on stdout).

Run with `$MLITE_ROOT/experimental/lite` on PYTHONPATH (not examples/verl: its sitecustomize is not needed), torch
and megatron-core installed. Per case, in this order, each step Megatron Lite's engine takes when it builds a model:
  1. `megatron.lite.primitive.parallel.state.init_parallel` under torch's fake process group, at the ranks asked
     for: its own divisibility errors, and the DP / EDP sizes and ranks it derives.
  2. `megatron.lite.primitive.parallel.pp.build_pipeline_chunk_layout` for every pipeline rank (the auto layout
     the engine uses: verl never passes pp_layout), with the model's vpp and MTP layer count.
  3. The model family's parallel-scope rules, from Megatron Lite's own code where it imports on CPU, else from
     its source text:
     - GLM-5 and DeepSeek-V4: `_validate_parallel_scope` of `model/<m>/lite/protocol.py`, executed from the source
       file (the module itself imports transformer_engine, a CUDA-only package);
     - Kimi K2 (MLA): `primitive/modules/attention/mla.py` raises unless num_attention_heads % tp == 0 (that module
       imports transformer_engine too: the rule is restated here from its source, with its own numbers);
     - Qwen3.5: `primitive/modules/gqa.py` and `gated_delta_net.py` call `ensure_divisible` on the attention heads,
       KV heads, GDN K heads and GDN V heads by tp: called here with the real `ensure_divisible`;
     - every model: `primitive/modules/experts.py` calls `ensure_divisible(num_experts, ep)`: called here.
The model's numbers come from Megatron Lite's own config class for the family, with the fields a checkpoint's
config.json would overwrite set from the case's facts.
"""
from __future__ import annotations

import ast
import json
import sys
import traceback
from pathlib import Path

import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from megatron.lite.primitive.parallel.pp import build_pipeline_chunk_layout
from megatron.lite.primitive.parallel.state import init_parallel
from megatron.lite.primitive.utils import ensure_divisible
from megatron.lite.runtime.contracts import ParallelConfig

LITE = Path(sys.modules["megatron.lite"].__file__).parent
CONFIGS = {  # family → (module, class, {fact name: config field})
    "glm5": ("megatron.lite.model.glm5.config", "Glm5Config"),
    "kimi_k2": ("megatron.lite.model.kimi_k2.config", "KimiK2Config"),
    "qwen3_5": ("megatron.lite.model.qwen3_5.config", "Qwen35Config"),
    "deepseek_v4": ("megatron.lite.model.deepseek_v4.config", "DeepseekV4Config"),
}
FIELDS = {"layers": "num_hidden_layers", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
          "routed_experts": ("num_experts", "n_routed_experts"), "gdn_k_heads": "linear_num_key_heads",
          "gdn_v_heads": "linear_num_value_heads", "mtp_layers": "num_nextn_predict_layers"}


def model_config(family: str, facts: dict):
    import importlib
    from dataclasses import fields

    module, cls = CONFIGS[family]
    klass = getattr(importlib.import_module(module), cls)
    names = {f.name for f in fields(klass)}
    kw = {}
    for fact, field in FIELDS.items():
        for name in (field if isinstance(field, tuple) else (field,)):
            if name in names and facts.get(fact) is not None:
                kw[name] = facts[fact]
    if family == "glm5" and "num_attention_heads" in kw:
        kw["num_key_value_heads"] = kw["num_attention_heads"]  # GLM-5's config requires kv == heads
    cfg = klass(**kw)
    return cfg


def _scope_gate(family: str):
    """`_validate_parallel_scope` of the family's protocol.py, compiled from its source text alone."""
    src = (LITE / "model" / family / "lite" / "protocol.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "_validate_parallel_scope")
    fn.returns = None
    for a in fn.args.args:
        a.annotation = None
    ns: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(LITE / "model" / family / "lite" / "protocol.py"),
                 "exec"), ns)
    return ns["_validate_parallel_scope"]


def mtp_enable_default(family: str) -> bool:
    """ImplConfig.mtp_enable's default, read from the family's protocol.py source."""
    src = (LITE / "model" / family / "lite" / "protocol.py").read_text()
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "ImplConfig")
    node = next(s for s in cls.body if isinstance(s, ast.AnnAssign) and s.target.id == "mtp_enable")
    return bool(ast.literal_eval(node.value))


def family_rules(family: str, cfg, p: ParallelConfig) -> None:
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "n_routed_experts")
    ensure_divisible(experts, p.ep)                                      # experts.py
    if family in ("glm5", "deepseek_v4"):
        _scope_gate(family)(p)                                           # protocol.py
    elif family == "kimi_k2":
        if cfg.num_attention_heads % p.tp != 0:                          # mla.py
            raise ValueError("num_attention_heads must be divisible by tensor parallel size")
    elif family == "qwen3_5":
        ensure_divisible(cfg.num_attention_heads, p.tp)                  # gqa.py
        ensure_divisible(cfg.num_key_value_heads, p.tp)
        ensure_divisible(cfg.linear_num_key_heads, p.tp)                 # gated_delta_net.py
        ensure_divisible(cfg.linear_num_value_heads, p.tp)


def judge(case: dict) -> dict:
    m = case["mesh"]
    family = case["family"]
    cfg = model_config(family, case["facts"])
    p = ParallelConfig(tp=m["tp"], etp=m["etp"], ep=m["ep"], pp=m["pp"], vpp=m["vpp"], cp=m["cp"])
    world = m["world"]
    out: dict = {"ranks": {}}
    try:
        for rank in case.get("ranks") or [0]:
            dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
            try:
                ps = init_parallel(p)
                out["ranks"][str(rank)] = {"dp": ps.dp_size, "edp": ps.expert_dp_size, "pp_rank": ps.pp_rank,
                                           "dp_rank": ps.dp_rank, "edp_rank": ps.expert_dp_rank}
            finally:
                dist.destroy_process_group()
        # what the model builds: num_nextn_predict_layers when mtp_enable (ImplConfig's default unless set), else 0
        enabled = case.get("mtp_enable")
        enabled = mtp_enable_default(family) if enabled is None else enabled
        mtp = (getattr(cfg, "num_nextn_predict_layers", 0) or 0) if enabled else 0
        out["mtp_layers"] = mtp
        stages = []
        for pp_rank in range(p.pp):
            ps.pp_rank, ps.pp_is_first, ps.pp_is_last = pp_rank, pp_rank == 0, pp_rank == p.pp - 1
            layout = build_pipeline_chunk_layout(cfg.num_hidden_layers, ps, vpp=p.vpp, num_mtp_layers=mtp)
            stages.append({"layers": layout.layer_indices, "mtp": layout.has_mtp})
        out["stages"] = stages
        family_rules(family, cfg, p)
        out["ok"] = True
    except Exception as e:  # noqa: BLE001 - any refusal is the verdict
        out["ok"] = False
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if not isinstance(e, (ValueError, NotImplementedError, AssertionError, RuntimeError)):
            out["error"] += " | " + traceback.format_exc(limit=3).replace("\n", " ")
    return out


def main() -> None:
    cases = json.load(sys.stdin)
    print(json.dumps([judge(c) for c in cases]))


if __name__ == "__main__":
    main()

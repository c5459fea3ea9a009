"""Megatron Lite's real model as the judge of the plan's memory arithmetic: reads cases (JSON on stdin), prints
per-rank bytes (JSON on stdout).

Run with `$MLITE_ROOT/experimental/lite` on PYTHONPATH, torch and megatron-core installed (megatron-core without its
dependencies is enough). Per case — one model, one mesh, one rank of one pipeline stage — it does what Megatron Lite's
runtime does when it builds a model for training with optimizer=fsdp2:
  1. torch's fake process group at that rank (`FakeStore`, backend "fake"): collectives do nothing;
  2. the family's own `build_model(model_cfg, impl_cfg=ImplConfig(...))` from `model/<family>/lite/protocol.py`
     (its `init_parallel`, its pipeline layout, its modules), under `torch.device("meta")`: parameters have shapes
     and dtypes and no storage;
  3. the bundle's `post_model_load_hook`: Megatron Lite's FSDP2 wrapping (`build_fsdp2_training_optimizer`: its
     fp32 promotion or not, its expert / dense shard groups) and its AdamW, under torch's FakeTensorMode (the
     host-update path copies each shard to the host, which meta tensors cannot do);
  4. counts, per rank: the local shards of the parameters (bytes, by dtype), the gradients FSDP2 will hold (one per
     trainable sharded parameter, in the sharded parameter's dtype: FSDP2 casts the reduced gradient to it), and the
     optimizer's state tensors by device (host = cpu).
What cannot run here, and what stands in for it (all in this file or tests/support/te_standin/):
  - TransformerEngine (CUDA-only): tests/support/te_standin gives TE's modules their parameter layout; it goes on
    sys.path after megatron.core is imported, so megatron.core keeps its no-TE code paths;
  - CUDA: `nn.Module.cuda` returns the module unchanged; FSDP2's device mesh is built for "cpu" (Megatron Lite
    asks for "cuda"); a CUDA stream made while building (Kimi's attention with CP > 1) is a placeholder object;
  - DeepSeek-V4's attention imports four `csa*` modules from megatron.core that megatron-core 0.16.1 lacks (they
    are on Megatron-LM main): empty placeholder modules with those names (the build never calls into them; only
    a forward pass would).
The model's numbers come from the family's config class, with the fields a checkpoint's config.json sets taken
from the case's facts (the plan's model group).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import types
import traceback
from dataclasses import fields
from pathlib import Path

import megatron.core  # noqa: F401  (before the TE stand-in: megatron.core must not see a TransformerEngine)

sys.path.insert(0, str(Path(__file__).resolve().parent / "te_standin"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

CONFIGS = {
    "glm5": ("megatron.lite.model.glm5.config", "Glm5Config"),
    "kimi_k2": ("megatron.lite.model.kimi_k2.config", "KimiK2Config"),
    "qwen3_5": ("megatron.lite.model.qwen3_5.config", "Qwen35Config"),
    "deepseek_v4": ("megatron.lite.model.deepseek_v4.config", "DeepseekV4Config"),
}
# fact (conf/model arch) → the config fields a checkpoint's config.json sets (the first the class has)
FIELDS = {
    "layers": ("num_hidden_layers",), "hidden": ("hidden_size",), "heads": ("num_attention_heads",),
    "kv_heads": ("num_key_value_heads",), "vocab": ("vocab_size",), "routed_experts": ("num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok",), "expert_ffn_hidden": ("moe_intermediate_size",),
    "dense_ffn_hidden": ("intermediate_size",), "dense_layers": ("first_k_dense_replace",),
    "shared_experts": ("n_shared_experts",), "q_lora_rank": ("q_lora_rank",), "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",), "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",), "index_heads": ("index_n_heads",), "index_head_dim": ("index_head_dim",),
    "index_topk": ("index_topk",), "head_dim": ("head_dim",), "o_groups": ("o_groups",),
    "o_lora_rank": ("o_lora_rank",), "sliding_window": ("sliding_window",), "hc_mult": ("hc_mult",),
    "compress_ratios": ("compress_ratios",), "gdn_k_heads": ("linear_num_key_heads",),
    "gdn_v_heads": ("linear_num_value_heads",), "shared_expert_ffn_hidden": ("shared_expert_intermediate_size",),
    "mtp_layers": ("num_nextn_predict_layers",),
}
GLM5_ARCH_ONLY = {"head_dim"}  # GLM-5's config has a head_dim of its own (the indexer's rope), not the facts'


def _stand_ins() -> None:
    nn.Module.cuda = lambda self, *a, **k: self  # nothing is on a GPU here

    from torch.distributed import DeviceMesh

    from_group = DeviceMesh.from_group

    def cpu_from_group(group, device_type="cuda", *a, **k):
        return from_group(group, "cpu", *a, **k)
    DeviceMesh.from_group = staticmethod(cpu_from_group)

    class _Stream:  # Kimi's attention makes a CUDA stream for CP while being built
        def __init__(self, *a, **k):
            pass
    torch.cuda.Stream = _Stream

    import megatron.core.transformer.experimental_attention_variant as eav  # noqa: F401
    for name in ("csa", "csa_cp_utils", "csa_cp_layout_kernels", "csa_kernels"):
        full = f"megatron.core.transformer.experimental_attention_variant.{name}"
        try:
            importlib.import_module(full)
        except ImportError:
            mod = types.ModuleType(full)
            mod.__getattr__ = lambda attr, _n=full: _missing(_n, attr)
            sys.modules[full] = mod
            setattr(eav, name, mod)


def _optimizer_under_fake_tensors() -> None:
    """Megatron Lite's AdamW is built as it is (fp32 masters, moments, the host copies of the offloaded path),
    under FakeTensorMode: the copies have shapes, dtypes and devices, and no storage."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from megatron.lite.primitive.optimizers.fsdp2 import optimizer as fsdp2_optimizer

    build = fsdp2_optimizer.build_adamw_optimizer

    def build_fake(*a, **k):
        with FakeTensorMode(allow_non_fake_inputs=True):
            return build(*a, **k)
    fsdp2_optimizer.build_adamw_optimizer = build_fake


def _missing(module: str, attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)

    def call(*a, **k):  # pragma: no cover - forward pass only
        raise NotImplementedError(f"{module}.{attr} is not in megatron-core 0.16.1 (placeholder)")
    return call


class MetaParams(torch.overrides.TorchFunctionMode):
    """Like `torch.device("meta")`, except for the small index and table tensors a build computes with
    (arange, tensor, linspace: the expert dispatcher calls `.tolist()` on one): those stay on the host."""

    HOST = {torch.arange, torch.tensor, torch.as_tensor, torch.linspace}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _constructors() and func not in self.HOST and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def _constructors():
    from torch.utils._device import _device_constructors
    return _device_constructors()


def model_config(family: str, facts: dict):
    module, cls = CONFIGS[family]
    klass = getattr(importlib.import_module(module), cls)
    names = {f.name for f in fields(klass)}
    kw = {}
    for fact, candidates in FIELDS.items():
        if facts.get(fact) in (None, []) or (family == "glm5" and fact in GLM5_ARCH_ONLY):
            continue
        for name in candidates:
            if name in names:
                kw[name] = facts[fact]
                break
    if family == "qwen3_5" and facts.get("gdn_head_dim"):
        kw["linear_key_head_dim"] = kw["linear_value_head_dim"] = facts["gdn_head_dim"]
    if family == "glm5" and "num_attention_heads" in kw:
        kw["num_key_value_heads"] = kw["num_attention_heads"]  # GLM-5's config requires kv == heads
    return klass(**kw)


def _local(t):
    return t._local_tensor if hasattr(t, "_local_tensor") else (t.to_local() if hasattr(t, "to_local") else t)


def _nbytes(t) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def judge(case: dict) -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from megatron.lite.runtime.contracts import ParallelConfig
    from megatron.lite.runtime.contracts.config import OptimizerConfig

    family, m = case["family"], case["mesh"]
    world, pp = m["world"], m["pp"]
    stage = case["stage"]
    rank = stage * (world // pp)  # Megatron Lite's rank order puts PP outermost (state.py init_parallel)
    t0 = time.perf_counter()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        proto = importlib.import_module(f"megatron.lite.model.{family}.lite.protocol")
        cfg = model_config(family, case["facts"])
        impl_names = {f.name for f in fields(proto.ImplConfig)}
        kw = dict(parallel=ParallelConfig(tp=m["tp"], etp=m["etp"], ep=m["ep"], pp=pp, vpp=m["vpp"], cp=m["cp"]),
                  optimizer="fsdp2", use_thd=True, mtp_enable=bool(case["mtp_enable"]),
                  optimizer_config=OptimizerConfig(offload_fraction=case["offload_fraction"]))
        impl = proto.ImplConfig(**{k: v for k, v in kw.items() if k in impl_names})
        with MetaParams():
            bundle = proto.build_model(cfg, impl_cfg=impl)
            opt = bundle.extras["post_model_load_hook"]()["optimizer"]
        ps = bundle.parallel_state
        params = {}
        grads = 0
        for chunk in bundle.chunks:
            for p in chunk.parameters():
                b = _nbytes(p)
                params[str(p.dtype)] = params.get(str(p.dtype), 0) + b
                if p.requires_grad:
                    grads += b
        gpu = host = 0
        inner = getattr(opt, "optimizer", opt)
        for inner_opt in getattr(inner, "optimizers", None) or [inner]:
            for st in inner_opt.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor):
                        if _local(v).device.type == "cpu":
                            host += _nbytes(v)
                        else:
                            gpu += _nbytes(v)
        layers = [n for n, _ in bundle.chunks[0].named_children()]
        return {"ok": True, "stage": stage, "rank": rank, "pp_rank": ps.pp_rank, "params": params,
                "params_bytes": sum(params.values()), "grads_bytes": grads, "optimizer_gpu_bytes": gpu,
                "optimizer_host_bytes": host, "dp_cp": ps.dp_cp_size, "edp": ps.expert_dp_size,
                "children": layers, "seconds": round(time.perf_counter() - t0, 2)}
    except Exception as e:  # noqa: BLE001 - a build that fails is reported with its error
        return {"ok": False, "stage": stage, "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(limit=8)}
    finally:
        dist.destroy_process_group()


def main() -> None:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    _stand_ins()
    _optimizer_under_fake_tensors()
    cases = json.load(sys.stdin)
    print(json.dumps([judge(c) for c in cases]))


if __name__ == "__main__":
    main()

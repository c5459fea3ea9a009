"""Megatron Lite's real model, one training step of one micro-batch, measured: reads cases (JSON on stdin), prints
per-rank peak bytes above the training state (JSON on stdout).

Run like tests/support/mlite_memory_oracle.py (`$MLITE_ROOT/experimental/lite` on PYTHONPATH, torch and
megatron-core). Per case — one model, one mesh, one rank of one pipeline stage, recompute full or none:
  1. the model is built as the memory oracle builds it (torch's fake process group at that rank; the family's own
     `build_model` under meta parameters; the launchers' recompute spec, which `build_model` applies with
     Megatron Lite's own `apply_recompute`), without the FSDP2 wrapping: the training state is the memory
     oracle's to count; what is measured here is what a step adds to it;
  2. the parameters become fake tensors (`torch._subclasses.FakeTensorMode`): shapes, dtypes, no storage;
  3. one micro-batch of the plan's per-GPU token budget (one packed sequence of T tokens, batch 1, the rank's
     1/CP of it) goes forward, through the loss (vocab-parallel cross entropy, as the launchers' non-fused
     path), and backward, under torch's `MemTracker` (its global peak only); what is reported is the highest, over the
     step, of what is live beyond parameters, gradients and buffers (activations and temporaries): FSDP2 keeps
     parameters and gradients sharded and resident, which the memory oracle counts; here they are unsharded.
What has no CPU path and stands in for it (each keeps for backward what the real kernel keeps; the source read):
  - te.Linear / te.LayerNormLinear / te.RMSNorm / te.GroupedLinear (TransformerEngine `module/linear.py`,
    `layernorm_linear.py`, `rmsnorm.py`, `grouped_linear.py`: `ctx.save_for_backward` keeps the input
    (bf16), the weights, and for the norms the normalized output and the fp32 rsigma): torch's `F.linear`,
    `F.rms_norm`, per-expert `F.linear` over the split — the same tensors saved by torch's autograd;
  - te.DotProductAttention (flash / fused attention: `FusedAttnFunc` keeps q, k, v, out, the fp32 softmax
    log-sum-exp and the RNG state): a Function that saves exactly q, k, v, out and an fp32 [heads, T] lse;
  - FLA's chunk_gated_delta_rule (`ChunkGatedDeltaRuleFunction.forward` keeps q, k, v, g, beta, A (the chunk-local
    [T, H, 64] fp32 matrix) and the initial state; h is recomputed in backward): a Function saving those;
  - the MoE token dispatcher's all-to-all path computes its splits with `.tolist()` (no values under fake
    tensors): balanced routing — every expert gets T·k/E tokens — with the real permute (unfused: it keeps the
    sorted indices) and the real `_AllToAll` (keeps nothing);
  - CUDA RNG state in the recompute wrapper: a no-op.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
import traceback
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlite_memory_oracle as mo  # noqa: E402  (imports megatron.core, then puts the TE stand-in on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

GIB = 1 << 30


# --------------------------------------------------------------------------------------------- compute stand-ins

def _te_forwards() -> None:
    import transformer_engine.pytorch as te

    def linear_fwd(self, x, *a, **k):
        y = F.linear(x, self.weight, getattr(self, "bias", None))
        return y

    def ln_linear_fwd(self, x, *a, **k):
        n = F.rms_norm(x, (x.shape[-1],), self.layer_norm_weight)
        return F.linear(n, self.weight, getattr(self, "bias", None))

    def rms_fwd(self, x, *a, **k):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def grouped_fwd(self, x, m_splits, *a, **k):
        outs = [F.linear(part, getattr(self, f"weight{i}"))
                for i, part in enumerate(torch.split(x, list(m_splits), dim=0))]
        return torch.cat(outs, dim=0)

    te.Linear.forward = linear_fwd
    te.LayerNormLinear.forward = ln_linear_fwd
    te.RMSNorm.forward = rms_fwd
    te.GroupedLinear.forward = grouped_fwd
    te.DotProductAttention.forward = lambda self, q, k, v, *a, **kw: _Attention.apply(q, k, v)


class _Attention(torch.autograd.Function):
    """Flash / fused attention's memory: out like q with v's head dim; saves q, k, v, out, fp32 lse [heads, T]."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[-2], q.shape[0] * (q.shape[1] if q.dim() == 4 else 1), dtype=torch.float32,
                          device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out.reshape(*q.shape[:-2], -1) if q.dim() == 4 else out

    @staticmethod
    def backward(ctx, g):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class _GatedDeltaRule(torch.autograd.Function):
    """FLA's chunk_gated_delta_rule: saves q, k, v, g, beta, A (fp32 [B, T, H, 64]) and the initial state."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta):
        b, t, h = q.shape[:3]
        a = torch.empty(b, t, h, 64, dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, g, beta, a)
        return torch.empty_like(v)

    @staticmethod
    def backward(ctx, go):
        q, k, v, g, beta, _ = ctx.saved_tensors
        return tuple(torch.empty_like(x) for x in (q, k, v, g, beta))


def _gdn_rule(self, query, key, value, g, beta, *, initial_state=None, output_final_state=False,
              cu_seqlens=None, cp_context=None):
    return _GatedDeltaRule.apply(query, key, value, g, beta), None


def _balanced_dispatch(self, hidden_states, topk_scores, topk_indices):
    """The dispatcher's all-to-all path with balanced routing (every expert T·k/E tokens): the real unfused
    permute and the real _AllToAll; only the split lists, which the real code reads back with .tolist(), are
    computed instead."""
    from megatron.lite.primitive.modules.moe import _AllToAll
    from megatron.lite.primitive.utils.moe import permute

    t, _ = hidden_states.shape
    e, ep, local = self.num_experts, self.ep_size, self.num_local_experts
    k = topk_indices.shape[1]
    per_expert = t * k // e
    routing_map = torch.zeros(t, e, dtype=torch.bool, device=hidden_states.device)
    routing_map.scatter_(1, topk_indices, True)
    probs_2d = torch.zeros(t, e, dtype=topk_scores.dtype, device=hidden_states.device)
    probs_2d.scatter_(1, topk_indices, topk_scores)
    permuted, permuted_probs, sorted_indices = permute(hidden_states, routing_map, probs=probs_2d,
                                                       num_out_tokens=per_expert * e, fused=False)[:3]
    self._row_id_map, self._restore_shape = sorted_indices, hidden_states.shape
    self._input_splits = self._output_splits = [per_expert * local] * ep
    recv = _AllToAll.apply(permuted, self._input_splits, self._output_splits, self.ps.ep_group)
    scores = _AllToAll.apply(permuted_probs.unsqueeze(-1), self._input_splits, self._output_splits,
                             self.ps.ep_group)
    self._combine_chunk_sizes = self._combine_restore_idxs = None
    self._local_tpe_list = [per_expert * ep] * local
    tpe = torch.full((local,), per_expert * ep, dtype=torch.int64, device=hidden_states.device)
    return recv, tpe, scores.squeeze(-1)


def _compute_stand_ins() -> None:
    _te_forwards()
    torch.cuda.get_rng_state = lambda *a, **k: torch.empty(0, dtype=torch.uint8)
    torch.cuda.set_rng_state = lambda *a, **k: None
    from megatron.lite.primitive.modules import dispatcher, gated_delta_net
    from megatron.lite.primitive.utils import moe as moe_utils
    moe_utils._te_general_gemm = lambda *a, **k: None  # the router's gemm: Megatron Lite's own torch fallback
    gated_delta_net.GatedDeltaNet._gated_delta_rule = _gdn_rule
    dispatcher.TokenDispatcher._dispatch_alltoall = _balanced_dispatch
    real_combine = dispatcher.TokenDispatcher._combine_alltoall

    def combine(self, expert_output):
        from megatron.lite.primitive.modules.moe import _AllToAll
        from megatron.lite.primitive.utils.moe import unpermute
        combined = _AllToAll.apply(expert_output, self._output_splits, self._input_splits, self.ps.ep_group)
        return unpermute(combined, self._row_id_map, restore_shape=self._restore_shape, fused=False)
    dispatcher.TokenDispatcher._combine_alltoall = combine
    dispatcher.TokenDispatcher._combine_local = combine
    del real_combine


# ------------------------------------------------------------------------------------------------- the measurement

def _fake_params(chunks, mode) -> None:
    with mode:
        for chunk in chunks:
            for mod in chunk.modules():
                for n, p in list(mod._parameters.items()):
                    if p is not None:
                        mod._parameters[n] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype),
                                                          requires_grad=p.requires_grad)
                for n, b in list(mod._buffers.items()):
                    if b is not None and b.device.type == "meta":
                        mod._buffers[n] = torch.empty(b.shape, dtype=b.dtype)


def _global_peak_tracker(base):
    """torch's MemTracker keeping only the step's peak (per device, by category): its per-module peaks walk every
    module on every op, which a 40-layer model makes minutes per layer."""
    from copy import deepcopy

    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    state = {"PARAM", "GRAD", "BUFFER"}

    class GlobalPeak(base):
        above_state = 0     # the highest, over the step, of what is live beyond params, grads and buffers
        above_state_snap: dict = {}

        def _update_peak_stats(self, peak_state) -> None:
            for dev, snap in self._curr_mem_snap.items():
                above = snap[_TOTAL_KEY] - sum(b for c, b in snap.items() if str(c).split(".")[-1] in state)
                if above > self.above_state:
                    self.above_state, self.above_state_snap = above, {str(c).split(".")[-1]: b
                                                                      for c, b in snap.items()}
                if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = deepcopy(snap)
    return GlobalPeak


def measure(case: dict) -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from megatron.lite.runtime.contracts import ParallelConfig

    family, m = case["family"], case["mesh"]
    world, pp, stage = m["world"], m["pp"], case["stage"]
    rank = stage * (world // pp)
    t0 = time.perf_counter()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        proto = importlib.import_module(f"megatron.lite.model.{family}.lite.protocol")
        cfg = mo.model_config(family, case["facts"])
        impl_names = {f.name for f in fields(proto.ImplConfig)}
        kw = dict(parallel=ParallelConfig(tp=m["tp"], etp=m["etp"], ep=m["ep"], pp=pp, vpp=m["vpp"], cp=m["cp"]),
                  optimizer="fsdp2", use_thd=False, mtp_enable=bool(case["mtp_enable"]),
                  recompute=case["recompute"], use_deepep=False)
        impl = proto.ImplConfig(**{k: v for k, v in kw.items() if k in impl_names})
        with mo.MetaParams():
            bundle = proto.build_model(cfg, impl_cfg=impl)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        _fake_params(bundle.chunks, mode)
        model = bundle.chunks[0]
        ps = bundle.parallel_state
        T = case["tokens_per_gpu"]          # tokens on this rank (its 1/CP share of the sequence)
        seq = T * ps.cp_size
        with mode:
            ids = torch.zeros(1, T, dtype=torch.long)
            pos = torch.zeros(3, 1, seq, dtype=torch.long)
            labels = torch.zeros(1, T, dtype=torch.long)
            hidden = None if model.pre_process else torch.empty(T // max(ps.tp_size, 1), 1, cfg.hidden_size,
                                                                dtype=torch.bfloat16, requires_grad=True)
            tracker = _global_peak_tracker(MemTracker)()
            tracker.track_external(model)
            with tracker:
                out = model(input_ids=ids if model.pre_process else None, hidden_states=hidden,
                            position_ids=pos, labels=labels if model.post_process else None)
                loss = out["loss"] if "loss" in out else out["hidden_states"].float().sum()
                loss.backward()
        peak = tracker.get_tracker_snapshot("peak")
        by = {}
        for dev, cats in peak.items():
            for cat, b in cats.items():
                by[str(cat).split(".")[-1]] = by.get(str(cat).split(".")[-1], 0) + b
        return {"ok": True, "stage": stage, "recompute": case["recompute"], "peak_by_category": by,
                "peak_bytes": by.get("Total", 0), "above_state_bytes": tracker.above_state,
                "above_state_by_category": tracker.above_state_snap,
                "seconds": round(time.perf_counter() - t0, 1)}
    except Exception as e:  # noqa: BLE001 - a step that cannot run is reported with where it stopped
        return {"ok": False, "stage": stage, "recompute": case["recompute"], "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(limit=-6)}
    finally:
        dist.destroy_process_group()


def main() -> None:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    mo._stand_ins()
    _compute_stand_ins()
    cases = json.load(sys.stdin)
    print(json.dumps([measure(c) for c in cases]))


if __name__ == "__main__":
    main()

"""Megatron Lite's real model, one training step measured on fake tensors: reads cases (JSON on stdin), prints per
rank the step's peak bytes (JSON on stdout).

Run like tests/support/mlite_memory_oracle.py (`$MLITE_ROOT/experimental/lite` on PYTHONPATH, torch and
megatron-core). Per case — one model, one mesh, one rank of one pipeline stage, recompute full or none, FSDP2 or not:
  1. the model is built as the memory oracle builds it: torch's fake process group at that rank; the family's own
     `build_model` under meta parameters, with the launchers' recompute spec (`build_model` applies it with
     Megatron Lite's own `apply_recompute`); with `fsdp2`, the bundle's `post_model_load_hook` (Megatron Lite's
     FSDP2 wrapping and AdamW) too;
  2. the parameters become fake tensors (`torch._subclasses.FakeTensorMode`: shapes, dtypes, no storage) — with
     FSDP2 through its own `to_empty`, which gives the meta-built shards (fake) storage;
  3. a micro-batch of the plan's per-GPU token budget goes through the family's own THD step, as the engine runs
     it (`protocol_utils.pack_thd_forward_kwargs` or DeepSeek-V4's packing: sequences of the run's longest prompt +
     response packed to T·CP tokens, the CP split, the loss context), forward, through the loss, and backward,
     under torch's `MemTracker` (its global peak only). Integer tensors up to SMALL elements (the packing's
     sequence offsets) stay constant fake tensors, so the THD helpers can read them back;
  4. reported: the highest, over the step, of what is live beyond parameters, gradients and buffers (activations
     and temporaries: without FSDP2 the parameters are unsharded and whole, so only this part is the step's), and,
     with FSDP2, the step's whole peak — two micro-batches, the second with the first's reduced gradients
     resident, as every micro-batch after a step's first runs.
What has no CPU path and stands in for it (each keeps for backward what the real kernel keeps; the source read):
  - te.Linear / te.GroupedLinear (TransformerEngine `module/linear.py`, `grouped_linear.py`: the bf16 input and
    the weights): torch's `F.linear`, per expert over the split — the same tensors saved by torch's autograd;
  - te.RMSNorm (`module/rmsnorm.py` / `ops/basic/rmsnorm.py`: the input and the fp32 rsigma per row) and
    te.LayerNormLinear (`module/layernorm_linear.py`: the input, the bf16 ln_out for the weight's gradient, the
    weights and the fp32 rsigma): Functions saving exactly those (torch's own CPU rms_norm would keep an fp32
    copy of the input no GPU run keeps);
  - te.DotProductAttention (flash / fused attention: `FusedAttnFunc` keeps q, k, v, out, the fp32 softmax
    log-sum-exp and the RNG state): a Function that saves exactly q, k, v, out and an fp32 [heads, T] lse;
  - torch's scaled_dot_product_attention (Megatron Lite's MLA under CP when the value head dim differs: on a GPU
    the memory-efficient kernel, which saves query, key, value, output and an fp32 [B, H, S] log-sum-exp): a
    Function saving exactly those;
  - the DSA training kernel (GLM-5.1: `dsa_kernels.FusedIndexerSparseAttnFunc`, cuDNN / FlashMLA): a Function that
    allocates and frees the indexer's fp32 scores [b, sq, skv] in forward and saves the query, KV, sink, top-k
    indices, output, lse and the indexer's precomputed gradients, as the kernel's forward does; its no-grad path
    (the recompute's first forward) keeps the real SparseAttnFunc with the indexer's scoring and top-k and
    FlashMLA's forward standing in (the scores, indices, output and lse at their shapes);
  - FLA's causal_conv1d (the packed path's convolution: `CausalConv1dFunction` keeps its input and the weight):
    a Function saving those;
  - FLA's chunk_gated_delta_rule (`ChunkGatedDeltaRuleFunction.forward` keeps q, k, v, g, beta, A (the chunk-local
    [T, H, 64] fp32 matrix) and the initial state; h is recomputed in backward): a Function saving those;
  - the MoE token dispatcher's all-to-all path computes its splits with `.tolist()` (no values under fake
    tensors): balanced routing — every expert gets T·k/E tokens — with the real permute (unfused: it keeps the
    sorted indices) and the real `_AllToAll` (keeps nothing);
  - CUDA RNG state in the recompute wrapper: a no-op;
  DeepSeek-V4's CSA under CP (Megatron Lite's `csa.py` THD context-parallel path, which calls megatron-core's
  `experimental_attention_variant.csa_cp_utils`, `csa_cp_layout_kernels` and `csa_kernels`: megatron/core at
  43124b60, the last commit with those modules before they moved into `csa_utils/`; no released megatron-core has
  them), only where that megatron/core is importable:
  - FlashMLA's sparse forward (`csa_kernels._csa_fwd_flash_mla` calls `flash_mla_sparse_fwd`: out [sq, heads, d_v],
    fp32 max logits and lse [sq, heads]): those tensors, unfilled — `CSASparseAttnFunc` saves what it saves around
    them (q, kv, sink, indices, out, lse);
  - cuDNN frontend's DSA kernels (`_DSA`): the indexer's fp32 scores [q, k], the top-k int32 indices [q, topk] and
    the sparse attention's backward (dq, dkv, d_sink like their inputs), at the shapes the wrappers return;
  - the CuTeDSL layout kernels (`csa_cp_layout_kernels`): their own allocations run, the launch writing into them is
    skipped; `torch.compile` off (`_build_cp_indexer_layout`'s per-sequence offsets run eagerly, a few bytes);
  - megatron-core's all-gather allocates its output on `torch.cuda.current_device()`: the CPU here.
"""
from __future__ import annotations

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
SMALL = 4096     # integer tensors up to this size (sequence offsets, split lists) are computed for real


# --------------------------------------------------------------------------------------------- compute stand-ins

class _RMSNorm(torch.autograd.Function):
    """TE's RMSNorm: keeps its bf16 input and the fp32 reciprocal standard deviation per row."""

    @staticmethod
    def forward(ctx, x, w):
        rs = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        ctx.save_for_backward(x, w, rs)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        x, w, _ = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w)


class _NormLinear(torch.autograd.Function):
    """TE's LayerNormLinear (RMSNorm): keeps its input, the normalized bf16 ln_out (for the weight's gradient), the
    weight and the fp32 rsigma per row."""

    @staticmethod
    def forward(ctx, x, ln_w, w):
        ln_out = torch.empty_like(x)
        rs = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        ctx.save_for_backward(x, ln_w, w, ln_out, rs)
        return torch.empty(*x.shape[:-1], w.shape[0], dtype=x.dtype, device=x.device)

    @staticmethod
    def backward(ctx, g):
        x, ln_w, w, _, _ = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(ln_w), torch.empty_like(w)


def _te_forwards() -> None:
    import transformer_engine.pytorch as te

    def linear_fwd(self, x, *a, **k):
        return F.linear(x, self.weight, getattr(self, "bias", None))

    def ln_linear_fwd(self, x, *a, **k):
        out = _NormLinear.apply(x, self.layer_norm_weight, self.weight)
        return out if getattr(self, "bias", None) is None else out + self.bias

    def rms_fwd(self, x, *a, **k):
        return _RMSNorm.apply(x, self.weight)

    def grouped_fwd(self, x, m_splits, *a, **k):
        outs = [F.linear(part, getattr(self, f"weight{i}"))
                for i, part in enumerate(torch.split(x, list(m_splits), dim=0))]
        return torch.cat(outs, dim=0)

    te.Linear.forward = linear_fwd
    te.LayerNormLinear.forward = ln_linear_fwd
    te.RMSNorm.forward = rms_fwd
    te.GroupedLinear.forward = grouped_fwd
    te.DotProductAttention.forward = lambda self, q, k, v, *a, **kw: _Attention.apply(q, k, v)
    F.scaled_dot_product_attention = _sdpa


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


class _SDPA(torch.autograd.Function):
    """torch's scaled_dot_product_attention on a GPU for [B, H, S, D] inputs whose value head dim differs from the
    query's (Megatron Lite's MLA under CP: `mla.py` `_torch_core_attention` on the CP-gathered sequence), which the
    flash backend does not take: the memory-efficient kernel (`_scaled_dot_product_efficient_attention`, its
    derivatives.yaml entry) saves query, key, value, output and the fp32 log-sum-exp [B, H, S]. On CPU the math
    path would build the S x S scores no GPU run builds."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.empty(*q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    return _SDPA.apply(q, k, v)


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


class _IndexerSparseAttention(torch.autograd.Function):
    """Megatron Lite's training DSA kernel (`kernels/dsa_kernels.py` FusedIndexerSparseAttnFunc, cuDNN/FlashMLA):
    in forward it materialises the indexer's fp32 scores [b, sq, skv] (`_indexer_topk_bshd`) and frees them; it
    saves the flattened query and KV (views), the sink, the int32 top-k indices [b·sq, topk], the output
    [sq·b, heads, d_v], the fp32 lse [sq·b, heads] and the indexer's precomputed gradients (like q_indexer,
    k_indexer and weights)."""

    @staticmethod
    def forward(ctx, query, kv_full, attn_sink, q_indexer, k_indexer, weights, topk, d_v):
        sq, b, heads, _ = query.shape
        scores = torch.empty(b, sq, k_indexer.shape[0], dtype=torch.float32, device=query.device)
        idx = torch.empty(b * sq, topk, dtype=torch.int32, device=query.device)
        del scores
        out = torch.empty(sq * b, heads, d_v, dtype=query.dtype, device=query.device)
        lse = torch.empty(sq * b, heads, dtype=torch.float32, device=query.device)
        ctx.save_for_backward(query, kv_full, attn_sink, idx, out, lse, torch.empty_like(q_indexer),
                              torch.empty_like(k_indexer), torch.empty_like(weights))
        return out.reshape(sq, b, heads * d_v), torch.zeros((), dtype=torch.float32, device=query.device)

    @staticmethod
    def backward(ctx, g, g_loss):
        q, kv, sink, *_ , gq, gk, gw = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(kv), torch.empty_like(sink), gq, gk, gw, None, None


def _indexer_sparse_attention(query, kv_full, attn_sink, window_idxs, q_indexer, k_indexer, weights, indexer_topk,
                              ratio, softmax_scale, *a, value_dim=None, **kw):
    return _IndexerSparseAttention.apply(query, kv_full, attn_sink, q_indexer, k_indexer, weights,
                                         int(indexer_topk) + window_idxs.shape[-1],
                                         512 if value_dim is None else int(value_dim))


def _indexer_topk(q_bshd, k_bsd, w_bsh, topk, ratio=4):
    """The DSA indexer's scoring and top-k (`dsa_kernels._indexer_topk_bshd`, cuDNN + TRT-LLM kernels): fp32 scores
    [b, sq, sk], int32 indices [b, sq, topk] and lengths [b, sq], as the real one returns them."""
    b, sq = q_bshd.shape[:2]
    scores = torch.empty(b, sq, k_bsd.shape[1], dtype=torch.float32, device=q_bshd.device)
    idx = torch.empty(b, sq, topk, dtype=torch.int32, device=q_bshd.device)
    return idx, torch.empty(b, sq, dtype=torch.int32, device=q_bshd.device), scores


def _flash_mla(q, kv, topk_idxs, softmax_scale, attn_sink=None, topk_length=None, indexer_topk=0, d_v=512):
    """FlashMLA's sparse forward (`dsa_kernels._dsa_fwd_flash_mla`): out [sq, heads, d_v], fp32 lse [sq, heads] and
    the indexer's lse."""
    sq, heads = q.shape[:2]
    lse = torch.empty(sq, heads, dtype=torch.float32, device=q.device)
    return torch.empty(sq, heads, d_v, dtype=q.dtype, device=q.device), lse, torch.empty_like(lse)


class _CausalConv(torch.autograd.Function):
    """FLA's causal_conv1d (`fla/modules/convolution.py` CausalConv1dFunction, SiLU fused): saves its input and the
    weight; the output is a new tensor like the input."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w)


def _causal_conv(x, weight, bias=None, activation=None, cu_seqlens=None, **kw):
    return _CausalConv.apply(x, weight), None


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


def _flash_mla_sparse_fwd(q, kv, indices, softmax_scale, d_v=512, attn_sink=None, topk_length=None, indexer_topk=0):
    s, h = q.shape[:2]
    lse = torch.empty(s, h, dtype=torch.float32, device=q.device)
    out = torch.empty(s, h, d_v, dtype=q.dtype, device=q.device)
    return (out, torch.empty_like(lse), lse) + ((torch.empty_like(lse),) if indexer_topk > 0 else ())


def _dsa_indexer_forward(q, k, w, ratio=1, cu_seqlens_q=None, max_seqlen_k=None, **kw):
    shape = (q.shape[0], int(max_seqlen_k)) if cu_seqlens_q is not None else (*q.shape[:2], k.shape[1])
    return {"scores": torch.empty(*shape, dtype=torch.float32, device=q.device)}


def _dsa_top_k(scores, seq_lens, top_k=1, **kw):
    return {"indices": torch.empty(scores.shape[0], top_k, dtype=torch.int32, device=scores.device)}


def _dsa_sparse_attention_backward(q, kv, out, d_out, lse, attn_sink, topk_idxs, **kw):
    return {"dq": torch.empty_like(q), "dkv": torch.empty_like(kv), "d_sink": torch.empty_like(attn_sink)}


def _csa_stand_ins() -> None:
    """DeepSeek-V4's CSA kernels (the module docstring), where megatron-core has Lite's CSA modules."""
    import contextlib
    import types

    import torch._dynamo

    try:
        from megatron.core.transformer.experimental_attention_variant import csa_cp_layout_kernels as layout
        from megatron.core.transformer.experimental_attention_variant import csa_kernels
    except ImportError:
        return
    if getattr(csa_kernels, "__file__", None) is None:     # the memory oracle's placeholder
        return
    layout._require_cute = lambda *a, **k: None
    layout._run_compiled_launch = lambda *a, **k: None
    for name in ("_build_attention_indices_launch", "_compressor_input_compact_fwd_launch",
                 "_compressor_input_compact_bwd_launch"):
        setattr(layout, name, None)         # defined only where CuTeDSL imports
    csa_kernels._flash_mla_sparse_fwd = _flash_mla_sparse_fwd
    csa_kernels._get_topk_alignment = lambda: 128          # SM90's (H100)
    csa_kernels._DSA = types.SimpleNamespace(indexer_forward_wrapper=_dsa_indexer_forward,
                                             indexer_top_k_wrapper=_dsa_top_k,
                                             sparse_attention_backward_wrapper=_dsa_sparse_attention_backward)
    torch.cuda.nvtx.range = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.current_device = lambda: "cpu"
    torch._dynamo.config.disable = True


def _compute_stand_ins() -> None:
    _te_forwards()
    torch.cuda.get_rng_state = lambda *a, **k: torch.empty(0, dtype=torch.uint8)
    torch.cuda.set_rng_state = lambda *a, **k: None
    from megatron.lite.primitive.modules import dispatcher, gated_delta_net
    from megatron.lite.primitive.utils import moe as moe_utils
    moe_utils._te_general_gemm = lambda *a, **k: None  # the router's gemm: Megatron Lite's own torch fallback
    gated_delta_net.GatedDeltaNet._gated_delta_rule = _gdn_rule
    gated_delta_net._HAS_FLA, gated_delta_net._fla_causal_conv1d = True, _causal_conv   # the packed path's conv
    from megatron.lite.primitive.kernels import dsa_kernels
    dsa_kernels.fused_indexer_sparse_attn = _indexer_sparse_attention
    dsa_kernels._indexer_topk_bshd, dsa_kernels._dsa_fwd_flash_mla = _indexer_topk, _flash_mla   # no-grad path
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
    _csa_stand_ins()


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

        def _pre_fw_hook(self, module, inputs) -> None:
            # the root called again before its backward (the pipeline's next micro-batch): MemTracker's per-module
            # stats refuse it; the global peak this keeps needs none
            name = self._mod_tracker.get_known_fqn(module)
            if module in self.memory_tracking and not self._mod_tracker.is_bw \
                    and set(self._mod_tracker.parents) - {name} == {"Global"}:
                return
            super()._pre_fw_hook(module, inputs)

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


def _packed_batch(tokens: int, seq_len: int, ps):
    """One micro-batch as the engine hands it to the family's step: a PackedBatch of `tokens` tokens (the CP group's
    whole micro-batch) in sequences of the run's longest prompt + response, the rest in one shorter sequence. Real
    integer tensors (the packing reads lengths back with .item())."""
    from megatron.lite.runtime.contracts.data import PackedBatch

    align = max(ps.tp_size, 1) * (2 * ps.cp_size if ps.cp_size > 1 else 1)
    seq_len = max(align, seq_len // align * align)
    lengths = [seq_len] * (tokens // seq_len) + ([tokens % seq_len] if tokens % seq_len >= align else [])
    total = sum(lengths)
    return PackedBatch(input_ids=torch.zeros(total, dtype=torch.long), labels=torch.zeros(total, dtype=torch.long),
                       seq_lens=torch.tensor(lengths, dtype=torch.int32),
                       loss_mask=torch.ones(total, dtype=torch.bool))


def _step_kwargs(proto, model, batch) -> dict:
    """The forward's arguments as the family's own `_forward_step` builds them (THD packing, the CP split, the loss
    context), built before the fake mode: the packing reads lengths back with .item()."""
    from megatron.lite.model import protocol_utils as pu

    prepare = getattr(proto, "_prepare_model_forward_kwargs", None)    # DeepSeek-V4's own packing
    kwargs = prepare(model, batch) if prepare is not None else pu.pack_thd_forward_kwargs(model, batch)
    pu.add_loss_context_kwargs(kwargs)
    pu.add_cross_entropy_fusion(kwargs, model)
    return kwargs


def _constants(kwargs: dict, mode) -> dict:
    """The step's small integer tensors (the packing's cu_seqlens, which the THD helpers read back with .item())
    become constant fake tensors: the fake mode computes on them for real. Everything sized by tokens is fake."""
    import dataclasses

    def conv(x):
        if isinstance(x, torch.Tensor) and not x.is_floating_point() and x.numel() <= SMALL:
            return mode.fake_tensor_converter.from_real_tensor(mode, x, make_constant=True)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                setattr(x, f.name, conv(getattr(x, f.name)))
        return x
    return {k: conv(v) for k, v in kwargs.items()}


def _loss(out) -> torch.Tensor:
    """What backward starts from: the model's loss, else the summed log-probs (the policy loss reads them), else the
    stage's output hidden states (a middle stage's backward starts from the next stage's gradient)."""
    if isinstance(out, dict):
        for key in ("loss", "log_probs"):
            if out.get(key) is not None:
                return out[key].float().sum()
        return out["hidden_states"].float().sum()
    return out.float().sum()


def _one_f_one_b(model, ps, kwargs: dict, T: int, cfg, microbatches: int) -> None:
    """`microbatches` micro-batches through Megatron Lite's own 1F1B schedule (`primitive/parallel/pipeline.py`
    `_1f1b_schedule`: PP − 1 − s forwards of warm-up kept, then one forward and one backward at a time) on a stage
    before the last (the last would need the engine's loss function): its sends and receives go through the real
    `_send_recv_pipeline` over the fake process group, the shapes the sender would transmit given instead of
    exchanged (`_communicate_shapes`: the stage's output, [T/TP, 1, hidden·hc_mult] in bf16)."""
    from megatron.lite.primitive.parallel import pipeline

    if ps.pp_is_last:
        raise ValueError("the 1F1B measurement runs on a stage before the last of a PP > 1 mesh")
    shape = (T // max(ps.tp_size, 1), 1, cfg.hidden_size * (getattr(cfg, "hc_mult", None) or 1))
    pipeline._communicate_shapes = lambda send_fwd, send_bwd, recv_fwd, recv_bwd, ps, **k: \
        (shape if recv_fwd else None, shape if recv_bwd else None)

    def step(m, batch):
        out = m(**batch)
        return out if isinstance(out, dict) else {"hidden_states": out}
    pipeline._1f1b_schedule(step, model, iter([(kwargs, None)] * microbatches), microbatches, None, ps, shape)


def measure(case: dict) -> dict:
    from torch._subclasses import fake_tensor
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from megatron.lite.runtime.contracts import ParallelConfig
    from megatron.lite.runtime.contracts.config import OptimizerConfig

    family, m = case["family"], case["mesh"]
    wrapped = bool(case.get("fsdp2"))
    world, pp, stage = m["world"], m["pp"], case["stage"]
    rank = stage * (world // pp)
    t0 = time.perf_counter()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        proto = importlib.import_module(f"megatron.lite.model.{family}.lite.protocol")
        cfg = mo.model_config(family, case["facts"])
        impl_names = {f.name for f in fields(proto.ImplConfig)}
        kw = dict(parallel=ParallelConfig(tp=m["tp"], etp=m["etp"], ep=m["ep"], pp=pp, vpp=m["vpp"], cp=m["cp"]),
                  optimizer="fsdp2", use_thd=True, mtp_enable=bool(case["mtp_enable"]),
                  recompute=case["recompute"], use_deepep=False,
                  optimizer_config=OptimizerConfig(offload_fraction=case.get("offload_fraction", 1.0)))
        impl = proto.ImplConfig(**{k: v for k, v in kw.items() if k in impl_names})
        with mo.MetaParams():
            bundle = proto.build_model(cfg, impl_cfg=impl)
            if wrapped:     # Megatron Lite's FSDP2 wrapping (and its AdamW), as the memory oracle builds it
                bundle.extras["post_model_load_hook"]()
        fake_tensor.CONSTANT_NUMEL_LIMIT = SMALL     # what is computed from those constants stays constant
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        if wrapped:
            with mode:      # FSDP2's own way to give meta-built shards storage: here, fake storage
                for chunk in bundle.chunks:
                    chunk.to_empty(device="cpu")
        else:
            _fake_params(bundle.chunks, mode)
        model = bundle.chunks[0]
        ps = bundle.parallel_state
        T = case["tokens_per_gpu"]          # tokens on this rank (its 1/CP share of the micro-batch)
        batch = _packed_batch(T * ps.cp_size, int(case.get("seq_len") or T * ps.cp_size), ps)
        kwargs = _constants(_step_kwargs(proto, model, batch), mode)
        with mode:
            if not model.pre_process:       # a later stage gets the previous stage's output, as the schedule sends it
                width = cfg.hidden_size * (getattr(cfg, "hc_mult", None) or 1)
                model.set_input_tensor(torch.empty(T // max(ps.tp_size, 1), 1, width, dtype=torch.bfloat16,
                                                   requires_grad=True))
            tracker = _global_peak_tracker(MemTracker)()
            tracker.track_external(model)
            with tracker:
                if case.get("microbatches"):     # the stage's micro-batches under Megatron Lite's own 1F1B
                    _one_f_one_b(model, ps, kwargs, T, cfg, int(case["microbatches"]))
                # wrapped: two micro-batches, the second with the first's reduced gradients resident, as every
                # micro-batch after a step's first runs
                for _ in range(0 if case.get("microbatches") else 2 if wrapped else 1):
                    out = model(**kwargs)
                    _loss(out).backward()
                    del out
                    tracker.reset_mod_stats()
        peak = tracker.get_tracker_snapshot("peak")
        by = {}
        for dev, cats in peak.items():
            for cat, b in cats.items():
                by[str(cat).split(".")[-1]] = by.get(str(cat).split(".")[-1], 0) + b
        return {"ok": True, "stage": stage, "recompute": case["recompute"], "fsdp2": wrapped, "peak_by_category": by,
                "peak_bytes": by.get("Total", 0), "above_state_bytes": tracker.above_state,
                "above_state_by_category": tracker.above_state_snap,
                "seconds": round(time.perf_counter() - t0, 1)}
    except Exception as e:  # noqa: BLE001 - a step that cannot run is reported with where it stopped
        return {"ok": False, "stage": stage, "recompute": case["recompute"], "error": f"{type(e).__name__}: {e}",
                "trace": "".join(l for l in traceback.format_exc(limit=-60).splitlines(True) if ".stack" in l or "/work/main" in l or "Error" in l)}
    finally:
        dist.destroy_process_group()


def main() -> None:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    mo._stand_ins()
    mo._optimizer_under_fake_tensors()
    _compute_stand_ins()
    cases = json.load(sys.stdin)
    print(json.dumps([measure(c) for c in cases]))


if __name__ == "__main__":
    main()

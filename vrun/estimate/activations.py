"""What one decoder layer keeps for its backward, in bytes per token, counted from the tensors Megatron Lite's layers
save — pure arithmetic on the architecture facts.

A layer's bytes split three ways by how they scale with the mesh:
  local      per token of the rank's share of the micro-batch, divided by TP (sequence parallel);
  gathered   per token of the whole CP group's sequence (× CP / TP): attention paths that all-gather the sequence
             before they attend — MLA when its value head differs from the query's (Kimi-K2: `mla.py`
             `_torch_core_attention_thd` on the CP-gathered q, k, v) and GLM-5's DSA (`dsa.py` gathers x, then runs
             the absorbed MLA over it); with CP = 1 the two coincide;
  backward   what the layer's backward adds while it runs (the gradients of its attention inputs, per own or
             gathered token) — held once, by the layer in its backward.

The terms, bytes per token (h hidden, k top-k, f routed-expert FFN, f_s shared-expert FFN × shared experts, E routed
experts, bf16 = 2 B, fp32 = 4 B), each a tensor the layer's autograd keeps (read from Megatron Lite d48bd6be and
checked tensor by tensor on its real model: tests/support/mlite_activation_oracle.py):
  MoE block    the norm's input 2h, the router's fp32 input 4h and its fp32 logits and scores 8E, the top-k ids and
               probs 16k and the permutation 8k; per routed copy the dispatched token 2h, the fc1 output 4f and
               the SwiGLU output 2f; the shared expert its input 2h and 8·f_s (gate, up, product, down input)
  dense MLP    4h + 6·f_dense (the first dense layers)
  GQA          (Qwen3.5's full attention, TE's fused attention, ring CP: local) the input and normalised input 4h,
               12 B per query channel (the projection, norms, rope, output and the output projection's input) and
               8 more with the output gate (its fp32 sigmoid and the gated product), 12 per key/value channel
  GDN          (Qwen3.5's linear attention; head-parallel CP moves heads, not bytes) the convolution's input and
               output 4·conv_dim, 22 per value channel (q, k, v, g, their fp32 normalised copies, the gated norm's
               input, the output projection's input), the fp32 chunk matrix 4·64 per value head, 6h
  MLA          local: the input 2h, the LoRA ranks 4·q_lora + 4·kv_lora, the rope key 2·rope, the output projection's
               input 2·heads·v; the attention's q, k, v, output and lse heads·(4(n + r) + 4v + 4) — gathered under CP
               when v ≠ n + r; backward: dq, dk, dv heads·(4(n + r) + 2v), and gathered twice that (the gradients
               and their copies back through the zigzag reconstruction)
  MLA + DSA    (GLM-5, absorbed; all gathered under CP) the input 2h and the gathered input 2h, 4·q_lora, the latent
               KV 2(kv_lora + r), per head the absorbed query 2(kv_lora + r), the latent output 2·kv_lora, the
               pre-absorption q_nope 2n and the output projection's input 2v; the top-k ids 4·topk; the indexer's
               query and its precomputed gradient 4·index_heads·index_dim; backward: the absorbed query's gradient
               heads·2(kv_lora + r)
               and in its forward, one packed sequence at a time, the indexer's fp32 scores 4·seq_len² (not per token)
  CSA          (DeepSeek-V4, its THD context-parallel path; q heads·head_dim = qd, head_dim d) the input 2h, the
               query's LoRA rank twice 4·q_lora, the query in fp32 and four bf16 copies (projected, rope'd, packed,
               the attention's output, the output projection's grouped input) 4·qd + 10·qd, the KV and the packed
               KV with its window 4d, the window's int32 indices 4·window, the grouped output LoRA 2·o_groups·o_lora;
               a compressed layer (compress_ratios[i] > 1) adds its compacted input 2h and the compressor's fp32
               weights and two bf16 copies over overlapping groups 8d (16d at ratio 4, which overlaps), and ratio 4
               the indexer's compressor 16·index_dim and its top-k indices 4·topk; backward: the query's gradient
               2·qd
  mHC          (hc_mult streams m) per hyper-connection (two a layer) its input 2·m·h and the Sinkhorn iterations'
               [m, m] mixes 20·(4m² + 8m); the two sub-blocks' outputs 4h and the two norms' inputs 4h
  clamped MoE  (DeepSeek-V4: swiglu_limit > 0, `experts.swiglu_with_probs` clamps in fp32) per routed copy the
               dispatched token 2h, six fp32 [f] tensors of the clamped SwiGLU 24f and its bf16 output 2f; the shared
               expert 22·f_s; the router's fp32 scores, ids and logits 18E
"""
from __future__ import annotations

from typing import NamedTuple, Optional


class LayerBytes(NamedTuple):
    local: float = 0.0              # kept for backward, per token of the rank's own
    gathered: float = 0.0           # kept for backward, per token of the CP-gathered sequence
    backward_local: float = 0.0     # added while the layer's backward runs, per own token
    backward_gathered: float = 0.0  # the same, per gathered token

    def __add__(self, o):  # noqa: D105  (term by term)
        return LayerBytes(*(a + b for a, b in zip(self, o)))

    def kept(self, tokens: float, tp: int, cp: int) -> float:
        """Bytes one rank keeps for this layer's backward, for `tokens` tokens of its own."""
        return tokens * (self.local + self.gathered * cp) / tp

    def in_backward(self, tokens: float, tp: int, cp: int) -> float:
        """Bytes one rank holds for this layer while its backward runs: what it kept and what the backward adds."""
        return self.kept(tokens, tp, cp) + tokens * (self.backward_local + self.backward_gathered * cp) / tp


class Shape(NamedTuple):
    """The model's layers as the activation estimate reads them: the mean layer, the biggest, how it is known."""
    mean: LayerBytes
    biggest: LayerBytes
    measured: bool
    kind: str
    squared: float = 0.0    # bytes per (sequence length)² a layer's forward holds for one sequence at a time


# architecture kinds whose layers the oracle runs on Megatron Lite's real model (tests/test_activation_oracle.py
# holds each within 20% of the measured step, with and without recompute)
MEASURED_KINDS = frozenset({"csa", "gdn_hybrid", "mla", "mla_dsa"})


# DeepSeek-V4's SwiGLU clamp (Megatron Lite deepseek_v4/config.py swiglu_limit, as its released config.json); the
# other families' configs have none
SWIGLU_LIMITS = {"csa": 10.0}
SINKHORN_ITERS = 20     # Megatron Lite deepseek_v4/config.py hc_sinkhorn_iters


def _moe(a: dict) -> LayerBytes:
    h, k, f, e = a["hidden"], a["experts_per_token"] or 0, a["expert_ffn_hidden"] or 0, a["routed_experts"] or 0
    shared = (a.get("shared_expert_ffn_hidden") or f) * (a.get("shared_experts") or 0)
    if a.get("swiglu_limit", SWIGLU_LIMITS.get(a.get("attention"), 0.0)):
        # gate and up clamped in fp32, SiLU, the product and the probabilities' product: six fp32 [f] tensors kept
        return LayerBytes(2 * h + 18 * e + k * (2 * h + 26 * f) + 22 * shared)
    b = 2 * h + 4 * h + 8 * e + 16 * k + 8 * k + k * (2 * h + 4 * f + 2 * f)
    return LayerBytes(b + (2 * h + 8 * shared if shared else 0))


def _dense_mlp(a: dict) -> LayerBytes:
    return LayerBytes(4 * a["hidden"] + 6 * (a.get("dense_ffn_hidden") or 0))


def _gqa(a: dict) -> LayerBytes:
    qd = a["heads"] * a["head_dim"]
    kvd = (a.get("kv_heads") or a["heads"]) * a["head_dim"]
    return LayerBytes(4 * a["hidden"] + qd * (12 + (8 if a.get("attn_output_gate") else 0)) + 12 * kvd,
                      backward_local=2 * qd + 4 * kvd)


def _gdn(a: dict) -> LayerBytes:
    d = a.get("gdn_head_dim") or a.get("head_dim") or 128
    vh, kh = a.get("gdn_v_heads") or a["heads"], a.get("gdn_k_heads") or a["heads"]
    conv, vd = 2 * kh * d + vh * d, vh * d
    return LayerBytes(4 * conv + 22 * vd + 4 * vh * 64 + 6 * a["hidden"], backward_local=2 * conv)


def _mla(a: dict, cp: int) -> LayerBytes:
    h, heads = a["hidden"], a["heads"]
    n, r, v = a["qk_nope_head_dim"] or 0, a["qk_rope_head_dim"] or 0, a["v_head_dim"] or 0
    local = 2 * h + 4 * (a.get("q_lora_rank") or 0) + 4 * (a.get("kv_lora_rank") or 0) + 2 * r + 2 * heads * v
    core, grads = heads * (4 * (n + r) + 4 * v + 4), heads * (4 * (n + r) + 2 * v)
    if cp > 1 and v != n + r:
        # the gathered q, k, v's gradients, and their copies back through the zigzag reconstruction
        return LayerBytes(local, core, backward_gathered=2 * grads)
    return LayerBytes(local + core, backward_local=grads)


def _mla_dsa(a: dict, cp: int) -> LayerBytes:
    h, heads, lat = a["hidden"], a["heads"], a.get("kv_lora_rank") or 0
    n, r, v = a["qk_nope_head_dim"] or 0, a["qk_rope_head_dim"] or 0, a["v_head_dim"] or 0
    per = 2 * h + 4 * (a.get("q_lora_rank") or 0) + 2 * (lat + r) + heads * (2 * (lat + r) + 2 * lat + 2 * n + 2 * v) \
        + 4 * (a.get("index_topk") or 0) + 4 * (a.get("index_heads") or 0) * (a.get("index_head_dim") or 0)
    back = heads * 2 * (lat + r)      # the absorbed query's gradient
    if cp > 1:
        return LayerBytes(2 * h, per, backward_gathered=back)
    return LayerBytes(2 * h + per, backward_local=back)


def _mhc(a: dict) -> float:
    """The hyper-connections around a layer's two sub-blocks, and the norms and outputs between them."""
    h, m = a["hidden"], a.get("hc_mult") or 1
    return 2 * (2 * m * h + SINKHORN_ITERS * (4 * m * m + 8 * m)) + 4 * h + 4 * h


def _csa(a: dict, ratio: int) -> LayerBytes:
    h, d = a["hidden"], a["head_dim"]
    qd = a["heads"] * d
    b = 2 * h + 4 * (a.get("q_lora_rank") or 0) + 14 * qd + 4 * d + 4 * (a.get("sliding_window") or 0) \
        + 2 * (a.get("o_lora_rank") or 0) * (a.get("o_groups") or 1)
    if ratio == 4:      # overlapping groups, and the indexer
        b += 2 * h + 16 * d + 16 * (a.get("index_head_dim") or 0) + 4 * (a.get("index_topk") or 0)
    elif ratio > 1:
        b += 2 * h + 8 * d
    return LayerBytes(b + _mhc(a), backward_local=2 * qd)


def shape(a: dict, cp: int) -> Optional[Shape]:
    """The model's layer bytes at this CP, or None when the facts lack what the count needs."""
    kind = a.get("attention") or "gqa"
    try:
        if kind == "gdn_hybrid":
            every = a.get("full_attention_interval") or 4
            full, linear = _gqa(a), _gdn(a)
            layers = [full if (i + 1) % every == 0 else linear for i in range(a["layers"])]
        elif kind == "mla":
            layers = [_mla(a, cp)] * a["layers"]
        elif kind == "mla_dsa":
            layers = [_mla_dsa(a, cp)] * a["layers"]
        elif kind == "csa":
            ratios = list(a.get("compress_ratios") or [])
            layers = [_csa(a, ratios[i] if i < len(ratios) else 0) for i in range(a["layers"])]
        else:
            layers = [_gqa(a)] * a["layers"]
        dense = a.get("dense_layers") or 0
        moe, mlp = _moe(a), _dense_mlp(a)
        layers = [x + (mlp if i < dense else moe) for i, x in enumerate(layers)]
    except (KeyError, TypeError):
        return None
    if not layers:
        return None
    n = len(layers)
    mean = LayerBytes(*(sum(getattr(x, f) for x in layers) / n for f in LayerBytes._fields))
    biggest = max(layers, key=lambda x: x.in_backward(1, 1, max(cp, 1)))
    # GLM-5's DSA indexer scores each packed sequence whole in fp32, [sq, sk] (`_indexer_topk_bshd`), one sequence
    # at a time: the layer's forward holds 4·seq_len² bytes beside what it keeps
    return Shape(mean, biggest, kind in MEASURED_KINDS, kind, 4.0 if kind == "mla_dsa" else 0.0)

"""Parameter counts of each model from its architecture facts (conf/model/*.yaml `arch`), layer by layer.

Pure arithmetic, no torch. Every shape follows Megatron Lite's own modules (Megatron-LM `dev` d48bd6be,
experimental/lite/megatron/lite/...), named at each formula:
  mla        Kimi-K2 (DeepSeek-V3 style):  primitive/modules/attention/mla.py  MultiLatentAttention
  mla_dsa    GLM-5: MLA + DSA indexer:      primitive/modules/attention/dsa.py  DynamicSparseAttention, DSAIndexer
  csa        DeepSeek-V4: one-KV-head compressed attention with a grouped low-rank output, per-layer compressor
             (ratio 4: overlapping, with indexer; ratio 128: plain; 0: sliding window only) and mHC residual
             streams:  attention/csa.py CompressedSparseAttention, attention/hca.py HyperConnection,
             attention/mhc.py MultiHeadHyperConnectionHead, model/deepseek_v4/lite/model.py
  gdn_hybrid Qwen3.5: gated-delta-net layers + gated GQA every `full_attention_interval`-th layer:
             primitive/modules/gated_delta_net.py GatedDeltaNet, primitive/modules/gqa.py GQAttention(output_gate)
  MoE        router h·E, routed experts E·3·h·w (gate, up, down), shared experts 3·h·w_shared (Qwen3.5 adds a
             sigmoid gate h·1): primitive/modules/{router,experts,mlp}.py
  MTP        one decoder layer (with experts) + 2h·h input projection + norms; it shares the embedding and head
  vision     a ViT tower counted from its facts (Qwen3.5: transformers' Qwen3_5MoeVisionModel shapes) or given
             as a published figure (`vision_params`)
Counts are logical parameters. Norm weights are counted; buffers (attention sinks in GLM-5, DeepSeek-V4's
hash table, router bias buffers) are not.

total  = embedding + output (+ final norm) + decoder layers + MTP layers + vision
active = output head + decoder layers with top-k of the routed experts (no input embedding: a lookup, no
         compute; no MTP, no vision): the convention under which the published "A…B" figures are met
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

FAMILIES = ("mla", "mla_dsa", "csa", "gdn_hybrid", "gqa")


@dataclass(frozen=True)
class Layer:
    kind: str           # e.g. "mla+dense", "csa4+moe", "gdn+moe"
    dense: int          # attention, norms, router, shared experts, dense MLP, mHC
    routed: int         # all routed experts
    active: int         # dense + the top-k routed experts

    @property
    def total(self) -> int:
        return self.dense + self.routed


@dataclass(frozen=True)
class Count:
    embedding: int
    output: int                 # lm head + final norm (+ mHC head)
    layers: tuple               # Layer per decoder layer
    mtp: tuple = ()             # Layer per MTP layer (input projection and norms in `dense`)
    vision: int = 0
    source: str = "facts"
    estimates: tuple = ()       # what was not sourced (shown with the counts)

    @property
    def total(self) -> int:
        return self.embedding + self.output + sum(x.total for x in self.layers) + \
            sum(x.total for x in self.mtp) + self.vision

    @property
    def active(self) -> int:
        return self.output + sum(x.active for x in self.layers)


@dataclass(frozen=True)
class ParamCounts:
    """The parameter counts a plan reports (plan.json's params): from the model group's facts, with their parts,
    or from a checkpoint's headers, with the facts' total beside them when the facts count."""
    total: int
    active: Optional[int]           # None from a checkpoint
    source: str
    rollout: tuple                  # (dense, routed experts) that vLLM loads: no MTP
    # the parts and whether MTP is built: from the facts only (None from a checkpoint)
    embedding: Optional[int] = None
    output: Optional[int] = None
    decoder: Optional[int] = None
    routed_experts: Optional[int] = None
    mtp: Optional[int] = None
    vision: Optional[int] = None
    estimates: Optional[tuple] = None   # what was not sourced
    mtp_built: Optional[bool] = None    # whether the engine builds the MTP layers
    facts_total: Optional[int] = None   # from a checkpoint: the facts' count
    per_stage: Optional[tuple] = None   # per pipeline stage (vrun.estimate.memory.stage_split), with the memory estimate

    @classmethod
    def of_facts(cls, c: Count, *, mtp_built: bool) -> "ParamCounts":
        routed = sum(x.routed for x in c.layers)
        mtp = sum(x.total for x in c.mtp)
        return cls(total=c.total, active=c.active, source=c.source, rollout=(c.total - mtp - routed, routed),
                   embedding=c.embedding, output=c.output, decoder=sum(x.total for x in c.layers),
                   routed_experts=routed, mtp=mtp, vision=c.vision, estimates=tuple(c.estimates),
                   mtp_built=mtp_built)

    def summary(self) -> dict:
        out = {"total": self.total, "active": self.active, "source": self.source}
        if self.mtp_built is not None:  # counted from the facts
            out.update(embedding=self.embedding, output=self.output, decoder=self.decoder,
                       routed_experts=self.routed_experts, mtp=self.mtp, vision=self.vision,
                       estimates=list(self.estimates), mtp_built=self.mtp_built)
        out["rollout"] = list(self.rollout)
        if self.facts_total is not None:
            out["facts_total"] = self.facts_total
        if self.per_stage is not None:
            out["per_stage"] = list(self.per_stage)
        return out


def family(arch: dict) -> str:
    return arch.get("attention") or "gqa"


def missing(arch: dict) -> list[str]:
    """Facts a count needs that the model group lacks."""
    need = ["hidden", "layers", "routed_experts", "experts_per_token", "heads", "vocab", "expert_ffn_hidden"]
    fam = family(arch)
    need += {"mla": ["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"],
             "mla_dsa": ["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                         "index_heads", "index_head_dim"],
             "csa": ["head_dim", "q_lora_rank", "o_groups", "o_lora_rank", "index_heads", "index_head_dim",
                     "compress_ratios", "hc_mult"],
             "gdn_hybrid": ["head_dim", "kv_heads", "gdn_k_heads", "gdn_v_heads", "gdn_head_dim",
                            "full_attention_interval"],
             "gqa": []}.get(fam, [])
    out = [k for k in need if not arch.get(k)]
    if arch.get("dense_layers") and not arch.get("dense_ffn_hidden"):
        out.append("dense_ffn_hidden")
    if fam not in FAMILIES:
        out.append(f"attention (one of {', '.join(FAMILIES)})")
    return out


# --- attention, per family ---------------------------------------------------------------------------

def mla(a: dict) -> int:
    """MultiLatentAttention: q down (h·q_lora) + its norm + q up (q_lora·H·(nope+rope)); kv down
    (h·(kv_lora+rope)) + its norm + kv up (kv_lora·H·(nope+v)); output H·v·h."""
    h, H = a["hidden"], a["heads"]
    ql, kl, nope, rope, v = a["q_lora_rank"], a["kv_lora_rank"], a["qk_nope_head_dim"], a["qk_rope_head_dim"], \
        a["v_head_dim"]
    return h * ql + ql + ql * H * (nope + rope) + h * (kl + rope) + kl + kl * H * (nope + v) + H * v * h


def dsa_indexer(a: dict) -> int:
    """DSAIndexer: wq_b q_lora·IH·ID, wk h·ID, k_norm (LayerNorm, weight+bias) 2·ID, weights_proj h·IH."""
    h, ql, ih, idim = a["hidden"], a["q_lora_rank"], a["index_heads"], a["index_head_dim"]
    return ql * ih * idim + h * idim + 2 * idim + h * ih


def _compressor(h: int, ratio: int, dim: int) -> int:
    """CompressedSequenceCompressor: wkv and wgate h·c·dim, ape ratio·c·dim, norm dim; c = 2 when ratio 4."""
    c = 2 if ratio == 4 else 1
    return 2 * h * c * dim + ratio * c * dim + dim


def csa(a: dict, ratio: int) -> int:
    """CompressedSparseAttention for one layer: wq_a h·ql + q_norm ql + wq_b ql·H·D + wkv h·D + kv_norm D +
    wo_a (grouped, H·D·o_lora) + wo_b G·o_lora·h + sinks H, then the compressor (ratio > 1) and the indexer
    (ratio 4: wq_b ql·IH·ID + weights_proj h·IH + its own compressor of width ID)."""
    h, H, D, ql = a["hidden"], a["heads"], a["head_dim"], a["q_lora_rank"]
    G, ol = a["o_groups"], a["o_lora_rank"]
    n = h * ql + ql + ql * H * D + h * D + D + H * D * ol + G * ol * h + H
    if ratio > 1:
        n += _compressor(h, ratio, D)
    if ratio == 4:
        n += ql * a["index_heads"] * a["index_head_dim"] + h * a["index_heads"] + \
            _compressor(h, 4, a["index_head_dim"])
    return n


def hyper_connection(h: int, m: int) -> int:
    """HyperConnection (mHC): fn (2+m)·m × m·h, base (2+m)·m, scale 3."""
    mix = (2 + m) * m
    return mix * m * h + mix + 3


def hc_head(h: int, m: int) -> int:
    """MultiHeadHyperConnectionHead: hc_fn m × m·h, hc_base m, hc_scale 1."""
    return m * m * h + m + 1


def gdn(a: dict) -> int:
    """GatedDeltaNet: in_proj h·(2·Hk·dk + 2·Hv·dv + 2·Hv) with its fused input norm h, depthwise conv1d
    (2·Hk·dk + Hv·dv)·kernel, dt_bias and A_log Hv each, output norm dv, o_proj Hv·dv·h."""
    h, hk, hv, d = a["hidden"], a["gdn_k_heads"], a["gdn_v_heads"], a["gdn_head_dim"]
    qk, v = hk * d, hv * d
    return h * (2 * qk + 2 * v + 2 * hv) + h + (2 * qk + v) * (a.get("gdn_conv_kernel") or 4) + 2 * hv + d + v * h


def gqa(a: dict) -> int:
    """GQAttention: qkv h·(q_cols + 2·KV)·hd with its fused input norm h (q_cols = 2·H with the output gate),
    q_norm and k_norm hd each, proj H·hd·h."""
    h, H = a["hidden"], a["heads"]
    hd = a.get("head_dim") or h // H
    kv = a.get("kv_heads") or H
    q_cols = H * (2 if a.get("attn_output_gate") else 1)
    return h * (q_cols + 2 * kv) * hd + h + 2 * hd + H * hd * h


# --- layers ------------------------------------------------------------------------------------------

def _attention(a: dict, i: int) -> tuple[str, int]:
    fam = family(a)
    if fam == "mla":
        return "mla", mla(a)
    if fam == "mla_dsa":
        return "mla+dsa", mla(a) + dsa_indexer(a)
    if fam == "csa":
        ratios = a["compress_ratios"]
        r = ratios[min(i, len(ratios) - 1)]
        return f"csa{r}", csa(a, r)
    if fam == "gdn_hybrid":
        if (i + 1) % a["full_attention_interval"] == 0:
            return "gqa", gqa(a)
        return "gdn", gdn(a)
    return "gqa", gqa(a)


def _separate_input_norm(a: dict) -> bool:
    # Qwen3.5 fuses the input norm into the attention's first projection (counted there)
    return family(a) not in ("gdn_hybrid", "gqa")


def layer(a: dict, i: int) -> Layer:
    h = a["hidden"]
    kind, attn = _attention(a, i)
    norms = 2 * h if _separate_input_norm(a) else h
    if family(a) == "csa":
        norms += 2 * hyper_connection(h, a["hc_mult"])
    if i < (a.get("dense_layers") or 0):
        d = attn + norms + 3 * h * a["dense_ffn_hidden"]
        return Layer(f"{kind}+dense", d, 0, d)
    w, E, k = a["expert_ffn_hidden"], a["routed_experts"], a["experts_per_token"]
    shared_w = a.get("shared_expert_ffn_hidden") or w
    shared = (a.get("shared_experts") or 0) * 3 * h * shared_w
    if family(a) == "gdn_hybrid" and a.get("shared_experts"):
        shared += h  # the shared expert's sigmoid gate
    d = attn + norms + h * E + shared
    one = 3 * h * w
    return Layer(f"{kind}+moe", d, E * one, d + k * one)


def mtp_layer(a: dict) -> Layer:
    """An MTP depth: enorm + hnorm + a 2h·h input projection (DeepSeek-V4: e_proj and h_proj h·h each, its
    norm and mHC head) + a decoder layer with experts + its final norm."""
    h = a["hidden"]
    base = layer({**a, "dense_layers": 0}, a["layers"] if family(a) != "gdn_hybrid" else
                 a["full_attention_interval"] - 1)
    extra = 2 * h + 2 * h * h + h
    if family(a) == "csa":
        extra += hc_head(h, a["hc_mult"])
    return Layer(f"mtp:{base.kind}", base.dense + extra, base.routed, base.active + extra)


def vit(v: dict, out_hidden: int) -> int:
    """A Qwen3-VL-style vision tower (transformers' Qwen3_5MoeVisionModel): Conv3d patch embedding
    (c·t·p·p·d + d), learned position embedding P·d, `depth` blocks of two LayerNorms (4d), qkv (d·3d + 3d),
    proj (d·d + d), MLP (d·f + f + f·d + d), and the patch merger: LayerNorm 2d, fc1 (m²d)² + m²d,
    fc2 m²d·out + out."""
    d, f, m = v["hidden"], v["ffn"], v["merge"]
    patch = v["in_channels"] * v["temporal_patch"] * v["patch"] ** 2 * d + d
    block = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f + f * d + d)
    md = m * m * d
    merger = 2 * d + md * md + md + md * out_hidden + out_hidden
    return patch + v["positions"] * d + v["depth"] * block + merger


def count(arch: dict) -> tuple[Optional[Count], str]:
    """The model's counts from its facts; None with the reason when a fact is missing."""
    gone = missing(arch)
    if gone:
        return None, f"no checkpoint and no arch.{'/'.join(gone)} in the model group"
    a = arch
    h, V = a["hidden"], a["vocab"]
    layers = tuple(layer(a, i) for i in range(a["layers"]))
    mtp = tuple(mtp_layer(a) for _ in range(a.get("mtp_layers") or 0))
    output = V * h + h + (hc_head(h, a["hc_mult"]) if family(a) == "csa" else 0)
    vision, est = 0, list(a.get("estimates") or [])
    if a.get("vision"):
        vision = vit(a["vision"], h)
    elif a.get("vision_params"):
        vision = int(a["vision_params"])
    return Count(embedding=V * h, output=output, layers=layers, mtp=mtp, vision=vision,
                 source=f"facts: {a.get('source') or 'model group'}", estimates=tuple(est)), ""


def to_memory_params(c: Count, *, mtp: bool, vision: bool):
    """The memory estimate's units: the vision tower sits with the embedding on stage 0, MTP layers after the
    decoder on the last stage (only when the engine builds them)."""
    from vrun.estimate.memory import Params

    m = c.mtp if mtp else ()
    return Params(embedding=c.embedding + (c.vision if vision else 0), output=c.output,
                  dense_per_layer=tuple(x.dense for x in c.layers),
                  expert_per_layer=tuple(x.routed for x in c.layers),
                  mtp_dense=sum(x.dense for x in m), mtp_expert=sum(x.routed for x in m), mtp_layers=len(m),
                  source=c.source)

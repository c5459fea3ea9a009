"""The rollout phase of a colocated RL step, as pure arithmetic: vLLM's weights per replica, its KV cache per
token by attention type, how many of the step's sequences fit at once.

vLLM wakes with gpu_memory_utilization·GPU of its own while the actor keeps what it does not offload. A replica
is TP·DP GPUs (verl's tensor_model_parallel_size · data_parallel_size): attention and other dense weights split
over TP, routed experts over TP·DP (vLLM's fused MoE, as EP or ETP), each DP rank runs its own sequences.
  weights/GPU   rollout parameters (no MTP: vLLM loads it only for speculative decoding; the vision tower when
                the model has one) in the format vLLM loads them (`Formats`: the released checkpoint's, recorded in
                the model group as model.weights; a checkpoint's config.json quantization_config / expert_dtype
                wins; rollout.quantization=fp8 quantizes what is wider):
                dense / TP · bytes(dense format) + routed experts / (TP·DP) · bytes(expert format)
                Routed experts split over TP·DP with expert parallelism off or on: vLLM's
                FusedMoEParallelConfig.make (vllm/model_executor/layers/fused_moe/config.py) flattens TP across DP
                for MoE layers when enable_expert_parallel is off (each rank a 1/(TP·DP) slice of every expert's
                FFN width) and places whole experts on TP·DP ranks when it is on (verl sets it when
                rollout.expert_parallel_size > 1, and requires expert_parallel_size = TP·DP)
  budget        gpu_memory_utilization · GPU: what vLLM's worker may use for everything (vllm/v1/worker/
                gpu_worker.py determine_available_memory: KV cache = requested memory − weights − the profiled
                activation peak − non-torch memory)
  reserve       what vLLM 0.24.0 (the version verl 0.9.1's vllm extra pins) takes from its budget before the KV
                cache (vllm/v1/worker/gpu_worker.py determine_available_memory: KV = requested − weights − the
                profiled torch peak − non-torch memory − the CUDA graph estimate, the last on by default since
                v0.21, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS), each term approximated here (vLLM profiles it at
                start; no GPU here): `reserve()`
  KV cache      budget − weights − reserve, in whole blocks of `block_size` tokens per sequence
                (vllm/v1/core/kv_cache_utils.py: blocks = available // page size; a sequence takes whole blocks)
  per sequence  ceil((prompt + response) / block) · block · KV bytes per token per GPU + state per sequence
  fits          DP · floor(KV cache / per sequence) sequences per replica at once
  step share    train_batch_size · n / replicas (replicas = GPUs / (TP·DP))

KV bytes per token per GPU, by attention type (b = bytes of the KV dtype, L = layers of that kind):
  mla         L·(kv_lora_rank + qk_rope_head_dim)·b, not split by TP: one latent "head" per token
              (vLLM: MLAAttentionSpec(num_kv_heads=1, head_size=kv_lora_rank+qk_rope_head_dim) in
              vllm/model_executor/layers/attention/mla_attention.py)
  mla_dsa     mla + the indexer's keys L·(index_head_dim + index_head_dim/128·4) B (fp8 with a fp32 scale per
              128: vLLM's DeepseekV32IndexerCache in vllm/model_executor/models/deepseek_v2.py, which GLM-5's
              glm_moe_dsa reuses)
  gqa         L·2·max(1, kv_heads/TP)·head_dim·b (vLLM: FullAttentionSpec page = 2·block·kv_heads·head_size·dtype;
              KV heads are replicated when TP exceeds them)
  gdn_hybrid  gqa for the full-attention layers; per sequence, per gated-delta-net layer, conv state
              (kernel−1)·(2·Hk·dk + Hv·dv)/TP and recurrent state Hv/TP·dk·dv, in b bytes (shapes: vLLM's
              MambaStateShapeCalculator.gated_delta_net_state_shape; the state dtype is an ESTIMATE: the
              model's dtype, as mamba_ssm_cache_dtype=auto)
  csa         ESTIMATE from DeepSeek-V4's shapes (no vLLM formula read): a layer of compress ratio r > 1 keeps
              head_dim·b per r tokens (ratio 4 adds indexer keys index_head_dim + 4 B per 4 tokens); every layer
              keeps a sliding window of min(window, sequence)·head_dim·b per sequence
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vrun.core.units import GIB

# where verl's tree keeps the rollout and its replica's sizes: the one spelling of these keys (the mesh rules and
# mesh=auto's search here, the PPO record, the plan and the checks read them from here)
ROLLOUT = "actor_rollout_ref.rollout"
ROLLOUT_TP = f"{ROLLOUT}.tensor_model_parallel_size"
ROLLOUT_DP = f"{ROLLOUT}.data_parallel_size"
ROLLOUT_EP = f"{ROLLOUT}.expert_parallel_size"

BLOCK_TOKENS = 16       # vLLM's default KV block size on CUDA (CacheConfig.block_size)
MLA_BLOCK_TOKENS = 64   # FlashMLA's block size (vLLM forces 64 for MLA backends)
# bytes per parameter of each weight format vLLM loads, scales included: fp8 with one fp32 scale per 128×128
# block (DeepSeek-style block quantization), fp4 as MXFP4 (one e8m0 scale per 32), int4 with a bf16 scale per
# group of 32 (compressed-tensors W4A16)
FORMAT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0 + 4 / (128 * 128), "fp4": 0.5 + 1 / 32,
                "int4": 0.5 + 2 / 32}
DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4,
               "float": 4, "auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class KV:
    per_token: float            # bytes per token per GPU
    per_sequence: float         # bytes of state per sequence per GPU (GDN state, sliding windows)
    formula: str
    estimate: bool              # no source for the formula


# the facts each attention family's KV formula reads (beyond layers, heads and hidden, which every model has)
KV_FACTS = {"mla": ("kv_lora_rank", "qk_rope_head_dim"), "mla_dsa": ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim"),
            "csa": ("head_dim", "compress_ratios", "index_head_dim"),
            "gdn_hybrid": ("full_attention_interval", "gdn_k_heads", "gdn_v_heads", "gdn_head_dim"), "gqa": ()}


def kv_missing(arch: dict) -> list[str]:
    """The model facts the KV formula needs and the model file leaves unset (no rollout estimate then)."""
    return [f for f in KV_FACTS.get(arch.get("attention") or "gqa", ()) if arch.get(f) in (None, [], 0)]


def kv_bytes(arch: dict, rollout_tp: int, kv_dtype_bytes: int, seq_len: int) -> KV:
    a, b, t = arch, kv_dtype_bytes, rollout_tp
    fam = a.get("attention") or "gqa"
    L = a["layers"]
    if fam in ("mla", "mla_dsa"):
        per = L * (a["kv_lora_rank"] + a["qk_rope_head_dim"]) * b
        if fam == "mla":
            return KV(per, 0.0, "MLA latent (vLLM MLAAttentionSpec)", False)
        idx = a["index_head_dim"]
        per += L * (idx + idx // 128 * 4)
        return KV(per, 0.0, "MLA latent + DSA indexer keys (vLLM DeepSeek-V3.2 path)", False)
    if fam == "csa":
        D, W = a["head_dim"], a.get("sliding_window") or 0
        ratios = list(a["compress_ratios"])[:L]
        per = sum(D * b / r + ((a["index_head_dim"] + 4) / 4 if r == 4 else 0) for r in ratios if r > 1)
        return KV(per, L * min(W, seq_len) * D * b, "compressed KV + indexer + sliding window (estimate)", True)
    hd = a.get("head_dim") or a["hidden"] // a["heads"]
    kv_heads = max(1, (a.get("kv_heads") or a["heads"]) // t)
    if fam == "gdn_hybrid":
        full = L // a["full_attention_interval"]
        lin = L - full
        hk, hv, d = a["gdn_k_heads"], a["gdn_v_heads"], a["gdn_head_dim"]
        conv = ((a.get("gdn_conv_kernel") or 4) - 1) * (2 * hk * d + hv * d) / t
        state = lin * (conv + hv / t * d * d) * b
        return KV(full * 2 * kv_heads * hd * b, state, "GQA KV + gated-delta-net state per sequence (state "
                  "dtype estimated)", True)
    return KV(L * 2 * kv_heads * hd * b, 0.0, "GQA KV (vLLM FullAttentionSpec)", False)


@dataclass(frozen=True)
class Formats:
    """The weight formats vLLM loads the rollout model in: dense parts and routed experts."""
    dense: str = "bf16"
    experts: str = "bf16"
    source: str = "model group"

    def bytes(self) -> tuple[float, float]:
        return FORMAT_BYTES.get(self.dense, 2.0), FORMAT_BYTES.get(self.experts, 2.0)

    def label(self) -> str:
        return self.dense if self.dense == self.experts else f"{self.dense} dense + {self.experts} experts"

    def with_rollout_quantization(self, quantization: Optional[str]) -> "Formats":
        """verl's rollout.quantization (fp8 on the fly) quantizes whatever is wider than it."""
        if not quantization:
            return self
        q = "fp8" if "8" in str(quantization) else str(quantization).lower()
        narrow = lambda f: f if FORMAT_BYTES.get(f, 2.0) <= FORMAT_BYTES.get(q, 1.0) else q  # noqa: E731
        return Formats(narrow(self.dense), narrow(self.experts), f"{self.source}, rollout.quantization={quantization}")


def _format_of(name) -> Optional[str]:
    s = str(name or "").lower()
    if "fp4" in s or "nvfp4" in s:
        return "fp4"
    if "int4" in s or "w4a16" in s:
        return "int4"
    if "fp8" in s or "e4m3" in s:
        return "fp8"
    return None


def formats_from_config(cfg: dict) -> Optional[Formats]:
    """The formats a checkpoint's config.json declares (quantization_config, DeepSeek-V4's expert_dtype), or None
    when it declares none (bf16 weights then)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    q = cfg.get("quantization_config") or text.get("quantization_config")
    expert = _format_of(cfg.get("expert_dtype") or text.get("expert_dtype"))
    if not isinstance(q, dict):
        return Formats("bf16", expert, "checkpoint config.json expert_dtype") if expert else None
    method = str(q.get("quant_method") or "").lower()
    bits = set()
    groups = q.get("config_groups")
    for g in (groups.values() if isinstance(groups, dict) else ()):
        w = g.get("weights") if isinstance(g, dict) else None
        if isinstance(w, dict) and isinstance(w.get("num_bits"), int) and not isinstance(w["num_bits"], bool):
            bits.add(w["num_bits"])
    if method == "mxfp4":
        dense, experts = "bf16", "fp4"
    elif method == "compressed-tensors" and bits == {4}:
        dense, experts = "bf16", "int4"     # W4A16 on the routed experts (the ignore list keeps the rest)
    else:
        dense = _format_of(method) or _format_of(q.get("quant_algo")) or ("fp8" if 8 in bits else None)
        if dense is None:
            return None
        experts = dense
    return Formats(dense, expert or experts, "checkpoint config.json quantization_config")


# a checkpoint's config.json and index are read up to this many bytes (a 1T-parameter index is ~10 MB)
CONFIG_JSON_LIMIT = 64 << 20


def checkpoint_formats(path: Optional[str]) -> Optional[Formats]:
    """Formats from the config.json of a checkpoint directory; None without one, or when it cannot be read (the
    plan's checkpoint read, vrun.estimate.checkpoint, says why and refuses a config.json its tensors contradict)."""
    import json
    import os

    from vrun.core import fs

    if not path:
        return None
    text, _ = fs.read_checked(os.path.join(os.path.expanduser(path), "config.json"), CONFIG_JSON_LIMIT)
    try:
        cfg = json.loads(text or "", parse_constant=lambda c: None)  # NaN/Infinity: no format
    except (ValueError, RecursionError):
        return None
    if not isinstance(cfg, dict):
        return None
    return formats_from_config(cfg)


# verl's rollout defaults (verl/trainer/config/rollout/rollout.yaml): the batch vLLM profiles and the requests at once
MAX_NUM_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 256
NON_TORCH = 1 * GIB      # NCCL's buffers and cuBLAS workspaces vLLM's profile sees grow beside torch: assumed
RESERVE_BAND = (0.5, 2.0)   # every reserve term is approximated: a factor of two either way


def reserve(arch: dict, *, tp: int, dp: int, ep: int, max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
            max_num_seqs: int = MAX_NUM_SEQS, enforce_eager: bool = False) -> dict:
    """What vLLM 0.24.0 takes from gpu_memory_utilization·GPU besides the weights and the KV cache, per GPU, bytes by
    term (each approximated: vLLM measures them when it starts):
      activations  `profile_run` runs `_dummy_run(max_num_batched_tokens)` in inference mode: per token the residual
                   and its norm (4h) and the larger of the attention's projections and the fused MoE's workspaces
                   (per routed copy the dispatched token 2h, fc1's output 4f and the activation's 2f, f the expert
                   FFN width on the rank: whole experts with expert parallelism, f/(TP·DP) without)
      sampler      `_dummy_sampler_run` samples min(max_num_seqs, max_num_batched_tokens) requests with top-k and
                   top-p set (v1/sample/ops/topk_topp_sampler.py sorts the vocabulary): per request and vocabulary
                   entry the gathered bf16 logits 2, fp32 logits 4, the sorted copy 4 and its int64 indices 8, the
                   top-p probabilities 4 and masks 2
      cuda_graphs  `profile_cudagraph_memory`: the graphs share a pool as large as the biggest captured batch,
                   min(2·max_num_seqs, 512) tokens (config/vllm.py _set_cudagraph_sizes), of the activations'
                   per-token bytes; none with enforce_eager
      non_torch    NCCL and cuBLAS buffers: NON_TORCH, assumed"""
    h, k = arch.get("hidden") or 0, arch.get("experts_per_token") or 0
    f = (arch.get("expert_ffn_hidden") or 0) / (1 if ep > 1 else tp * dp)
    heads, hd = arch.get("heads") or 0, arch.get("head_dim") or (h // max(arch.get("heads") or 1, 1))
    attn = 2 * 3 * heads * hd / tp
    per_token = 4 * h + max(attn, k * (2 * h + 4 * f + 2 * f) if k else 6 * (arch.get("dense_ffn_hidden") or 0) / tp)
    n = max_num_batched_tokens
    reqs = min(max_num_seqs, n)
    capture = min(2 * max_num_seqs, 512, n)
    return {"activations": per_token * n, "sampler": reqs * (arch.get("vocab") or 0) * (2 + 4 + 4 + 8 + 4 + 2),
            "cuda_graphs": 0.0 if enforce_eager else per_token * capture, "non_torch": float(NON_TORCH)}


@dataclass(frozen=True)
class RolloutEstimate:
    tp: int
    dp: int
    replicas: int
    budget: float               # gpu_memory_utilization · GPU
    weights: float              # per GPU
    reserve: float
    kv_cache: float             # per GPU, what is left for the KV cache
    kv: KV
    seq_len: int
    per_sequence: float         # bytes per full prompt+response per GPU
    fits: int                   # sequences per replica at once
    step_share: int             # the step's sequences per replica
    weight_bytes: float         # per parameter (the dense parts')
    utilization: float = 0.0    # gpu_memory_utilization
    formats: Formats = Formats()
    ep: int = 1                 # rollout expert_parallel_size (1: off)
    reserve_terms: tuple = ()   # (term, bytes) of `reserve`
    fits_band: tuple = (0, 0)   # sequences at once with the reserve at its band's high and low end

    @property
    def holds_one(self) -> bool:
        return self.fits >= 1

    @property
    def holds_share(self) -> bool:
        return self.fits >= self.step_share

    def summary(self) -> dict:
        g = lambda x: round(x / GIB, 2)  # noqa: E731
        return {"tp": self.tp, "dp": self.dp, "replicas": self.replicas, "budget_gib": g(self.budget),
                "weights_gib": g(self.weights), "reserve_gib": g(self.reserve),
                "reserve_terms_gib": {t: g(b) for t, b in self.reserve_terms},
                "reserve_known": {"known": "approximated", "band": list(RESERVE_BAND),
                                  "source": "vLLM 0.24.0 vllm/v1/worker/gpu_worker.py determine_available_memory"},
                "kv_cache_gib": g(self.kv_cache),
                "kv_bytes_per_token": round(self.kv.per_token, 1),
                "state_bytes_per_sequence": round(self.kv.per_sequence), "kv_formula": self.kv.formula,
                "kv_formula_is_estimate": self.kv.estimate, "sequence_tokens": self.seq_len,
                "sequences_fit": self.fits, "sequences_fit_band": list(self.fits_band),
                "step_sequences_per_replica": self.step_share,
                "weight_bytes_per_param": self.weight_bytes, "weight_formats": self.formats.label(),
                "weight_formats_source": self.formats.source, "expert_parallel_size": self.ep}


def estimate(arch: dict, rollout_params: tuple, *, world: int, rollout_tp: int, gpu_mem_gib: float,
             utilization: float, seq_len: int, step_sequences: int, dtype: str = "bfloat16",
             quantization: Optional[str] = None, kv_cache_dtype: Optional[str] = None,
             rollout_dp: int = 1, formats: Optional[Formats] = None, rollout_ep: int = 1,
             max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS, max_num_seqs: int = MAX_NUM_SEQS,
             enforce_eager: bool = False) -> RolloutEstimate:
    """rollout_params: (dense, routed experts) parameters vLLM loads."""
    if formats is None:
        d = "fp32" if DTYPE_BYTES.get(str(dtype).lower(), 2) == 4 else "bf16"
        formats = Formats(d, d, "rollout.dtype")
    formats = formats.with_rollout_quantization(quantization)
    db, eb = formats.bytes()
    kb = DTYPE_BYTES.get(str(kv_cache_dtype or dtype).lower(), 2)
    budget = utilization * gpu_mem_gib * GIB
    dense, routed = rollout_params
    weights = dense / rollout_tp * db + routed / (rollout_tp * rollout_dp) * eb
    kv = kv_bytes(arch, rollout_tp, kb, seq_len)
    ep = rollout_tp * rollout_dp if rollout_ep > 1 else 1
    terms = reserve(arch, tp=rollout_tp, dp=rollout_dp, ep=ep, max_num_batched_tokens=max_num_batched_tokens,
                    max_num_seqs=max_num_seqs, enforce_eager=enforce_eager)
    held = sum(terms.values())
    block = MLA_BLOCK_TOKENS if (arch.get("attention") or "") in ("mla", "mla_dsa") else BLOCK_TOKENS
    per_seq = -(-seq_len // block) * block * kv.per_token + kv.per_sequence

    def at_once(r: float) -> int:
        left_r = max(budget - weights - r, 0.0)
        return rollout_dp * int(left_r // per_seq) if per_seq > 0 else 0
    replicas = max(world // (rollout_tp * rollout_dp), 1)
    return RolloutEstimate(tp=rollout_tp, dp=rollout_dp, replicas=replicas, budget=budget, weights=weights,
                           reserve=held, kv_cache=max(budget - weights - held, 0.0), kv=kv, seq_len=seq_len,
                           per_sequence=per_seq, fits=at_once(held), step_share=-(-step_sequences // replicas),
                           weight_bytes=db, utilization=utilization, formats=formats, ep=ep,
                           reserve_terms=tuple(terms.items()),
                           fits_band=(at_once(held * RESERVE_BAND[1]), at_once(held * RESERVE_BAND[0])))


def choices(world: int, gpus_per_node: int, arch: dict, expert_parallel: bool = False) -> list[tuple[int, int]]:
    """(TP, DP) replicas within the model's and vLLM's rules: TP within a node, dividing DeepSeek-V4's o_groups
    and the attention heads; the routed experts' FFN width divides over TP·DP when expert parallelism is off
    (vLLM flattens TP across DP for MoE layers), the routed experts over TP·DP when it is on; the replica
    (TP·DP GPUs) tiles the GPUs, within a node or whole nodes."""
    out = []
    ffn, experts = arch.get("expert_ffn_hidden"), arch.get("routed_experts")
    for t in range(1, gpus_per_node + 1):
        if gpus_per_node % t or world % t:
            continue
        if arch.get("o_groups") and arch["o_groups"] % t:
            continue
        if arch.get("heads") and arch["heads"] % t:
            continue
        for d in range(1, world // t + 1):
            r = t * d
            if world % r or (r > gpus_per_node and r % gpus_per_node) or (r < gpus_per_node and gpus_per_node % r):
                continue
            if expert_parallel and experts and experts % r:
                continue
            if not expert_parallel and ffn and experts and ffn % r:
                continue
            out.append((t, d))
    return out


def choose(arch: dict, rollout_params: tuple, *, world: int, gpus_per_node: int,
           configured: Optional[tuple] = None, allowed: Optional[list] = None, **kw) -> list[RolloutEstimate]:
    """Every valid rollout replica, best first (RANKING)."""
    opts = [estimate(arch, rollout_params, world=world, rollout_tp=t, rollout_dp=d, **kw)
            for t, d in (allowed if allowed is not None else choices(world, gpus_per_node, arch,
                                                                     kw.get("rollout_ep", 1) > 1))]
    return sorted(opts, key=lambda r: rank_key(r, configured))


# the rollout replica's ranking, in order: holds a single sequence, holds the replica's share of the step, the
# fewest GPUs per replica (more replicas; when none holds a sequence, the most), the larger KV margin (sequences
# that fit at once, then KV bytes), the configured (TP, DP), the smaller TP
RANKING = ("holds one sequence", "holds the step's share", "fewest GPUs per replica", "larger KV margin",
           "the configured TP·DP", "smaller TP")


def rank_key(r: RolloutEstimate, configured: Optional[tuple] = None) -> tuple:
    size = r.tp * r.dp
    return (not r.holds_one, not r.holds_share, size if r.holds_one else -size,
            (-r.fits, -r.kv_cache) if r.holds_one else (r.weights, 0), (r.tp, r.dp) != configured, r.tp)


def smallest_fit(arch: dict, rollout_params: tuple, *, world: int, gpus_per_node: int, **kw) -> Optional[RolloutEstimate]:
    """The smallest replica (fewest GPUs, then the larger KV margin) that holds the weights and the replica's share
    of the step's sequences; else the smallest that holds one sequence; None when none does."""
    opts = choose(arch, rollout_params, world=world, gpus_per_node=gpus_per_node, **kw)
    return opts[0] if opts and opts[0].holds_one else None


def overrides(r: RolloutEstimate) -> str:
    """The rollout replica as overrides a user can paste."""
    out = f"verl.{ROLLOUT_TP}={r.tp} verl.{ROLLOUT_DP}={r.dp}"
    if r.ep > 1:
        out += f" verl.{ROLLOUT_EP}={r.tp * r.dp}"
    return out

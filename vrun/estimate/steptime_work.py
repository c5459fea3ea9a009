"""What a step is made of, as numbers: the Workload the plan knows (vrun/planning/steptime_plan.py builds it), a
Phase's (pessimistic, optimistic, middle) seconds and the sums of its parts, the compute roofline's terms (the MFU of
the model's kind, the routed experts' share under expert parallelism) and the model facts the estimate counts
(attention FLOPs per attended key, the tensors a refit hands over). Pure arithmetic."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from vrun.estimate.hardware import Part
from vrun.estimate.rollout import MAX_NUM_SEQS
from vrun.estimate.steptime_factors import ENGINE_SLEEP_LEVEL, MEAN_FRACTION, Factor


@dataclass(frozen=True)
class Workload:
    """What the plan knows, as numbers (vrun/planning/steptime_plan.py builds it from a plan)."""
    world: int
    gpus_per_node: int
    active_params: float            # N: active per token (training and decode FLOPs)
    samples: int                    # sequences trained per step (train_batch_size · n; SFT: train_batch_size)
    prompt_mean: float
    response_mean: float            # SFT: 0 (prompt_mean carries the whole sequence)
    response_max: float
    pp: int = 1
    vpp: int = 1
    micro_batches: int = 1          # per mini-batch per DP rank (the bubble's m)
    mini_batches: int = 1           # optimizer steps per step (each reduces gradients and gathers parameters)
    grad_reduce_bytes: float = 4.0  # bytes per gradient reduced (Megatron Lite: fp32, grad_reduce_in_fp32=True)
    recompute: bool = False
    reference: bool = False         # a KL term: the reference policy's log-prob pass
    rollout: bool = True            # RL (False: SFT)
    rollout_tp: int = 1
    rollout_dp: int = 1
    rollout_dense: float = 0.0      # parameters vLLM loads: dense, routed experts
    rollout_routed: float = 0.0
    experts: int = 0                # E routed experts per layer, k per token
    top_k: int = 0
    rollout_weight_bytes: float = 2.0
    attn_flops_per_key: float = 0.0 # forward FLOPs per token per attended key, all layers (attention_flops_per_key)
    attn_keys_cap: Optional[int] = None  # sparse attention: keys a query attends at most (index_topk)
    kv_per_token: float = 0.0       # bytes per token per GPU (vrun/estimate/rollout.py)
    kv_per_sequence: float = 0.0
    kv_fits: Optional[int] = None   # sequences per replica the KV cache holds at once, each at the longest length
    max_num_seqs: int = MAX_NUM_SEQS
    layers: int = 0                 # decoder layers and hidden size: the TP all-reduces (0: none counted)
    hidden: int = 0
    moe_layers: int = 0             # layers with routed experts: training's EP all-to-alls
    tp: int = 1                     # the training mesh (PP above): TP, CP, EP, ETP
    cp: int = 1
    ep: int = 1
    etp: int = 1
    param_bytes: float = 0.0        # per GPU, the busiest stage (vrun/estimate/memory.py's estimate): weights, grads, optim
    grad_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    param_offload: bool = False
    optimizer_offload: bool = False
    tensors: int = 0                # tensors a refit hands over (tensor_count)
    engine_sleep_level: int = ENGINE_SLEEP_LEVEL
    refit_host: str = "state"       # what the refit itself moves to and from the host (REFIT_HOST): NeMo RL's,
                                    # whose refits REFIT_RATE and the host factor were measured on; a plan: verl's
    reference_swap: bool = False    # the reference pass swaps its weights in through pinned host memory (NeMo RL's
                                    # Megatron worker, steptime_refit.reference_swap_s); verl's reference is its own
                                    # module (False)
    mean_source: str = f"mean prompt and response = {MEAN_FRACTION:g} × their maxima (assumed)"

    @property
    def tokens(self) -> float:
        return self.samples * (self.prompt_mean + self.response_mean)

    @property
    def moe(self) -> bool:
        return self.experts > 1

    def attention_flops(self) -> float:
        """Forward attention FLOPs of the step's tokens: causal, each token attends half its sequence on average."""
        keys = (self.prompt_mean + self.response_mean) / 2
        if self.attn_keys_cap:
            keys = min(keys, self.attn_keys_cap)
        return self.tokens * keys * self.attn_flops_per_key

    @property
    def nodes(self) -> int:
        return max(1, -(-self.world // self.gpus_per_node))


@dataclass(frozen=True)
class Phase:
    low: float
    high: float
    note: str = ""
    mid: Optional[float] = None     # the middle efficiencies (geometric); None: the geometric mean of the bound
    parts: tuple = ()               # (name, Phase) the phase sums, when it is made of separate costs

    @property
    def middle(self) -> float:
        return self.mid if self.mid is not None else math.sqrt(self.low * self.high)

    def scaled(self, k: float) -> "Phase":
        return Phase(self.low * k, self.high * k, self.note, self.middle * k,
                     tuple((n, p.scaled(k)) for n, p in self.parts))

    def summary(self) -> dict:
        return {"low_s": round(self.low, 2), "high_s": round(self.high, 2), "middle_s": round(self.middle, 2),
                **({"note": self.note} if self.note else {}),
                **({"parts": {n: p.summary() for n, p in self.parts}} if self.parts else {})}


def summed(parts: dict, note: str = "") -> Phase:
    """A phase made of separate costs, each a (pessimistic, optimistic, middle) Phase: their sums, the parts kept."""
    kept = tuple((n, p) for n, p in parts.items() if p.high > 0)
    return Phase(sum(p.low for _, p in kept), sum(p.high for _, p in kept), note,
                 sum(p.middle for _, p in kept), kept)


def plus(a: Phase, b: Phase) -> Phase:
    """Two costs one after the other."""
    return Phase(a.low + b.low, a.high + b.high, "", a.middle + b.middle)


def on_mesh(w: Workload, mesh, micro_batches: int, est=None) -> Workload:
    """The workload on another training mesh of the same GPUs (vrun.estimate.mesh.Mesh): its parallel sizes,
    micro-batches per DP rank and, from the memory estimate (vrun.estimate.memory.Estimate, or None), the per-GPU
    bytes offload moves."""
    from dataclasses import replace

    return replace(w, world=mesh.world, pp=mesh.pp, vpp=mesh.vpp, tp=mesh.tp, cp=mesh.cp, ep=mesh.ep, etp=mesh.etp,
                   micro_batches=micro_batches,
                   param_bytes=est.weights if est is not None else 0.0,
                   grad_bytes=est.grads if est is not None else 0.0,
                   optimizer_bytes=est.optimizer if est is not None else 0.0)


def mfu_factor(w: Workload, f: dict) -> Factor:
    """The MFU band of the model's kind: a mixture of experts' (train_mfu_moe) or a dense model's (train_mfu)."""
    return f["train_mfu_moe"] if w.moe else f["train_mfu"]


def routed_share(w: Workload) -> float:
    """The routed experts' share of the active parameters (their top-k of E), counted at the MoE balance's efficiency
    (FACTORS moe_balance) where expert parallelism splits them over ranks (EP > 1); 0 otherwise."""
    if not w.moe or w.ep <= 1 or w.active_params <= 0:
        return 0.0
    return min(1.0, w.rollout_routed * w.top_k / w.experts / w.active_params)


def compute_s(flops: float, w: Workload, part: Part, mfu: float) -> float:
    return flops / (w.world * part.bf16_flops * mfu)


def attention_flops_per_key(arch: dict) -> tuple[float, Optional[int]]:
    """Forward FLOPs per token per attended key over the layers with softmax attention: QK^T and AV, 2·H·(d_qk + d_v)
    per layer (Narayanan et al. 2021's attention term); the sparse families attend at most index_topk keys."""
    a, fam = arch, arch.get("attention") or "gqa"
    H = a.get("heads") or 0
    if fam in ("mla", "mla_dsa"):
        d = (a.get("qk_nope_head_dim") or 0) + (a.get("qk_rope_head_dim") or 0) + (a.get("v_head_dim") or 0)
    else:
        hd = a.get("head_dim") or (a["hidden"] // H if H else 0)
        d = 2 * hd
    layers = a.get("layers") or 0
    if fam == "gdn_hybrid" and a.get("full_attention_interval"):
        layers //= a["full_attention_interval"]
    cap = a.get("index_topk") if fam in ("mla_dsa", "csa") else None
    return 2.0 * H * d * layers, cap


# tensors per decoder layer a refit hands over, beside the MLP's: the attention's projections and norms (GQA: q, k, v,
# o and the two layer norms; MLA: q_a, q_a norm, q_b (or q), kv_a, kv_a norm, kv_b, o and the two layer norms)
_ATTENTION_TENSORS = {"mla": 9, "mla_dsa": 9}


def tensor_count(arch: dict) -> int:
    """The tensors of the model as a refit hands them over in the Hugging Face layout (one per weight and norm):
    per decoder layer the attention's (_ATTENTION_TENSORS, 6 for GQA and the other families), a dense MLP's 3 or,
    with routed experts, 3 per expert, the router's weight and bias and a shared expert's 3; the embedding, the
    final norm and the output head."""
    layers = int(arch.get("layers") or 0)
    experts = int(arch.get("routed_experts") or 0)
    dense_layers = int(arch.get("dense_layers") or 0) if experts > 1 else layers
    attention = _ATTENTION_TENSORS.get(arch.get("attention") or "gqa", 6)
    moe = 3 * experts + 2 + (3 if arch.get("shared_experts") else 0)
    return layers * attention + dense_layers * 3 + (layers - dense_layers) * moe + 3

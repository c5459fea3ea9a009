"""Step time and cost of a run, as pure arithmetic: an ESTIMATE with a low and a high bound per phase.

A colocated RL step (verl's ray_trainer: gen, old_log_prob, ref, update_actor, update_weights) and an SFT step,
from what the plan knows. N = active parameters (vrun/estimate/params.py: the top-k experts), T = the step's tokens,
P = peak dense bf16 FLOP/s of the part, B = its HBM bandwidth (vrun/estimate/hardware.py), G = GPUs.
  rollout     per replica (TP·DP GPUs), S = the step's sequences per replica. One decode step reads, per GPU, the
              dense weights / TP, the routed experts / (TP·DP) that its C sequences touch (1 − (1 − k/E)^C of them)
              and their KV: time = max(bytes / (B·MBU), 2·N·C/DP/TP / (P·MFU)) (the roofline: memory bound until the
              batch is large). The middle MBU is the one measured at the replica's TP (DECODE_MBU_AT_TP: a whole
              decode step on one node, its all-reduces included); past the widest TP measured (TP8) the band runs
              from the source's trend carried on (decode_mbu_worst) to TP8's figure held flat (decode_mbu_best),
              the middle between them. A replica wider than its NVLink domain adds the
              step's two all-reduces per decoder layer (Shoeybi et al. 2019) of its bf16 activations over the TP
              group: NCCL's own latency model (Ring or Tree, LL; vrun/estimate/hardware.py NCCL_LATENCY_US, from
              NCCL's tuning.cc) + 2(n−1)/n·bytes over the node's network (at the optimistic end, TP8's figure held
              flat, less the share of TP8's own all-reduces that figure already holds: decode_step_s measured_flat).
              Prefill: 2·N·prompt tokens / (G·P·MFU).
              spread_rollout_s: the response lengths spread as the maximum-entropy distribution on
              [0, max_response_length] with the known mean (Lengths); C = min(S, DP·max_num_seqs, the KV cache's fit
              at the longest sequence) decoding at full batch while any wait, then draining as they finish; the step
              waits for the longest of the step's sequences (its expected maximum). Low: the optimistic efficiencies
              and C at what vLLM's paged KV cache holds at the sequences' mean occupancy (Kwon et al. 2023,
              arXiv:2309.06180); middle: the middle efficiencies. High: the pessimistic efficiencies and the
              longest tail — C in ceil(S/C) waves, the last one's whole batch decoding max_response_length steps
              (rollout_s; plan.json's rollout_at_max_response_length, beside rollout_at_mean: every response at
              the mean).
  log-prob    2·N·T / (G·P·MFU) per pass: the old policy always, the reference when a KL term is on
  training    6·N·T (8·N·T under full recompute: the forward again) / (G·P·MFU) — the 6·N·T rule of Kaplan
              et al. 2020 (arXiv:2001.08361) and Narayanan et al. 2021 (arXiv:2104.04473, with recompute) — plus
              the training mesh's TP all-reduce and EP all-to-all bytes (training_collectives_s; log-prob too).
              MFU: a dense model's (train_mfu) or a mixture of experts' (train_mfu_moe), each measured apart.
              Under expert parallelism (EP > 1) the routed experts' share of the FLOPs (routed_share) at the MoE
              balance (moe_balance: the layer waits for its busiest EP rank; pessimistic 18.6% of its time lost)
  bubble      log-prob and training × (1 + (PP − 1) / (m·VPP)), m micro-batches per mini-batch per DP rank
              (Narayanan et al. 2021, the 1F1B schedule's bubble fraction)
  sync        the weight refit (refit_parts): the whole bf16 model through every rank at a measured refit rate
              (REFIT_RATE: verl's and NeMo RL's refit gather each tensor in full on every rank, and the rollout
              engine loads it whole, keeping its shard), never less than an ideal reshard of the rollout rank's own
              shard; + a measured cost per tensor handed over (REFIT_TENSOR_S × the model's tensor count, tensor_count;
              at the optimistic end beside the transfer, as in the refit REFIT_RATE's optimistic figure was measured
              on); + the rollout engine's wake-up (ENGINE_WAKE_S) and, when it slept at vLLM's level 1 (weights kept in
              host memory), its weights copied back over PCIe; + what the colocated refit itself moves between the GPU
              and the host to make room for the engine (refit_host_parts, REFIT_HOST): verl brings the offloaded
              training weights to the GPU for the export and sends them back after it; NeMo RL sends the optimizer
              states and the training weights to the host. For a dense model that is most of the refit (NeMo RL v0.3's
              Llama-3.1-8B: 2.8 s of its host copies beside 1.2 s of gather and wake-up)
  offload     over PCIe per GPU (host_copies, offload_parts), what the refit does not move: under verl the
              weights and optimizer states to the host after the update and back before it; under NeMo RL their
              way back. The parameters (param_offload) in and out of pinned host memory, the optimizer states
              (optimizer_offload) through pageable host memory (the pinned rate × PAGEABLE). Gradients are not
              copied: Megatron's grad buffer is freed and zeroed again (megatron-core
              ParamAndGradBuffer.offload_to_cpu, Megatron Lite's offload_model_to_cpu)
  sft         training and bubble only; T = train_batch_size · max_length · the mean fraction
Collectives stay at NVLink speed inside the part's NVLink domain (nvlink_span: a node's GPUs, or a whole NVL72 rack),
at the node's network speed across domains; a job fills one domain after another, so a group whose block of ranks
meets a domain's edge (an EP16 block on a 72-GPU rack) straddles two (in_domain).
  optimizer   per optimizer step, the distributed optimizer's gradient reduce-scatter and parameter all-gather over
              data parallel (gradient_sync_s), added to training
  host        the refit, offload and the engine's sleep copy are host-bound: their pessimistic ends on a slower
              cluster than their rates' sources (FACTORS host: the same recipes' refit measured 1.33–1.5× slower on
              a second cluster while the GPU-bound phases held)
Not modelled (said in the assumptions): reward computation, sequence imbalance between DP ranks, communication not
named above (CP and PP traffic, the rollout's EP all-to-all in place of its MoE all-reduce), kernel-launch and
scheduling overheads, a CPU optimizer's own step, start-up and checkpoint saves.

The efficiencies are one fixed set (FACTORS, and the refit's REFIT_RATE, REFIT_TENSOR_S, ENGINE_WAKE_S), each a
(pessimistic, optimistic) pair with its source, never fitted to the published step times the tests hold the
estimate to (tests/test_steptime.py). A calibration from recorded runs (vrun/planning/calibration.py) scales the
result; the plan says so.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from vrun.estimate import hardware
from vrun.estimate.hardware import Part


@dataclass(frozen=True)
class Factor:
    low: float          # the pessimistic efficiency (the high time)
    high: float         # the optimistic one (the low time)
    source: str


# one fixed set, sourced independently of the published step times
FACTORS = {
    "train_mfu": Factor(0.36, 0.47, "a dense model's training MFU on H100. low: 36% = Megatron-Bridge's Llama-3 70B "
                        "pre-training on 64 DGX-H100 at 719 model TFLOP/s per GPU in FP8 over the part's 1,979 FP8 "
                        "peak, a lower bound of its bf16 MFU (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-"
                        "archive.md @ 4ab94dfad36641cabdeb96452b21bf676aac4772, 25.11 container, DGX-H100 table); "
                        "high: up to 47% MFU on H100 (Megatron-LM README, GPT weak scaling)"),
    "train_mfu_moe": Factor(0.061, 0.16, "a mixture of experts' training MFU on H100. low: 6.1% = Megatron-Bridge's "
                            "Qwen3-30B-A3B pre-training on 16 DGX-H100 at 121 model TFLOP/s per GPU in FP8 over the "
                            "1,979 FP8 peak, a lower bound of its bf16 MFU (same file and commit, 26.02 container); "
                            "high: 16% = its GPT-OSS-120B on 64 DGX-H100 in bf16, 158 TFLOP/s over 989 (26.04 "
                            "container). Inside: Megatron Lite's bench, a Qwen3.5-35B-A3B proxy on 8×H100, 80.4 "
                            "TFLOP/s = 8% (Megatron-LM dev d48bd6be experimental/lite/examples/bench/README.md)"),
    # the band spans the source's figures over TP8 (0.25) to TP2 (0.60); the middle is the figure at the rollout's
    # TP (DECODE_MBU_AT_TP, decode_mbu)
    "decode_mbu": Factor(0.25, 0.60, "model-bandwidth utilisation of a decode step measured with TensorRT-LLM at "
                         "batch 1–16: 60% at TP2 (H100, A100), 40% at TP4, 25% at TP8 (Databricks, 'LLM Inference "
                         "Performance Engineering: Best Practices', 2023-10, figures 2–3)"),
    "network": Factor(0.50, 0.90, "ASSUMED (no measurement read): the share of the NICs' line rate a bulk weight "
                      "transfer reaches"),
    "pcie": Factor(0.32, 0.80, "the share of the PCIe x16 rate a pinned host-device copy reaches. low: vLLM's "
                   "level-1 wake-up copying Phi-3-vision's 8.3 GB of weights back from pinned host memory took 0.82 s "
                   "on A100 (vLLM 0.11.0), 10 GB/s of PCIe Gen4 x16's 32, its fixed wake-up costs included (vLLM blog "
                   "'Zero-Reload Model Switching with vLLM Sleep Mode', 2025-10-26, vllm-project/vllm-project."
                   "github.io _posts/2025-10-26-sleep-mode.md @ 02ad9891c6f343f6d6f605140f21d51a512324e5); high: "
                   "ASSUMED (no measurement read)"),
    # the share of an MoE layer's time its ranks spend working rather than waiting for the busiest one (expert
    # parallel only: EP > 1)
    "moe_balance": Factor(0.814, 1.0, "an MoE layer under expert parallelism waits for its busiest rank. low: GLM-5's "
                          "MoE layers (128 routed experts, EP8, no auxiliary load-balancing loss, as an RL run's router "
                          "trains) lose 18.6% of their GPU time per layer on average to the token and GEMM stragglers "
                          "on H100 (Liu, Zhao, Qi, 'FEPLB: Exploiting Copy Engines for Nearly Free MoE Load Balancing "
                          "in Distributed Training', arXiv:2604.19654, 2026-04-21, figure 1(b)); high: balanced"),
    # the host side of a refit and of offload on another cluster: a share of the best-measured rates
    "host": Factor(1 / 1.5, 1.0, "the refit's host-bound time, cluster to cluster. low: NeMo RL v0.3's own "
                   "recipes rerun on a second cluster took 1.5x (Llama-3.1-8B, 4 s -> 6 s) and 1.33x (Llama-3.1-70B, "
                   "15 s -> 20 s) the release post's refit on its DTensor rows, while generation, log-probs and "
                   "training stayed within 12% (NVIDIA-NeMo/RL issue 959, 2025-08-21); high: the rates as their "
                   "sources measured them"),
    # a multiplier of the pinned rate, not a share of a line rate
    "pageable": Factor(1 / 6, 1 / 4, "a copy to or from pageable host memory against a pinned one: DeepSpeed's "
                       "switch of its ZeRO-offload copies to pinned memory made them 6× faster on one GPU and "
                       "4–5× on an 8-GPU node (microsoft/DeepSpeed pull 5301, commit 7b5b066, 2024-03)"),
}


# The decode MBU the same source measured at each tensor-parallel size on one node (its figures 2–3: 60% at TP2,
# 40% at TP4, 25% at TP8): a whole decode step's time, so its all-reduces within the node are in the figure.
DECODE_MBU_AT_TP = {2: 0.60, 4: 0.40, 8: 0.25}


def decode_mbu_worst(tp: int, band: Factor) -> float:
    """The pessimistic decode MBU of a replica of TP `tp`: the band's low end up to the widest TP the source measured
    (TP8); past it the source's own trend carried on (its last step, TP4 -> TP8, the same ratio per doubling: 0.25 ·
    (0.25 / 0.40)^log2(tp / 8): 0.156 at TP16, 0.098 at TP32). The trend is what a narrower per-GPU share of each
    GEMM and the all-reduces together cost; past TP8 the all-reduces are counted apart as well (decode_step_s), so
    this end counts them twice."""
    pts = sorted(DECODE_MBU_AT_TP.items())
    (t0, m0), (t1, m1) = pts[-2], pts[-1]
    if tp <= t1:
        return band.low
    return min(band.low, m1 * (m1 / m0) ** ((math.log2(tp) - math.log2(t1)) / (math.log2(t1) - math.log2(t0))))


def decode_mbu_best(tp: int, band: Factor) -> float:
    """The optimistic decode MBU of a replica of TP `tp`: the band's high end up to the widest TP the source
    measured (TP8); past it that TP's figure (the trend held flat, the optimistic reading of it)."""
    t1, m1 = max(DECODE_MBU_AT_TP.items())
    return band.high if tp <= t1 else min(band.high, max(m1, decode_mbu_worst(tp, band)))


def decode_mbu(tp: int, band: Factor) -> float:
    """The middle decode MBU of a rollout replica of TP `tp`: the source's figure at that TP, log-linear between its
    points; TP1 (not measured) at TP2's figure; past TP8 (not measured) the geometric mean of TP8's figure and the
    source's trend carried on (decode_mbu_worst), with the whole TP group's all-reduces counted on top
    (decode_step_s: their within-node share is then counted twice, a pessimistic bias). Kept inside the band from
    decode_mbu_worst to the band's high end."""
    pts = sorted(DECODE_MBU_AT_TP.items())
    worst = decode_mbu_worst(tp, band)
    if tp <= pts[0][0]:
        v = pts[0][1]
    elif tp >= pts[-1][0]:
        v = math.sqrt(pts[-1][1] * worst)
    else:
        (t0, m0), (t1, m1) = next((a, b) for a, b in zip(pts, pts[1:]) if a[0] <= tp <= b[0])
        v = m0 * (m1 / m0) ** ((math.log2(tp) - math.log2(t0)) / (math.log2(t1) - math.log2(t0)))
    return min(max(v, worst), band.high)


@dataclass(frozen=True)
class Rate:
    low: float          # the pessimistic figure (the high time): bytes/s for a rate, seconds for a cost
    high: float         # the optimistic one
    source: str


# The refit path of both frameworks this project drives hands every rank each weight in FULL: verl's Megatron
# per_tensor_generator (verl/utils/megatron_utils.py: PP broadcast, EP and TP all-gathers, every rank yields the
# whole tensor) and NeMo RL's Megatron-Bridge export (stream_weights_megatron_to_hf, NVIDIA-NeMo/Megatron-Bridge
# 8aa287df: the same gathers, every rank yielding the full tensor), then the rollout engine loads the full tensor
# and keeps its shard. So a refit moves the whole bf16
# model through every rank, tensor by tensor; its rate is measured, not a link's line rate.
REFIT_RATE = Rate(36e9, 96e9, "bf16 bytes of the whole model per second through a refit, measured by NeMo RL on "
                  "DGX H100 with the same full-tensor export feeding an NCCL broadcast (NVIDIA-NeMo/RL pull 1379, "
                  "2025-10: Qwen3-235B-A22B 470 GB in 13 s = 36 GB/s before overlapping export and broadcast, "
                  "DeepSeek-V3 1.34 TB in 14 s = 96 GB/s after); taken as is for every part (ASSUMED beyond H100)")
# What a refit costs per tensor beyond its bytes: NeMo RL's breakdown of its colocated refit of DeepSeek-V3 (over
# 90,000 tensors, training EP64·PP8 to generation TP64 on 512 H100s; NeMo RL v0.3): 12.2 s gathering against a
# speed-of-light 3.3 s, 47.2 s in all against 3.31 s.
REFIT_TENSOR_S = Rate((47.2 - 3.31) / 90_000, (12.2 - 3.3) / 90_000,
                      "seconds per tensor a refit hands over beyond its bytes: optimistic, the gather's excess over "
                      "its speed of light, (12.2 − 3.3) s / 90,000 tensors = 0.10 ms; pessimistic, the whole refit's, "
                      "(47.2 − 3.31) s / 90,000 = 0.49 ms (NeMo RL blog 'Journey of Optimizing Weight Transfer in "
                      "Large MoE Models by 10x', 2025-08-12, Table 1: DeepSeek-V3, EP64·PP8 → TP64, v0.3)")
# A rollout engine's wake-up beside its weights: vLLM's sleep-mode benchmarks (vLLM 0.11.0, A100 and A4000, level 1):
# 0.1 s for the smallest models on A4000, 0.26 s for Qwen3-0.6B (1.2 GB of weights) on A100.
ENGINE_WAKE_S = Rate(0.26, 0.10, "seconds a vLLM engine takes to wake from sleep beside its weights: 0.1 s (small "
                     "models, A4000) to 0.26 s (Qwen3-0.6B, A100), vLLM 0.11.0, level 1 (vLLM blog 'Zero-Reload "
                     "Model Switching with vLLM Sleep Mode', 2025-10-26, vllm-project/vllm-project.github.io "
                     "_posts/2025-10-26-sleep-mode.md @ 02ad9891c6f343f6d6f605140f21d51a512324e5)")
# the mean prompt and response as a share of their maxima when nothing better is known (a calibration replaces it)
MEAN_FRACTION = 0.5
# a calibrated bound: the recorded runs' ratios, widened by this much each way (step-to-step variation)
CALIBRATED_SPREAD = (0.9, 1.1)
# vLLM's concurrent sequences per engine (verl's rollout.max_num_seqs default): one home, the rollout's
from vrun.estimate.rollout import MAX_NUM_SEQS  # noqa: E402
# vLLM's sleep level between rollouts: verl puts an engine holding full weights to level 2 (weights discarded, the
# refit brings them; verl/workers/rollout/vllm_rollout/vllm_async_server.py _resolve_sleep_level), level 1 (weights
# kept in host memory) for LoRA adapters and MTP
ENGINE_SLEEP_LEVEL = 2

# What a colocated refit moves between the GPU and the host beside the weights it hands the rollout engine: the
# training engine's state leaves the GPU inside the refit, to make room for the engine's weights and KV cache.
#   "weights": verl (verl/workers/engine_workers.py update_weights @ 1dda039b: the engine's
#              get_per_tensor_param loads the offloaded training weights to the GPU before the export — Megatron
#              Lite's verl_mlite/engine/mlite_engine.py get_per_tensor_param @ d48bd6be, verl's Megatron engine
#              load_megatron_model_to_gpu — and update_weights sends them back to the host after it, before the
#              KV cache wakes); the optimizer states move in update_actor, outside the refit (the offload phase)
#   "state":   NeMo RL (nemo_rl/algorithms/grpo.py refit_policy_generation @ v0.3.0 b1c86a81 and alike at v0.4.0,
#              inside its prepare_for_generation timer: offload_before_refit sends the optimizer states to the host
#              with Tensor.to("cpu"), pageable memory, and frees the gradient buffers; offload_after_refit sends the
#              weights to pinned host memory, megatron-core ParamAndGradBuffer.offload_to_cpu); their way back is in
#              logprob_inference_prep and training_prep, no published phase (the offload phase)
REFIT_HOST = ("weights", "state")
# the refit's costs on the rollout engine's side (refit_parts), which no training mesh changes
REFIT_ENGINE_PARTS = ("transfer", "tensors", "wake", "restore")


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


@dataclass(frozen=True)
class StepTime:
    phases: dict                    # name -> Phase, in step order
    rollout_at_mean: Optional[Phase] = None
    rollout_at_max: Optional[Phase] = None
    assumptions: tuple = ()
    factors: dict = field(default_factory=dict)
    scale: float = 1.0              # a calibration's measured/predicted ratio (1: none)
    calibration: str = ""           # "calibrated from 3 runs" or ""
    ratios: tuple = ()              # the calibration's measured/predicted ratios (the bound then spans them)

    @property
    def low(self) -> float:
        if self.ratios:
            return self.model_middle * min(self.ratios) * CALIBRATED_SPREAD[0]
        return sum(p.low for p in self.phases.values()) * self.scale

    @property
    def high(self) -> float:
        if self.ratios:
            return self.model_middle * max(self.ratios) * CALIBRATED_SPREAD[1]
        return sum(p.high for p in self.phases.values()) * self.scale

    @property
    def model_middle(self) -> float:
        """The uncalibrated middle: what a calibration's ratios are taken against."""
        return sum(p.middle for p in self.phases.values())

    @property
    def central(self) -> float:
        """Every phase at the middle efficiencies, the rollout's responses spread over their lengths (the step
        waiting for its longest). The figure held to published step times."""
        return sum(p.middle for p in self.phases.values()) * self.scale

    def phase(self, name: str) -> Phase:
        return self.phases.get(name, Phase(0.0, 0.0)).scaled(self.scale)

    def part(self, phase: str, name: str) -> Phase:
        """One cost inside a phase (offload's to_host, sync's transfer …), scaled like the phase; zero if absent."""
        return dict(self.phase(phase).parts).get(name, Phase(0.0, 0.0))

    def summary(self) -> dict:
        return {
            "estimate": True,
            "step_low_s": round(self.low, 1), "step_high_s": round(self.high, 1),
            "step_middle_s": round(self.central, 1),
            "phases": {k: self.phase(k).summary() for k in self.phases},
            "rollout_at_mean": self.rollout_at_mean.summary() if self.rollout_at_mean else None,
            "rollout_at_max_response_length": self.rollout_at_max.summary() if self.rollout_at_max else None,
            "factors": {k: asdict(v) for k, v in self.factors.items()},
            "model_middle_s": round(self.model_middle, 2),
            "calibration": {"scale": round(self.scale, 3), "from": self.calibration,
                            "ratios": [round(r, 3) for r in self.ratios]} if self.calibration else None,
            "assumptions": list(self.assumptions),
        }


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


def calibrated(st: StepTime, ratios: list, how: str) -> StepTime:
    """The estimate scaled by the median measured/predicted ratio of recorded runs, its bound spanning them."""
    rs = sorted(ratios)
    mid = rs[len(rs) // 2] if len(rs) % 2 else (rs[len(rs) // 2 - 1] + rs[len(rs) // 2]) / 2
    return StepTime(st.phases, st.rollout_at_mean, st.rollout_at_max, st.assumptions, st.factors, mid, how,
                    tuple(rs))


def _bubble(w: Workload) -> float:
    return (w.pp - 1) / (max(w.micro_batches, 1) * max(w.vpp, 1)) if w.pp > 1 else 0.0


def mfu_factor(w: Workload, f: dict) -> Factor:
    """The MFU band of the model's kind: a mixture of experts' (train_mfu_moe) or a dense model's (train_mfu)."""
    return f["train_mfu_moe"] if w.moe else f["train_mfu"]


def nvlink_span(gpus_per_node: int, part: Part) -> int:
    """How many consecutive GPUs talk over NVLink: the part's NVLink domain where it spans more GPUs than one of its
    nodes (GB200/GB300 NVL72: 72 GPUs, 4 per compute tray), else the mesh's node. A job fills one domain after
    another; which of a training mesh's groups then straddle two domains: in_domain."""
    return part.nvlink_domain if part.nvlink_domain > part.gpus_per_node else gpus_per_node


def routed_share(w: Workload) -> float:
    """The routed experts' share of the active parameters (their top-k of E), counted at the MoE balance's efficiency
    (FACTORS moe_balance) where expert parallelism splits them over ranks (EP > 1); 0 otherwise."""
    if not w.moe or w.ep <= 1 or w.active_params <= 0:
        return 0.0
    return min(1.0, w.rollout_routed * w.top_k / w.experts / w.active_params)


def compute_s(flops: float, w: Workload, part: Part, mfu: float) -> float:
    return flops / (w.world * part.bf16_flops * mfu)


def allreduce_s(ranks: int, gpus_per_node: int, nbytes: float, part: Part, net: float) -> float:
    """One all-reduce of nbytes over `ranks` GPUs (filling NVLink domains of gpus_per_node GPUs): NCCL's latency
    model (the least of Ring and Tree, LL protocol; vrun.estimate.hardware.NCCL_LATENCY_US) plus the bytes a ring
    moves per GPU, 2(n−1)/n·S, over NVLink within a domain or the node's network across domains, at efficiency
    `net`."""
    if ranks <= 1:
        return 0.0
    lat = hardware.NCCL_LATENCY_US
    nodes = max(1, -(-ranks // gpus_per_node))
    ppn = ranks // nodes
    steps = 2 * (ranks - 1)
    if nodes == 1:
        ring = lat["base_ring_ll"] + steps * lat["nvlink_ring_ll"]
        tree = lat["base_tree_ll"] + 2 * (ppn - 1) * lat["nvlink_tree_ll"]
        bw = part.nvlink
    else:
        inter = 2 * nodes
        ring = lat["base_ring_ll"] + (steps - inter) * max(lat["nvlink_ring_ll"], lat["net_overhead"]) + \
            inter * lat["net_ring_ll"]
        tree = lat["base_tree_ll"] + 2 * ((ppn - 1) * lat["nvlink_tree_ll"] + (nodes.bit_length() - 1) * lat["net_tree_ll"])
        bw = part.network
    return min(ring, tree) * 1e-6 + 2 * (ranks - 1) / ranks * nbytes / (bw * net)


def tp_collectives_s(w: Workload, part: Part, per_rank: float, net: float, ranks: Optional[int] = None) -> float:
    """A decode step's tensor-parallel all-reduces: two per decoder layer (after the attention output projection and
    after the MLP/MoE down projection: Shoeybi et al. 2019, arXiv:1909.08053 §3), each of the step's bf16
    activations (per_rank tokens × hidden × 2 bytes) over the replica's TP group (ranks: over that many GPUs)."""
    n = w.rollout_tp if ranks is None else ranks
    if n <= 1 or not w.layers or not w.hidden:
        return 0.0
    return 2 * w.layers * allreduce_s(n, nvlink_span(w.gpus_per_node, part), per_rank * w.hidden * 2.0, part, net)


def decode_step_s(w: Workload, part: Part, concurrent: float, context: float, mbu: float, mfu: float,
                  net: Optional[float] = None, measured_flat: bool = False) -> float:
    """One decode step of a replica with `concurrent` sequences at `context` tokens each: the roofline, then, for a
    replica wider than its NVLink domain, its TP all-reduces (net: the network efficiency; None leaves them out).
    Within a domain they are in the measured MBU (DECODE_MBU_AT_TP).
    measured_flat: `mbu` is the widest measured TP's figure held flat (decode_mbu_best, the optimistic end). That
    figure's step at TP m held TP m's all-reduces; held flat at TP `tp` its time shrinks to m/tp of it, the
    all-reduces' share with it, so m/tp of TP m's all-reduces are counted already and only the rest of the whole
    group's come on top (the middle and the pessimistic end count the whole group's on top: a pessimistic bias)."""
    tp, dp = w.rollout_tp, w.rollout_dp
    per_rank = concurrent / dp
    touched = 1.0 if not w.experts else 1 - (1 - w.top_k / w.experts) ** concurrent
    weights = (w.rollout_dense / tp + w.rollout_routed / (tp * dp) * touched) * w.rollout_weight_bytes
    kv = per_rank * (context * w.kv_per_token + w.kv_per_sequence)
    memory = (weights + kv) / (part.hbm * mbu)
    flops = 2 * w.active_params * per_rank / tp / (part.bf16_flops * mfu)
    span = nvlink_span(w.gpus_per_node, part)
    if net is None or tp <= span:
        return max(memory, flops)
    collectives = tp_collectives_s(w, part, per_rank, net)
    if measured_flat:
        m = min(span, max(DECODE_MBU_AT_TP))
        collectives -= tp_collectives_s(w, part, per_rank, net, ranks=m) * m / tp
    return max(memory, flops) + collectives


def _replicas(w: Workload) -> tuple[int, int]:
    """(replicas, the step's sequences per replica)."""
    replicas = max(w.world // (w.rollout_tp * w.rollout_dp), 1)
    return replicas, -(-w.samples // replicas)


def prefill_s(w: Workload, part: Part, mfu: float) -> float:
    return compute_s(2 * w.active_params * w.samples * w.prompt_mean, w, part, mfu)


def rollout_s(w: Workload, part: Part, response: float, mbu: float, mfu: float, longest: bool,
              net: Optional[float] = None, measured_flat: bool = False) -> float:
    """Every response at `response` tokens (longest=False), or (longest=True) the last wave's whole batch decoding
    `response` steps. Concurrency: at the mean, as many sequences as the paged KV cache holds at their mean occupancy
    (concurrency); at the longest, the KV cache's fit at the longest sequence (kv_fits); in waves."""
    _, share = _replicas(w)
    c = max(1, int(concurrency(w, w.prompt_mean + w.response_mean / 2 if not longest else None)))
    waves = -(-share // c)
    mean_step = decode_step_s(w, part, c, w.prompt_mean + w.response_mean / 2, mbu, mfu, net, measured_flat)
    if not longest:
        decode = waves * response * mean_step
    else:
        decode = (waves - 1) * w.response_mean * mean_step + \
            response * decode_step_s(w, part, c, w.prompt_mean + response / 2, mbu, mfu, net, measured_flat)
    return decode + prefill_s(w, part, mfu)


def concurrency(w: Workload, occupancy: Optional[float]) -> float:
    """Sequences a replica decodes at once: its share of the step, at most DP·max_num_seqs and what its KV cache
    holds — at the longest sequence (occupancy None: kv_fits), or, vLLM's paged cache allocating blocks as
    sequences grow (Kwon et al. 2023), at `occupancy` tokens each (kv_fits scaled by the longest sequence over it)."""
    _, share = _replicas(w)
    fit = float(share)
    if w.kv_fits is not None and w.kv_fits > 0:
        fit = w.kv_fits * ((w.prompt_mean + w.response_max) / max(occupancy, 1.0) if occupancy else 1.0)
    return max(1.0, min(float(share), float(w.rollout_dp * w.max_num_seqs), fit))


@functools.lru_cache(maxsize=256)
def _lengths(mean: float, cap: float, n: int) -> tuple:
    """(rate, mean age, expected maximum of n) of Lengths(mean, cap): computed once per distinct workload (mesh=auto
    asks for the same rollout many times)."""
    L = Lengths(mean, cap)
    a = L.rate
    return a, L.mean_age(a=a), L.expected_max(n, a=a)


@dataclass(frozen=True)
class Lengths:
    """Response lengths on [0, cap] with a known mean, spread as the maximum-entropy distribution with that mean and
    support (density ∝ e^(λx); uniform at mean = cap/2, falling toward the cap below it, rising above it): the least
    committal spread the two known figures allow (Jaynes 1957)."""
    mean: float
    cap: float

    @property
    def rate(self) -> float:
        """λ·cap, solved from the mean by bisection (0: uniform)."""
        m = min(max(self.mean / self.cap, 1e-4), 1 - 1e-4) if self.cap > 0 else 0.5
        lo, hi = -1e4, 1e4
        for _ in range(64):
            mid = (lo + hi) / 2
            if _mean_of(mid) < m:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    def cdf(self, x: float, a: Optional[float] = None) -> float:
        if self.cap <= 0:
            return 1.0  # no response tokens at all (max_response_length 0 or unset)
        a = self.rate if a is None else a
        u = min(max(x / self.cap, 0.0), 1.0)
        if abs(a) < 1e-9:
            return u
        if a > 0:
            return math.exp(a * (u - 1)) * (-math.expm1(-a * u)) / -math.expm1(-a)
        return math.expm1(a * u) / math.expm1(a)

    def expected_max(self, n: int, points: int = 400, a: Optional[float] = None) -> float:
        """E[the longest of n] = ∫ 1 − F(x)^n dx over [0, cap] (midpoint rule)."""
        if self.cap <= 0:
            return 0.0
        a, h = self.rate if a is None else a, self.cap / points
        return sum(1 - self.cdf((i + 0.5) * h, a) ** n for i in range(points)) * h

    def mean_age(self, points: int = 400, a: Optional[float] = None) -> float:
        """The mean decoded length of a sequence in flight when slots refill as sequences end (a renewal process's
        mean age, E[L²] / (2·E[L]))."""
        if self.cap <= 0 or self.mean <= 0:
            return 0.0
        a, h = self.rate if a is None else a, self.cap / points
        second = sum(2 * ((i + 0.5) * h) * (1 - self.cdf((i + 0.5) * h, a)) for i in range(points)) * h
        return second / (2 * self.mean) if self.mean > 0 else 0.0


def _mean_of(a: float) -> float:
    """The mean of density ∝ e^(a·u) on [0, 1]."""
    if abs(a) < 1e-6:
        return 0.5 + a / 12
    if a > 0:
        return 1 / -math.expm1(-a) - 1 / a
    return math.exp(a) / math.expm1(a) - 1 / a


def spread_rollout_s(w: Workload, part: Part, mbu: float, mfu: float, net: Optional[float] = None,
                     paged: bool = False, segments: int = 48, measured_flat: bool = False) -> float:
    """The middle rollout: response lengths spread as Lengths(mean, max). A replica decodes as many sequences at
    once as its KV cache holds at the longest sequence (concurrency, kv_fits); while sequences wait, the slots decode
    at full batch (the queue's tokens over the slots), each at the prompt and the mean age of a sequence in flight;
    then the last slots drain, alive(t) = C·(1 − F(t)), until the step's longest response ends (its expected
    maximum over all the step's sequences: the step waits for the slowest replica). vLLM admits more than that fit
    and preempts when its paged cache fills (Kwon et al. 2023): paged=True counts the admitted at their mean
    occupancy (the prompt and the mean age), the optimistic end's concurrency, not the middle's."""
    _, share = _replicas(w)
    lengths = Lengths(w.response_mean, w.response_max)
    a, age, longest = _lengths(float(w.response_mean), float(w.response_max), int(w.samples))
    occupancy = w.prompt_mean + age
    c = concurrency(w, occupancy if paged else None)
    queued = max(0.0, (share - c) * w.response_mean / c)
    full = queued * decode_step_s(w, part, c, occupancy, mbu, mfu, net, measured_flat) if queued else 0.0
    h, drain = longest / segments, 0.0
    for i in range(segments):
        t = (i + 0.5) * h
        alive = max(1.0, c * (1 - lengths.cdf(t, a)))
        drain += h * decode_step_s(w, part, alive, w.prompt_mean + t, mbu, mfu, net, measured_flat)
    return full + drain + prefill_s(w, part, mfu)


def middle(f) -> float:
    """The geometric mean of a (pessimistic, optimistic) pair: a Factor or a Rate."""
    return math.sqrt(f.low * f.high)


def refit_bytes(w: Workload) -> float:
    """The bf16 bytes of the whole model: what every rank materialises in a refit (REFIT_RATE)."""
    return (w.rollout_dense + w.rollout_routed) * 2.0


def rollout_shard_bytes(w: Workload) -> float:
    """The rollout engine's weights per GPU, in the format it loads."""
    return (w.rollout_dense / w.rollout_tp + w.rollout_routed / (w.rollout_tp * w.rollout_dp)) * w.rollout_weight_bytes


def sync_s(w: Workload, part: Part, net: float, rate: float) -> float:
    """The refit's transfer: the longer of (1) the whole bf16 model through every rank at the refit path's measured
    rate (REFIT_RATE: the training side gathers each tensor in full on every rank and the rollout engine loads the
    full tensor, keeping its shard) and (2) the floor of an ideal reshard, the rollout rank's own bf16 shard from
    other NVLink domains over the node's network (a share 1 − 1/domains of it) and within the domain over NVLink,
    at efficiency `net`."""
    per_gpu = (w.rollout_dense / w.rollout_tp + w.rollout_routed / (w.rollout_tp * w.rollout_dp)) * 2.0
    span = nvlink_span(w.gpus_per_node, part)
    gpn = min(w.gpus_per_node, w.world)
    domains = max(1, -(-w.world // span))
    floor = max(per_gpu * gpn * (1 - 1 / domains) / (part.network * net), per_gpu / (part.nvlink * net))
    return max(refit_bytes(w) / rate, floor)


def refit_parts(w: Workload, part: Part, f: dict) -> dict:
    """The refit's costs, each a Phase (pessimistic, optimistic, middle): the transfer (sync_s), the cost per tensor
    handed over (REFIT_TENSOR_S × w.tensors), the engine's wake-up (ENGINE_WAKE_S) and, for an engine that slept at
    level 1, its weights copied back from pinned host memory over PCIe. The optimistic end runs the per-tensor
    export beside the transfer, only its excess over the transfer on top: REFIT_RATE's optimistic figure is the
    refit measured after NeMo RL overlapped the export with the broadcast (its pessimistic figure before, the two
    one after the other: summed at the pessimistic end and the middle). Summed at the optimistic end too, DeepSeek-V3's
    refit would take 14 s + 4.5 s, above the 14 s the source measured for it."""
    net, pcie, r, per, wake = f["network"], f["pcie"], REFIT_RATE, REFIT_TENSOR_S, ENGINE_WAKE_S
    best = sync_s(w, part, net.high, r.high)
    out = {"transfer": Phase(best, sync_s(w, part, net.low, r.low), "", sync_s(w, part, middle(net), middle(r))),
           "tensors": Phase(max(0.0, w.tensors * per.high - best), w.tensors * per.low, "", w.tensors * middle(per)),
           "wake": Phase(wake.high, wake.low, "", middle(wake))}
    if w.engine_sleep_level == 1:
        b = rollout_shard_bytes(w) / part.pcie
        out["restore"] = Phase(b / pcie.high, b / pcie.low, "", b / middle(pcie))
    return {n: on_host(p, f) for n, p in out.items()}


def on_host(p: Phase, f: dict) -> Phase:
    """A host-bound cost (the refit, PCIe copies) at the host factor's ends: its optimistic end as the rates' sources
    measured, its pessimistic end on a slower cluster (FACTORS host)."""
    h = f["host"]
    return Phase(p.low / h.high, p.high / h.low, p.note, p.middle / middle(h), p.parts)


def host_copies(w: Workload, part: Part, f: dict) -> tuple[Phase, Phase]:
    """(the training weights, the optimizer states) one way over PCIe per GPU, each a Phase at the host factor's
    ends: the weights (param_offload) at the pinned rate, the optimizer states (optimizer_offload) at the pageable
    rate (pinned × PAGEABLE); zero where not offloaded. Gradients are freed, not copied."""
    pcie, pageable = f["pcie"], f["pageable"]
    params = w.param_bytes if w.param_offload else 0.0
    optim = w.optimizer_bytes if w.optimizer_offload else 0.0

    def way(nbytes: float, page: Factor) -> Phase:
        return on_host(Phase(nbytes / (part.pcie * pcie.high * page.high), nbytes / (part.pcie * pcie.low * page.low),
                             "", nbytes / (part.pcie * middle(pcie) * middle(page))), f)

    flat = Factor(1.0, 1.0, "")
    return way(params, flat), way(optim, pageable)


def plus(a: Phase, b: Phase) -> Phase:
    """Two costs one after the other."""
    return Phase(a.low + b.low, a.high + b.high, "", a.middle + b.middle)


def refit_host_parts(w: Workload, part: Part, f: dict) -> dict:
    """What the colocated refit itself moves between the GPU and the host beside the weights it hands the engine
    (REFIT_HOST, w.refit_host): verl's ("weights") brings the offloaded training weights to the GPU for the export
    and sends them back after it; NeMo RL's ("state") sends the optimizer states and then the training weights to
    the host. Each a Phase; those of zero bytes left out by summed()."""
    weights, optim = host_copies(w, part, f)
    if w.refit_host == "state":
        return {"optimizer_to_host": optim, "weights_to_host": weights}
    return {"weights_to_gpu": weights, "weights_to_host": weights}


def offload_parts(w: Workload, part: Part, f: dict) -> dict:
    """The offload outside the refit, per GPU over PCIe (host_copies): under verl's refit ("weights") the weights and
    optimizer states to the host after the update and back before it; under NeMo RL's ("state"), whose refit sends
    both to the host (refit_host_parts), their way back alone."""
    weights, optim = host_copies(w, part, f)
    way = plus(weights, optim)
    if way.high <= 0:
        return {}
    return {"to_gpu": way} if w.refit_host == "state" else {"to_host": way, "to_gpu": way}


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


@functools.lru_cache(maxsize=1024)
def in_domain(world: int, span: int, members: int, stride: int) -> int:
    """The fewest ranks of one group that share an NVLink domain with any of its members: groups of `members` ranks
    `stride` apart, in blocks of members·stride consecutive ranks (megatron-core's rank order, TP innermost, PP
    outermost), the job's ranks filling one domain of `span` GPUs after another. Where the domain is a multiple
    of the block, every group lies inside one domain (or splits evenly over whole domains); where it is not — an
    NVL72 rack's 72 GPUs and EP16 or EP32 blocks — the block that meets the rack's edge straddles two domains, and
    a collective waits for its ranks with the fewest peers on NVLink."""
    block = members * stride
    if members <= 1 or world <= span or span % block == 0:
        return members
    if block % span == 0:  # each block over whole domains, stride dividing them evenly
        return max(1, members * span // block) if span % stride == 0 else _fewest(world, span, members, stride)
    return _fewest(world, span, members, stride)


def _fewest(world: int, span: int, members: int, stride: int) -> int:
    """in_domain counted group by group."""
    block = members * stride
    fewest = members
    for start in range(0, max(world, block), block):
        for t in range(stride):
            ranks = [start + t + stride * i for i in range(members)]
            counts: dict = {}
            for r in ranks:
                counts[r // span] = counts.get(r // span, 0) + 1
            fewest = min(fewest, min(counts.values()))
    return fewest


def training_collectives_s(w: Workload, part: Part, passes: float, net: float, mesh=None) -> float:
    """Per GPU, the training mesh's collectives over `passes` forward-equivalent passes of the step's tokens (a
    training step: forward + backward = 2, 3 with full recompute; a log-prob pass: 1), bandwidth only (at these
    message sizes, MBs per call, the latency is small): per pass and decoder layer of the stage two TP all-reduces
    of its tokens' bf16 activations, 2(TP−1)/TP of them per GPU over NVLink (Shoeybi et al. 2019, arXiv:1909.08053
    §3: two in the forward, their conjugates in the backward); per pass and MoE layer of the stage an EP dispatch
    and combine all-to-all of its tokens' top-k bf16 activations, the share on other EP ranks, over NVLink within the
    NVLink domain (nvlink_span; the ranks of the worst-placed group, in_domain) and the node's network (its per-GPU
    share) beyond it (Lepikhin et al. 2020, GShard, arXiv:2006.16668: two all-to-alls per MoE layer forward, two
    backward). Tokens per GPU: the step's / (DP·CP), over TP again for the dispatch (sequence parallelism). Not counted
    here: the DP gradient reduction (gradient_sync_s), CP's KV exchange, ETP's reductions, PP's sends. mesh: the
    training mesh's sizes (tp, cp, ep, etp, pp; default: the workload's)."""
    m = mesh if mesh is not None else w
    tp, cp, ep, pp, etp = m.tp, m.cp, m.ep, m.pp, m.etp
    if (tp <= 1 and ep <= 1) or not w.hidden:
        return 0.0
    span = nvlink_span(w.gpus_per_node, part)
    dp = max(w.world // (pp * tp * cp), 1)
    tokens = w.tokens / (dp * cp)
    out = 0.0
    if tp > 1 and w.layers:
        bw = part.nvlink if tp <= span else part.network / w.gpus_per_node
        out += 2 * w.layers / pp * 2 * (tp - 1) / tp * tokens * w.hidden * 2.0 / (bw * net)
    if ep > 1 and w.moe_layers and w.top_k:
        moved = tokens / tp * w.top_k * w.hidden * 2.0 * (1 - 1 / ep)
        per_domain = in_domain(w.world, span, ep, max(etp, 1))
        remote = 1 - per_domain / ep
        t = max(moved * (1 - remote) / part.nvlink, moved * remote / (part.network / w.gpus_per_node))
        out += 2 * w.moe_layers / pp * t / net
    return out * passes


def gradient_sync_s(w: Workload, part: Part, net: float, mesh=None) -> float:
    """Per GPU, the distributed optimizer's data-parallel traffic, once per optimizer step (w.mini_batches per
    step): the gradients' reduce-scatter (grad_reduce_bytes each) and the updated bf16 parameters' all-gather, each
    (n−1)/n of the rank's parameters for a group of n (a ring), the dense ones over DP·CP, the routed experts over
    the expert DP (megatron-core's DistributedOptimizer; Rajbhandari et al. 2020, ZeRO, arXiv:1910.02054). Over
    NVLink when the group's ranks (strided by TP, or by EP·ETP) sit in one NVLink domain, else over the node's
    network, its per-GPU share. An FSDP2 run gathers per micro-batch: this counts its least."""
    m = mesh if mesh is not None else w
    tp, cp, ep, pp, etp = m.tp, m.cp, m.ep, m.pp, m.etp
    span = nvlink_span(w.gpus_per_node, part)

    def ring(params: float, group: int, stride: int) -> float:
        if group <= 1 or params <= 0:
            return 0.0
        bw = part.nvlink if in_domain(w.world, span, group, stride) == group else part.network / w.gpus_per_node
        return (group - 1) / group * params * (w.grad_reduce_bytes + 2.0) / (bw * net)

    dp = max(w.world // (pp * tp * cp), 1)
    edp = max(w.world // (pp * ep * etp), 1)
    if w.moe:
        dense, routed = w.rollout_dense / (tp * pp), w.rollout_routed / (ep * etp * pp)
    else:  # one "expert" taken by every token is the dense MLP: TP-split, reduced over data parallel
        dense, routed = (w.rollout_dense + w.rollout_routed) / (tp * pp), 0.0
    return w.mini_batches * (ring(dense, dp * cp, tp) + ring(routed, edp, ep * etp))


def estimate(w: Workload, part: Part, factors: Optional[dict] = None, same_rollout: Optional[StepTime] = None,
             collectives: bool = True) -> StepTime:
    """The step time of w on part. same_rollout: an estimate of the same workload on another training mesh of the
    same GPUs (on_mesh): its rollout and sync phases, which do not depend on the training mesh, are taken as they
    are (mesh=auto times many meshes). collectives=False leaves the training mesh's collectives out (for
    with_collectives to add per mesh)."""
    f = factors or FACTORS
    mfu, mbu, net = mfu_factor(w, f), f["decode_mbu"], f["network"]
    phases: dict = {}
    at_mean = at_max = None
    bubble = 1 + _bubble(w)
    attn = w.attention_flops()

    routed, bal = routed_share(w), f["moe_balance"]

    def compute(n_flops: float, attn_flops: float, note: str, passes: float) -> Phase:
        """Compute and the training mesh's collectives, × the pipeline bubble; the routed experts' share of the
        N-term FLOPs at the MoE balance's efficiency."""
        def t(e_mfu: float, e_net: float, e_bal: float) -> float:
            comm = training_collectives_s(w, part, passes, e_net) if collectives else 0.0
            flops = n_flops * (1 - routed + routed / e_bal) + attn_flops
            return (compute_s(flops, w, part, e_mfu) + comm) * bubble
        return Phase(t(mfu.high, net.high, bal.high), t(mfu.low, net.low, bal.low), note,
                     t(middle(mfu), middle(net), middle(bal)))

    if w.rollout and same_rollout is not None:
        at_mean, at_max = same_rollout.rollout_at_mean, same_rollout.rollout_at_max
        phases["rollout"] = same_rollout.phases["rollout"]
    elif w.rollout:
        at_tp, worst = decode_mbu(w.rollout_tp, mbu), decode_mbu_worst(w.rollout_tp, mbu)
        best = decode_mbu_best(w.rollout_tp, mbu)
        at_mean = Phase(rollout_s(w, part, w.response_mean, best, mfu.high, False, net.high, True),
                        rollout_s(w, part, w.response_mean, worst, mfu.low, False, net.low), "",
                        rollout_s(w, part, w.response_mean, at_tp, middle(mfu), False, middle(net)))
        at_max = Phase(rollout_s(w, part, w.response_max, best, mfu.high, True, net.high, True),
                       rollout_s(w, part, w.response_max, worst, mfu.low, True, net.low), "",
                       rollout_s(w, part, w.response_max, at_tp, middle(mfu), True, middle(net)))
        decode = Phase(spread_rollout_s(w, part, best, mfu.high, net.high, paged=True, measured_flat=True),
                       max(spread_rollout_s(w, part, worst, mfu.low, net.low), at_max.high), "",
                       spread_rollout_s(w, part, at_tp, middle(mfu), middle(net)))
        parts = {"decode": decode}
        if w.engine_sleep_level == 1:
            # vLLM's level-1 sleep after the rollout copies its weights to pinned host memory
            b, pcie = rollout_shard_bytes(w) / part.pcie, f["pcie"]
            parts["sleep"] = on_host(Phase(b / pcie.high, b / pcie.low, "", b / middle(pcie)), f)
        phases["rollout"] = summed(parts, "the response lengths spread with their mean, the step waiting for its "
                                   "longest; low: the optimistic efficiencies, as many sequences at once as the paged "
                                   "KV cache holds at their mean occupancy; middle: as many as it holds at the "
                                   "longest; high: the last wave's whole batch decoding max_response_length")
    if w.rollout:
        passes = 2 if w.reference else 1
        phases["log_prob"] = compute(2 * w.active_params * w.tokens * passes, attn * passes,
                                     "old policy" + (" + reference" if w.reference else ""), passes)
    k = 8 if w.recompute else 6
    train = compute(k * w.active_params * w.tokens, k / 2 * attn,
                    f"{k}·N·T + attention + TP/EP collectives, pipeline bubble ×{bubble:.2f}, the optimizer's "
                    f"DP traffic × {w.mini_batches}", k / 2)
    if collectives:
        g = [gradient_sync_s(w, part, e) for e in (net.high, net.low, middle(net))]
        train = Phase(train.low + g[0], train.high + g[1], train.note, train.middle + g[2])
    phases["train"] = train
    if w.rollout:
        # the engine's side of the refit does not depend on the training mesh (taken from same_rollout when given);
        # what the refit moves to and from the host does (the per-GPU bytes of the training engine's state)
        engine = dict(same_rollout.phases["sync"].parts) if same_rollout is not None else refit_parts(w, part, f)
        engine = {n: p for n, p in engine.items() if n in REFIT_ENGINE_PARTS}
        r = REFIT_RATE
        host = " beside it " + ("the training weights to the GPU for the export and back to the host"
                                if w.refit_host != "state" else "the optimizer states and training weights to the host")
        phases["sync"] = summed({**engine, **refit_host_parts(w, part, f)},
                                f"every rank handles the whole bf16 model ({refit_bytes(w) / 1e9:.0f} GB) at "
                                f"{r.low / 1e9:.0f}–{r.high / 1e9:.0f} GB/s (the frameworks' per-tensor refit), "
                                f"{w.tensors:,} tensors, the engine's wake-up;{host}")
    moved = offload_parts(w, part, f)
    if moved:
        per_way = (w.param_bytes if w.param_offload else 0.0) + (w.optimizer_bytes if w.optimizer_offload else 0.0)
        ways = "back" if w.refit_host == "state" else "each way"
        phases["offload"] = summed(moved, f"{per_way / 2 ** 30:.0f} GiB per GPU {ways} over PCIe (optimizer "
                                          "states through pageable memory)")
    assumptions = (
        "ESTIMATE: roofline per phase with the efficiencies listed (low time = the optimistic efficiency; the "
        "middle = their geometric mean, the decode MBU measured at the rollout's TP, the response lengths spread "
        "with their mean, the step waiting for its longest)",
        w.mean_source,
        "decode: a replica's TP all-reduces within its NVLink domain in its measured MBU; a replica wider than the "
        "domain adds its whole TP group's by NCCL's latency model + bytes; training and log-prob: TP all-reduce "
        "and EP all-to-all bytes, NVLink inside the part's NVLink domain; the optimizer's DP reduce-scatter and "
        "all-gather per optimizer step; refit: the whole bf16 model through every rank at the measured refit "
        "rate, a measured cost per tensor, the engine's wake-up, the training state the refit moves to and from "
        "the host; offload: parameters pinned, optimizer states pageable, gradients freed; the host-bound costs "
        "(refit, offload) slower on another cluster at the pessimistic end; " +
        ("experts split over EP ranks waiting for the busiest; " if routed else "") +
        "not modelled: reward, DP imbalance, CP and PP traffic, kernel-launch overheads, a CPU optimizer's step, "
        "start-up, checkpoint saves",
    )
    host_bound = "sync" in phases or "offload" in phases or (
        "rollout" in phases and any(n == "sleep" for n, _ in phases["rollout"].parts))
    unused = {"moe_balance": not routed, "host": not host_bound}
    used = {"train_mfu" if not w.moe else "train_mfu_moe": mfu,
            **{k: v for k, v in f.items() if not k.startswith("train_mfu") and not unused.get(k, False)}}
    if "sync" in phases:
        used.update(refit_rate=REFIT_RATE, refit_tensor_s=REFIT_TENSOR_S, engine_wake_s=ENGINE_WAKE_S)
    return StepTime(phases=phases, rollout_at_mean=at_mean, rollout_at_max=at_max, assumptions=assumptions,
                    factors=used)


def collective_seconds(w: Workload, part: Part, mesh) -> tuple[float, float]:
    """The training mesh's collectives at efficiency 1, before the pipeline bubble: (per forward-equivalent pass,
    the optimizer's DP traffic per step). They depend on the mesh through TP, PP, EP and ETP alone (DP·CP is
    world/(TP·PP)), so mesh=auto computes them once per such mesh."""
    return training_collectives_s(w, part, 1, 1.0, mesh), gradient_sync_s(w, part, 1.0, mesh)


def _passes(w: Workload) -> tuple:
    """(phase, forward-equivalent passes) of the phases the training mesh's collectives add to."""
    train = ("train", (8 if w.recompute else 6) / 2)
    return (("log_prob", 2 if w.reference else 1), train) if w.rollout else (train,)


def collectives_middle_s(w: Workload, seconds: tuple, factors: Optional[dict] = None) -> float:
    """What with_collectives adds to the middle, log-prob and training together, from collective_seconds."""
    per_pass, sync = seconds
    one = per_pass * (1 + _bubble(w)) * sum(n for _, n in _passes(w)) + sync
    return one / middle((factors or FACTORS)["network"])


def with_collectives(st: StepTime, w: Workload, part: Part, mesh, factors: Optional[dict] = None,
                     seconds: Optional[tuple] = None) -> StepTime:
    """An estimate made with collectives=False, with the collectives of the training mesh `mesh` (its tp, cp, ep,
    etp, pp) added to its log-prob and training phases: the same figures estimate() gives on that mesh, without
    building the workload again (mesh=auto times thousands of meshes). w: the workload st was made from; seconds:
    collective_seconds(w, part, mesh) when already known."""
    net = (factors or FACTORS)["network"]
    bubble = 1 + _bubble(w)
    phases = dict(st.phases)
    # both are bytes over links at efficiency `net`: computed once at 1, divided by each efficiency
    per_pass, sync = seconds if seconds is not None else collective_seconds(w, part, mesh)
    for name, passes in _passes(w):
        p = phases.get(name)
        if p is None:
            continue
        one = per_pass * bubble * passes + (sync if name == "train" else 0.0)
        if one:
            phases[name] = Phase(p.low + one / net.high, p.high + one / net.low, p.note, p.middle + one / middle(net))
    return StepTime(phases, st.rollout_at_mean, st.rollout_at_max, st.assumptions, st.factors, st.scale,
                    st.calibration, st.ratios)


def gpu_hours(st: StepTime, steps: float, gpus: int) -> tuple[float, float]:
    """(low, high) GPU-hours for `steps` steps on `gpus` GPUs."""
    return st.low * steps * gpus / 3600, st.high * steps * gpus / 3600

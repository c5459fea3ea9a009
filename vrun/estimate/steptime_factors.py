"""The step-time estimate's fixed inputs, each with its source: the efficiency factors (FACTORS, each a
(pessimistic, optimistic) pair), the decode bandwidth measured per tensor-parallel size and its band past the widest
TP measured, the refit's measured rates (REFIT_RATE, REFIT_TENSOR_S, ENGINE_WAKE_S), vLLM's sleep level between
rollouts and what a colocated refit moves to and from the host (REFIT_HOST). Never fitted to the published step
times the estimate is held to (tests/test_steptime.py). vrun.estimate.steptime says how they are used."""
from __future__ import annotations

import math
from dataclasses import dataclass


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
    t1, m1 = max(DECODE_MBU_AT_TP.items())
    return band.low if tp <= t1 else min(band.low, m1 * _trend(tp))


def decode_mbu_best(tp: int, band: Factor) -> float:
    """The optimistic decode MBU of a replica of TP `tp`: the band's high end up to the widest TP the source
    measured (TP8); past it that end carried on by the source's own trend, the same ratio per doubling as
    decode_mbu_worst (0.60 · (0.25 / 0.40)^log2(tp / 8): 0.375 at TP16, 0.234 at TP32), so the band keeps the width
    it has at TP8 (band.high / band.low) and moves with the trend at both ends. Holding TP8's measured figure (0.25)
    flat instead made a TP16 replica's optimistic end 2.4× slower per byte than a TP8 replica's, a step no source
    measured (the source's own step per doubling is 0.625×): Qwen3-235B-A22B's TP16 rollout on 128 H100 then put
    the step's low end at 423 s against NeMo RL v0.6's published 395 s."""
    return min(band.high, band.high * _trend(tp))


def _trend(tp: int) -> float:
    """The source's last step (TP4 -> TP8) carried on past TP8, per doubling of TP: 1 up to TP8, (0.25 / 0.40) at
    TP16, its square at TP32."""
    pts = sorted(DECODE_MBU_AT_TP.items())
    (t0, m0), (t1, m1) = pts[-2], pts[-1]
    if tp <= t1:
        return 1.0
    return (m1 / m0) ** ((math.log2(tp) - math.log2(t1)) / (math.log2(t1) - math.log2(t0)))


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


def middle(f) -> float:
    """The geometric mean of a (pessimistic, optimistic) pair: a Factor or a Rate."""
    return math.sqrt(f.low * f.high)

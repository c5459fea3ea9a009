"""Published end-to-end GRPO step times, with the shapes they were measured at (test data for test_steptime.py).

Sources: NeMo RL's performance summary, docs/about/performance-summary.md of NVIDIA-NeMo/RL at commit
06beed91bac98a2c39a19435f6bbbbe71aa45720, section "Nemo RL v0.4", GRPO on OpenMathInstruct-2, DGX-H100, bf16
training and generation, Megatron-core. Columns used: T-Max Sequence Length, G-Average Seq len, #GPUs, G-GBS
(sequences generated per step), T-GBS (sequences per optimizer step), Generation [TP,PP], Training
[TP,CP,EP,PP,VPP], Total Step time(s). Only the on-policy rows: a colocated step of generation, log-probs,
training and refit, which is what verl runs (the 1-step-off rows overlap generation with training).

Not in the table, taken from the recipes the table points at (RECIPES: r0.4.0's examples/configs/recipes/llm/
performance, tag v0.4.0 = c751f811217db7df0d4c94abdeaada6626cfc150; the same keys at the pinned commit): full
activation recompute (megatron_cfg.activation_checkpointing: true, which NeMo RL's megatron_policy_worker.py turns
into recompute_granularity "full") in grpo-deepseek-v3-32n8g.yaml, grpo-qwen3-235b-16n8g.yaml and
grpo-llama3.1-8b-instruct-2n8g.yaml, not in the Qwen3-30B-A3B and Qwen3-32B ones (grpo_math_1B.yaml's default,
false).
Micro-batch 1 is the recipes' train_micro_batch_size. Not in the table nor read from a recipe, so assumed here (the
same for every case, and said): a 128-token mean prompt (OpenMathInstruct-2 problems are short; the response takes
the rest of the average and of the maximum), no sequence packing, vLLM gpu_memory_utilization 0.6 (NeMo RL's
default), parameters and optimizer moved off the GPU around generation. The reference policy's log-prob pass is on
for every NeMo RL case: v0.4.0's nemo_rl/algorithms/grpo.py computes it every step, unconditionally
(get_reference_policy_logprobs; line 1254 at the pinned commit). One assumption is known to differ from NeMo RL
v0.4.0 and is left as it was, said here: grpo_math_1B.yaml packs sequences (sequence_packing.enabled, micro-batches
of max_total_sequence_length tokens: fewer, fuller micro-batches, a larger pipeline bubble for PP > 1). The Llama
row's recipe also sets pipeline_model_parallel_size 2; the table's training column for it has seven entries and is
kept at PP1 here.

The architectures (not among this project's five model groups) are the checkpoints' config.json facts:
DeepSeek-V3 (deepseek-ai/DeepSeek-V3), Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-32B (Qwen/…), Llama-3.1-8B
(meta-llama/…).
verl's own DeepSeek-V3 figure (docs/perf/dpsk.md) is the last case, with its sources beside it.
No published end-to-end step time was found for this project's own five models (GLM-5.1, Kimi-K2.6, Qwen3.5-35B-A3B,
DeepSeek-V4 Flash/Pro) under verl or NeMo RL.

Predicted (the estimate's middle) vs published, the factors unchanged. "roofline" is the roofline alone; "+coll"
adds the rollout's TP all-reduces (NCCL's latency model) and the training mesh's TP/EP collective bytes; "+refit"
adds the refit as the frameworks do it (vrun/estimate/steptime.py REFIT_RATE, sync_s: every rank gathers and
hands over the whole bf16 model, tensor by tensor, at 36–96 GB/s measured by NeMo RL) and the recipes' recompute;
"+ref" turns NeMo RL's reference pass on (its grpo.py runs it every step); "now" takes the decode MBU at the
rollout's TP as the source measured it (steptime.DECODE_MBU_AT_TP: 60% at TP2, 40% at TP4, 25% at TP8, one node,
its all-reduces included, so the explicit all-reduces count only for a replica wider than a node) where the
columns before used the middle of the band, 39%, at every TP:
  case                      gen TP  published   roofline      +coll         +refit        +ref          now
  deepseek_v3_256xh100        32      154 s      50 s 0.32×    58 s 0.38×    81 s 0.53×    83 s 0.54×   107 s 0.69×
  qwen3_235b_a22b_128xh100    16      506 s     416 s 0.82×   505 s 1.00×   523 s 1.03×   534 s 1.06×   747 s 1.48×
  qwen3_30b_a3b_32xh100        4      225 s     120 s 0.53×   135 s 0.60×   136 s 0.60×   146 s 0.65×   138 s 0.61×
  llama3_1_8b_16xh100          1     97.7 s     179 s 1.83×   179 s 1.83×   190 s 1.94×   201 s 2.05×   154 s 1.57×
  qwen3_32b_32xh100            4      393 s     539 s 1.37×   582 s 1.48×   583 s 1.48×   661 s 1.68×   632 s 1.61×
  verl_deepseek_v3_96xh20     32     1700 s     764 s 0.45×   904 s 0.53×   926 s 0.54×   926 s 0.54×  1185 s 0.70×
Before "now", Llama-3.1-8B on 16 H100s was out (2.05×): at TP1 its decode was taken at the band's middle, 39%, where
the source measured 60% at TP2, and the TP32 rollouts of DeepSeek-V3 at 39% where it measured 25% at TP8 (taken for
every TP past 8). One per-phase figure checks the change without being an input: verl's DeepSeek-V3 page measured
its rollout at 1,050 s; the estimate's middle had 602 s and now has 861 s. The last wave is still taken to grow
every one of its sequences to the maximum response length (pessimistic for a short-answer data set), and counting
the replica's concurrency at a sequence's mean KV occupancy instead (vLLM's paged cache, Kwon et al. 2023) is not
modelled.
NeMo RL's DeepSeek-V3 on 256 H100s, what brought it in: its refit. Every rank of a refit receives each weight whole
(Megatron-Bridge's stream_weights_megatron_to_hf at the commit NeMo RL pins, 8aa287df: a PP broadcast, then TP and
EP all-gathers, every rank yielding the full tensor; verl's per_tensor_generator does the same), so each GPU handles
all 1.34 TB of DeepSeek-V3 in bf16 whatever its rollout shard (42 GB at TP32): 22.8 s at the middle rate, where the
shard-only reshard had 1.2 s. The rate's ends are NeMo RL's timings of its non-colocated refit (NVIDIA-NeMo/RL pull
1379: Qwen3-235B-A22B and DeepSeek-V3 on other set-ups), per-phase measurements, not the step times tested here.
NeMo RL's own figure for the colocated refit, about 35 s for the whole of DeepSeek-V3 over some 175 IPC transfers
(NVIDIA-NeMo/RL pull 1267, a review comment, 2025-10), matches the rate's low end (38 GB/s); it is a check, not an
input. The rest of the gap (the estimate's 81 s against 154 s) has no sourced per-phase figure. The same table's
v0.6 (docs/about/performance-summary.md at commit 69c7ca1170327f8185a7278166c31968236a841c, a later checkpoint, 701
mean tokens) times this shape at 134 s on 256 GPUs and 111 s on 512; if log-prob and training scale with the tokens
per DP rank (× a bubble growing from 1.47 to 1.94) and the rest does not, about 66 s lies in parts that do not
shrink with more GPUs (the rollout's longest response, the refit) and about 68 s at 256 GPUs in log-prob and
training, where the roofline has 6 s (8·37B·381k tokens at 8–47% MFU, PP16 with 32 one-sequence micro-batches). The
per-micro-batch weight reads (≈ 60 GB per GPU per micro-batch with fp32 gradient accumulation, ≈ 18 ms at 3.35 TB/s,
under 1 s over the 47 pipeline slots) and DeepEP's published all-to-all bandwidth (43 GB/s internode at EP16,
deepseek-ai/DeepEP docs/legacy.md, ≈ 2–3 s) do not reach it, and no MFU for a MoE this size at this micro-batch is
sourced independently of the case. The training MFU range is not lowered to fit it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

SOURCE = {"repo": "NVIDIA-NeMo/RL", "path": "docs/about/performance-summary.md",
          "commit": "06beed91bac98a2c39a19435f6bbbbe71aa45720", "section": "Nemo RL v0.4, GRPO, DGX-H100, on policy"}
PROMPT_MEAN = 128
# the recipes the NeMo RL rows were measured with (the table points at r0.4.0's performance recipes)
RECIPES = {"repo": "NVIDIA-NeMo/RL", "path": "examples/configs/recipes/llm/performance",
           "tag": "v0.4.0", "commit": "c751f811217db7df0d4c94abdeaada6626cfc150"}
GPU_MEMORY_UTILIZATION = 0.6

DEEPSEEK_V3 = dict(layers=61, dense_layers=3, routed_experts=256, experts_per_token=8, shared_experts=1, heads=128,
                   hidden=7168, vocab=129280, expert_ffn_hidden=2048, dense_ffn_hidden=18432, attention="mla",
                   q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
QWEN3_30B_A3B = dict(layers=48, routed_experts=128, experts_per_token=8, heads=32, kv_heads=4, head_dim=128,
                     hidden=2048, vocab=151936, expert_ffn_hidden=768, attention="gqa")
QWEN3_235B_A22B = dict(layers=94, routed_experts=128, experts_per_token=8, heads=64, kv_heads=4, head_dim=128,
                       hidden=4096, vocab=151936, expert_ffn_hidden=1536, attention="gqa")
# a dense model: one "expert" of the MLP's width taken by every token
QWEN3_32B = dict(layers=64, routed_experts=1, experts_per_token=1, heads=64, kv_heads=8, head_dim=128,
                 hidden=5120, vocab=151936, expert_ffn_hidden=25600, attention="gqa")

LLAMA3_1_8B = dict(layers=32, routed_experts=1, experts_per_token=1, heads=32, kv_heads=8, head_dim=128, hidden=4096,
                   vocab=128256, expert_ffn_hidden=14336, attention="gqa")



@dataclass(frozen=True)
class Case:
    arch: dict
    gpus: int
    max_seq: int            # prompt + response, at most
    avg_seq: Optional[int]  # the average prompt + response (None: mean_response given)
    samples: int            # sequences generated per step
    train_gbs: int          # sequences per optimizer step
    gen_tp: int
    train: tuple            # (TP, CP, EP, PP)
    step_s: float           # the published end-to-end step time
    source: dict = field(default_factory=lambda: SOURCE)
    part: str = "H100"
    mean_response: Optional[int] = None
    max_prompt: Optional[int] = None
    utilization: float = GPU_MEMORY_UTILIZATION
    recompute: bool = False
    reference: bool = False


# verl's own published DeepSeek-V3 run: docs/perf/dpsk.md ("Benchmark": 96 GPUs, mean response length 1960,
# rollout 1050 s, MFU 0.19, step 1700 s; the page names 96 H20 as the smallest set-up) with the 96-GPU row of its
# table (TP8 PP12 EP8, offload fraction 1) and the example script's defaults (train_batch_size 96, n 8, prompt
# 2048, response 8192, vLLM TP32 at 0.6, KL loss on, full recompute). The script is the stored version at the
# commit below, which may postdate the measurement.
VERL_DPSK = {"repo": "verl-project/verl", "path": "docs/perf/dpsk.md",
             "commit": "e677ce1f42274dc95df2efa0b8551bf5e0169751",
             "script": "examples/grpo_trainer/run_deepseek_v3_671b_vllm_megatron.sh",
             "script_commit": "01143cbaacfd8085bc8a56f08c910b5f2403a100"}

CASES = {
    "deepseek_v3_256xh100": Case(DEEPSEEK_V3, 256, 1536, 745, 512, 512, 32, (1, 1, 16, 16), 154.0,
                                 recompute=True, reference=True),
    "qwen3_235b_a22b_128xh100": Case(QWEN3_235B_A22B, 128, 8192, 5671, 512, 512, 16, (2, 2, 16, 8), 506.0,
                                     recompute=True, reference=True),
    "qwen3_30b_a3b_32xh100": Case(QWEN3_30B_A3B, 32, 4096, 3154, 2048, 512, 4, (2, 1, 8, 1), 225.0, reference=True),
    "llama3_1_8b_16xh100": Case(LLAMA3_1_8B, 16, 4096, 1060, 2048, 512, 1, (1, 1, 1, 1), 97.7, recompute=True,
                                reference=True),
    "qwen3_32b_32xh100": Case(QWEN3_32B, 32, 4096, 3206, 2048, 512, 4, (4, 1, 1, 4), 393.0, reference=True),
    "verl_deepseek_v3_96xh20": Case(DEEPSEEK_V3, 96, 2048 + 8192, None, 96 * 8, 32 * 8, 32, (8, 1, 8, 12), 1700.0,
                                    source=VERL_DPSK, part="H20", mean_response=1960, max_prompt=2048,
                                    recompute=True, reference=True),
}

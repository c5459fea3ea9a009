"""Published end-to-end GRPO step times, with the shapes they were measured at (test data for test_steptime.py).

Sources: NeMo RL's performance summary, docs/about/performance-summary.md of NVIDIA-NeMo/RL at commit
06beed91bac98a2c39a19435f6bbbbe71aa45720, section "Nemo RL v0.4", GRPO on OpenMathInstruct-2, DGX-H100, bf16
training and generation, Megatron-core. Columns used: T-Max Sequence Length, G-Average Seq len, #GPUs, G-GBS
(sequences generated per step), T-GBS (sequences per optimizer step), Generation [TP,PP], Training
[TP,CP,EP,PP,VPP], Total Step time(s). Only the on-policy rows: a colocated step of generation, log-probs,
training and refit, which is what verl runs (the 1-step-off rows overlap generation with training).

Not in the table, so assumed here (the same for every case, and said): a 128-token mean prompt (OpenMathInstruct-2
problems are short; the response takes the rest of the average and of the maximum), micro-batch 1, vLLM
gpu_memory_utilization 0.6 (NeMo RL's default), parameters and optimizer moved off the GPU around generation, no
recompute, no KL term.

The architectures (not among this project's five model groups) are the checkpoints' config.json facts:
DeepSeek-V3 (deepseek-ai/DeepSeek-V3), Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-32B (Qwen/…), Llama-3.1-8B
(meta-llama/…).
verl's own DeepSeek-V3 figure (docs/perf/dpsk.md) is the last case, with its sources beside it.
No published end-to-end step time was found for this project's own five models (GLM-5.1, Kimi-K2.6, Qwen3.5-35B-A3B,
DeepSeek-V4 Flash/Pro) under verl or NeMo RL.

Predicted (the estimate's middle) vs published, the factors unchanged; "before" is the roofline alone, "after" adds
the rollout's TP all-reduces (two per decoder layer per decode step, NCCL's own latency model from its tuning.cc +
the bytes over NVLink / the node's network; vrun/estimate/steptime.py allreduce_s) and the training mesh's TP
all-reduce and EP all-to-all bytes in log-prob and training (training_collectives_s):
  case                        published   before        after
  deepseek_v3_256xh100          154 s      50 s 0.32×    58 s 0.38×   OUT
  qwen3_235b_a22b_128xh100      506 s     416 s 0.82×   505 s 1.00×
  qwen3_30b_a3b_32xh100         225 s     120 s 0.53×   135 s 0.60×
  llama3_1_8b_16xh100          97.7 s     179 s 1.83×   179 s 1.83×   (TP1, EP1: no collective counted)
  qwen3_32b_32xh100             393 s     539 s 1.37×   582 s 1.48×
  verl_deepseek_v3_96xh20      1700 s     764 s 0.45×   904 s 0.53×
Why NeMo RL's DeepSeek-V3 on 256 H100s stays out: its rollout's TP32 spans 4 nodes, yet 122 all-reduces of ~0.9 MB
per decode step cost ~5 ms by NCCL's model (~7 s over the 1,408-token longest response): the decode side was never
the size of the gap. The same table's 1-step-off row (DeepSeek-V3, 512 GPUs, generation overlapping training,
77.9 s) bounds each of them at about 78 s on its share of the GPUs (256 each if split evenly, which the table does
not say), so the on-policy 154 s plausibly splits about evenly; the estimate's log-prob + training is ~3.5 s (6·37B·381k tokens at 8–47% MFU), an order of magnitude
under ~70 s. What is left out there (Megatron's EP16 all-to-all per MoE layer per micro-batch with one 745-token
sequence per micro-batch — counted now by its bytes, ~1.6 s —, PP16's 47-slot schedule of tiny GEMMs, activation recompute — the recipe
examples/configs/recipes/llm/performance/grpo-deepseek-v3-32n8g.yaml sets activation_checkpointing — and NeMo RL's
offload and refit around the phases) has no sourced per-step figure here: DeepEP's published normal-kernel
bandwidth (43 GB/s internode at EP16, deepseek-ai/DeepEP docs/legacy.md) makes the training all-to-all ~2–3 s, not
~70 s, and no MFU figure for a MoE this size at this micro-batch is sourced independently of the case. The
training MFU range is not lowered to fit it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

SOURCE = {"repo": "NVIDIA-NeMo/RL", "path": "docs/about/performance-summary.md",
          "commit": "06beed91bac98a2c39a19435f6bbbbe71aa45720", "section": "Nemo RL v0.4, GRPO, DGX-H100, on policy"}
PROMPT_MEAN = 128
# the cases the estimate's middle leaves outside 0.5×–2×, and why (the module docstring)
KNOWN_OUT = ("deepseek_v3_256xh100",)
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
    "deepseek_v3_256xh100": Case(DEEPSEEK_V3, 256, 1536, 745, 512, 512, 32, (1, 1, 16, 16), 154.0),
    "qwen3_235b_a22b_128xh100": Case(QWEN3_235B_A22B, 128, 8192, 5671, 512, 512, 16, (2, 2, 16, 8), 506.0),
    "qwen3_30b_a3b_32xh100": Case(QWEN3_30B_A3B, 32, 4096, 3154, 2048, 512, 4, (2, 1, 8, 1), 225.0),
    "llama3_1_8b_16xh100": Case(LLAMA3_1_8B, 16, 4096, 1060, 2048, 512, 1, (1, 1, 1, 1), 97.7),
    "qwen3_32b_32xh100": Case(QWEN3_32B, 32, 4096, 3206, 2048, 512, 4, (4, 1, 1, 4), 393.0),
    "verl_deepseek_v3_96xh20": Case(DEEPSEEK_V3, 96, 2048 + 8192, None, 96 * 8, 32 * 8, 32, (8, 1, 8, 12), 1700.0,
                                    source=VERL_DPSK, part="H20", mean_response=1960, max_prompt=2048,
                                    recompute=True, reference=True),
}

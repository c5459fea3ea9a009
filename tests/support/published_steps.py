"""Published GRPO step times — end to end and per phase — with the shapes they were measured at (test data for
test_steptime.py). Every field says where it comes from; what no source gives is said to be assumed.

1. NeMo RL's performance summary (SOURCE): docs/about/performance-summary.md of NVIDIA-NeMo/RL at commit
06beed91bac98a2c39a19435f6bbbbe71aa45720, section "Nemo RL v0.4", GRPO on OpenMathInstruct-2, DGX-H100, bf16
training and generation, Megatron-core. Columns used: T-Max Sequence Length, G-Average Seq len, #GPUs, G-GBS
(sequences generated per step), T-GBS (sequences per optimizer step), Generation [TP,PP], Training
[TP,CP,EP,PP,VPP], Total Step time(s). Only the on-policy rows: a colocated step of generation, log-probs,
training and refit, which is what verl runs (the 1-step-off rows overlap generation with training). End-to-end
times only.
Not in the table, taken from the recipes the table points at (RECIPES: r0.4.0's examples/configs/recipes/llm/
performance, tag v0.4.0 = c751f811217db7df0d4c94abdeaada6626cfc150, and the grpo_math_1B.yaml they inherit): full
activation recompute (megatron_cfg.activation_checkpointing: true) in grpo-deepseek-v3-32n8g.yaml,
grpo-qwen3-235b-16n8g.yaml and grpo-llama3.1-8b-instruct-2n8g.yaml, not in the Qwen3-30B-A3B and Qwen3-32B ones;
sequence packing (sequence_packing.enabled: true, micro-batches of max_total_sequence_length tokens:
train_micro_batch_size 1); the optimizer on the GPU (optimizer_cpu_offload: false) with gradients reduced in bf16
(grad_reduce_in_fp32: false); vLLM put to sleep at level 1 between rollouts (nemo_rl/models/generation/vllm/
vllm_worker.py: llm.sleep(level=1)). The reference policy's log-prob pass is on for every NeMo RL case: v0.4.0's
nemo_rl/algorithms/grpo.py computes it every step, unconditionally (get_reference_policy_logprobs; line 1254 at the
pinned commit). The Llama row's recipe also sets pipeline_model_parallel_size 2; the table's training column for
it has seven entries and is kept at PP1 here.

2. NeMo RL v0.3's release post (NEMO_RL_V03): "NeMo-RL V0.3: Scalable and Performant Post-training with Nemo-RL
via Megatron-Core", nvidia-nemo.github.io/blog/2025/07/21/nemo-rl-v0.3 (created 2025-07-21; the same table on
developer.nvidia.com, 2025-08-20), its "Results" table: per model the total step time and four phases — Policy
training, Refit, Generation, Get logprobs — averaged over steps 22–29, with the average generated tokens per
sample; all rows at max sequence length 4096, rollout batch 2048, global batch 512, sequence packing on. Its
Megatron rows are the per-phase cases: Llama 3.1-8B Instruct on 1×8 GPUs (data parallel only), Llama 3.1-70B Base
on 8×8 (TP4·PP4), Qwen3-32B on 8×8 (TP4·PP2), Qwen3-30B-A3B on 8×8 (EP8·TP2). The recipes beside them
(V03_RECIPES: tag v0.3.0 = b1c86a816c5e2b4ca41ece193624a38dc62e6fdf, examples/configs/grpo_math_8B_megatron.yaml,
grpo_math_70B_megatron.yaml, grpo_math_qwen30ba3b_megatron.yaml, grpo_math_1B_megatron.yaml): 64 prompts × 32
generations, vLLM TP1 at 0.6 (8B), TP4 at 0.6 (70B), TP4 at 0.7 (30B-A3B), no activation recompute, the reference
KL term (reference_policy_kl_penalty 0.01), the distributed optimizer on the GPU (fp32 main params, precision-aware
Adam), gradients reduced in bf16, sequence packing at 4096 tokens per training micro-batch; and v0.3.0's code
(nemo_rl/algorithms/grpo.py, megatron_policy_worker.py, vllm.py): vLLM sleeps at level 1. Qwen3-32B has no recipe
at v0.3.0: its generation TP4 at 0.6 is ASSUMED (the v0.4 recipe for the model, grpo-qwen3-32b-4n8g.yaml, has TP4;
0.6 is grpo_math_1B_megatron.yaml's default). The post names no GPU part: H100 is ASSUMED (NeMo RL's performance
pages of the time are DGX-H100). Left out: its Llama 3.3-70B row at 16k tokens (the post gives CP4 on 16 nodes and
no TP, PP or generation TP; no recipe for it at v0.3.0), and the DTensor rows (not this project's engine).
What each of NeMo RL's timers holds (grpo.py at v0.3.0, and at v0.4.0 alike), so which estimate phases each
published phase is compared with (TIMERS): "Generation" (the `generation` timer: the rollout and the engine's sleep)
↔ rollout; "Get logprobs" (`policy_and_reference_logprobs`: the policy's and the reference's passes) ↔ log_prob;
"Policy training" (`policy_training`) ↔ train; "Refit" (`prepare_for_generation`: refit_policy_generation —
offload_before_refit and offload_after_refit move the optimizer states and the parameters to the host, vLLM wakes
its weights and KV cache, the weights pass over CUDA IPC) ↔ sync, whose refit_host "state" holds those copies to the
host (steptime.REFIT_HOST). Reloading them (`logprob_inference_prep`, `training_prep`: the offload phase) is in no
published phase, only in the total.

3. verl's own DeepSeek-V3 page (VERL_DPSK): its end-to-end step time and its rollout time.

Assumed for every NeMo RL case (no source gives them; the same for every case, and said): a 128-token mean prompt
(OpenMathInstruct-2 problems are short; the response takes the rest of the average and of the maximum), the mean
response the generated average.

The architectures (not among this project's five model groups) are the checkpoints' config.json facts:
DeepSeek-V3 (deepseek-ai/DeepSeek-V3), Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-32B (Qwen/…), Llama-3.1-8B,
Llama-3.1-70B (meta-llama/…).
No published end-to-end step time was found for this project's own five models (GLM-5.1, Kimi-K2.6, Qwen3.5-35B-A3B,
DeepSeek-V4 Flash/Pro) under verl or NeMo RL.

History of the end-to-end middle on the first six cases (published / estimate), the factors unchanged at each
step. "roofline" is the roofline alone; "+coll" adds the rollout's TP all-reduces (NCCL's latency model) and the
training mesh's TP/EP collective bytes; "+refit" adds the refit as the frameworks do it (REFIT_RATE: every rank
gathers and hands over the whole bf16 model, tensor by tensor, at 36–96 GB/s measured by NeMo RL) and the
recipes' recompute; "+ref" turns NeMo RL's reference pass on; "tp-mbu" takes the decode MBU at the rollout's TP
as the source measured it (steptime.DECODE_MBU_AT_TP); "phases" is the model held to the per-phase cases
(tests/test_steptime.py prints its table): the MFU of a dense model and of a mixture of experts apart, the response
lengths spread with their mean (the step waiting for its longest), the refit's cost per tensor and the engine's
wake-up, optimizer states through pageable memory and gradients not copied, the distributed optimizer's DP traffic
per optimizer step, and the NeMo RL recipes' sequence packing, GPU-resident optimizer and level-1 sleep; "bands" is
the model whose bands hold every published figure: the decode bandwidth past TP8 (not measured by its source)
banded by the source's trend carried on from both ends of TP8's band (the middle the geometric mean of TP8's figure
held flat and the pessimistic end: the TP16 and TP32 replicas decode slower), experts split over EP ranks waiting for the busiest (FEPLB's 18.6% at the pessimistic
end), and the host-bound costs (refit, offload) 1.5× slower on a second cluster at the pessimistic end (NeMo RL issue
959's reruns of the v0.3 recipes, DTensor rows):
  case                      gen TP  published  roofline  +coll  +refit   +ref  tp-mbu  phases  bands (its middle)
  deepseek_v3_256xh100        32       154 s  0.32×   0.38×  0.53×  0.54×  0.69×   0.71×   0.94× (145 s)
  qwen3_235b_a22b_128xh100    16       506 s  0.82×   1.00×  1.03×  1.06×  1.48×   1.06×   1.27× (644 s)
  qwen3_30b_a3b_32xh100        4       225 s  0.53×   0.60×  0.60×  0.65×  0.61×   0.75×   0.78× (176 s)
  llama3_1_8b_16xh100          1      97.7 s  1.83×   1.83×  1.94×  2.05×  1.57×   0.88×   0.90× (88 s)
  qwen3_32b_32xh100            4       393 s  1.37×   1.48×  1.48×  1.68×  1.61×   0.93×   0.94× (368 s)
  verl_deepseek_v3_96xh20     32      1700 s  0.45×   0.53×  0.54×  0.54×  0.70×   0.76×   0.99× (1687 s)
The middle of each case per phase, and its band, are in README's step-time table (tests/test_steptime.py table()).
The refit as its own phase (the plan's sync, which a run's weight-sync phase is bounded by): before the refit held
the training state it sends to the host, NeMo RL v0.3's refits read as the sync phase alone were 0.24× (Llama-3.1-8B,
1.2 s of 5 s), 0.33× (Llama-3.1-70B, 4.7 s of 14 s), 0.33× (Qwen3-32B) and 0.59× (Qwen3-30B-A3B); with it (the
optimizer states and weights to the host, steptime.REFIT_HOST "state") 0.81×, 0.54×, 0.54× and 0.71×, the same
figures the phase mapping gave before it, the totals unchanged.
NeMo RL's v0.5 and v0.6 tables (LATER: 20 on-policy totals, DGX-H100 and GB200-NVL72) added to the cases above, the
model's middles unchanged: every total inside its band but one, v0.6's Qwen3-235B-A22B on 128 H100 (395 s against a
low end of 423 s; the same recipe published at 506 s by v0.4 and 431 s by v0.5: the software alone moved it 1.28×).
Its low end was its TP16 rollout's optimistic end, whose decode MBU was TP8's measured middle figure held flat
(0.25): 2.4× under a TP8 replica's own optimistic end (0.60), a step no source measured. Carrying the source's trend
(0.625× per doubling) on from the band's high end as from its low end (0.375 at TP16, 0.234 at TP32, the band keeping
its TP8 width, every end counting the whole TP group's all-reduces past the NVLink domain) puts that low end at 330 s
(v0.5's 431 s case 423 -> 330 s, v0.4's 506 s case 422 -> 329 s, v0.6's 256-GPU 312 s case 311 -> 243 s); the TP32
replicas' low ends rise a little (verl's DeepSeek-V3 753 -> 781 s, its rollout's 381 -> 410 s; v0.6's DeepSeek-V3 on
256 H100 72 -> 75 s, its band 5.44× -> 5.21× wide). No middle and no high end moved; the TP8-and-narrower replicas
(every GB200 row, and the plans' own TP8 rollouts) are unchanged.
NeMo RL's reference pass swaps the reference's weights in through host memory (steptime_refit.reference_swap_s:
three pinned copies of the per-GPU weights inside "Get logprobs"): v0.3's log-prob phases 0.98 -> 1.09 (Llama-3.1-8B),
0.87 -> 0.93 (70B), 1.07 -> 1.09 (Qwen3-32B), 0.86 -> 0.90 (Qwen3-30B-A3B); the totals 0-3% up.
Tried for the rollout's middle and not kept: counting the sequences a replica decodes at once at their mean KV
occupancy (vLLM's paged cache admits that many) rather than at the longest sequence — verl's DeepSeek-V3 rollout came
to 385 s (0.37×) against its 1,050 s; it is the band's optimistic end instead.
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
LLAMA3_1_70B = dict(layers=80, routed_experts=1, experts_per_token=1, heads=64, kv_heads=8, head_dim=128, hidden=8192,
                    vocab=128256, expert_ffn_hidden=28672, attention="gqa")

NEMO_RL_V03 = {"url": "https://nvidia-nemo.github.io/blog/2025/07/21/nemo-rl-v0.3/", "created": "2025-07-21",
               "also": "https://developer.nvidia.com/blog/reinforcement-learning-with-nvidia-nemo-rl-megatron-core-"
                       "support-for-optimized-training-throughput/ (2025-08-20)",
               "table": "Results: Megatron rows, steps 22-29 averaged"}
V03_RECIPES = {"repo": "NVIDIA-NeMo/RL", "path": "examples/configs", "tag": "v0.3.0",
               "commit": "b1c86a816c5e2b4ca41ece193624a38dc62e6fdf"}




# which estimate phases each framework's published phase holds: a phase name, or (phase, part) for one cost inside a
# phase (module docstring: NeMo RL's timers at v0.3.0/v0.4.0)
TIMERS = {
    "nemo_rl": {"rollout": ("rollout",), "log_prob": ("log_prob",), "train": ("train",), "sync": ("sync",)},
    "verl": {"rollout": ("rollout",), "log_prob": ("log_prob",), "train": ("train",), "sync": ("sync",)},
}


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
    phases: dict = field(default_factory=dict)   # published seconds per estimate phase (TIMERS maps the names)
    timers: str = "nemo_rl"
    packed_tokens: Optional[int] = None          # sequence packing: tokens per training micro-batch (None: one sequence)
    optimizer_on_gpu: bool = True                # the optimizer lives on the GPU, moved to the host around the rollout
    engine_sleep_level: int = 1
    grad_reduce_bytes: float = 2.0               # bf16 gradient reduction (grad_reduce_in_fp32: false)
    refit_host: str = "state"                    # the refit sends the optimizer states and weights to the host
    gpus_per_node: int = 8                       # DGX-H100: 8; GB200 NVL72: 4 per compute tray
    reference_swap: bool = True                  # NeMo RL: the reference's weights swapped in through the host


# verl's own published DeepSeek-V3 run: docs/perf/dpsk.md ("Benchmark": 96 GPUs, mean response length 1960,
# rollout 1050 s, MFU 0.19, step 1700 s; the page names 96 H20 as the smallest set-up) with the 96-GPU row of its
# table (TP8 PP12 EP8, offload fraction 1: the optimizer on the host) and the example script's defaults
# (train_batch_size 96, n 8, ppo_mini_batch_size 32, prompt 2048, response 8192, vLLM TP32 at 0.6, KL loss on, full
# recompute). The script is the stored version at the commit below, which may postdate the measurement. Its rollout
# time is verl's timing_s/gen. verl's engine sleep level and gradient reduction dtype for the run are not given:
# taken as verl's (level 2) and Megatron's fp32 reduction (ASSUMED).
VERL_DPSK = {"repo": "verl-project/verl", "path": "docs/perf/dpsk.md",
             "commit": "e677ce1f42274dc95df2efa0b8551bf5e0169751",
             "script": "examples/grpo_trainer/run_deepseek_v3_671b_vllm_megatron.sh",
             "script_commit": "01143cbaacfd8085bc8a56f08c910b5f2403a100"}

_V03 = dict(source=NEMO_RL_V03, reference=True, packed_tokens=4096)
CASES = {
    # NeMo RL v0.4 performance summary (SOURCE, RECIPES): totals
    "deepseek_v3_256xh100": Case(DEEPSEEK_V3, 256, 1536, 745, 512, 512, 32, (1, 1, 16, 16), 154.0,
                                 recompute=True, reference=True, packed_tokens=1536),
    "qwen3_235b_a22b_128xh100": Case(QWEN3_235B_A22B, 128, 8192, 5671, 512, 512, 16, (2, 2, 16, 8), 506.0,
                                     recompute=True, reference=True, packed_tokens=8192),
    "qwen3_30b_a3b_32xh100": Case(QWEN3_30B_A3B, 32, 4096, 3154, 2048, 512, 4, (2, 1, 8, 1), 225.0, reference=True,
                                  packed_tokens=4096),
    "llama3_1_8b_16xh100": Case(LLAMA3_1_8B, 16, 4096, 1060, 2048, 512, 1, (1, 1, 1, 1), 97.7, recompute=True,
                                reference=True, packed_tokens=4096),
    "qwen3_32b_32xh100": Case(QWEN3_32B, 32, 4096, 3206, 2048, 512, 4, (4, 1, 1, 4), 393.0, reference=True,
                              packed_tokens=4096),
    # verl's DeepSeek-V3 page (VERL_DPSK): total and rollout
    "verl_deepseek_v3_96xh20": Case(DEEPSEEK_V3, 96, 2048 + 8192, None, 96 * 8, 32 * 8, 32, (8, 1, 8, 12), 1700.0,
                                    source=VERL_DPSK, part="H20", mean_response=1960, max_prompt=2048,
                                    recompute=True, reference=True, phases={"rollout": 1050.0}, timers="verl",
                                    optimizer_on_gpu=False, engine_sleep_level=2, grad_reduce_bytes=4.0,
                                    refit_host="weights", reference_swap=False),
    # NeMo RL v0.3 release post (NEMO_RL_V03, V03_RECIPES): totals and four phases each; the max sequence 4096, the
    # average one the prompt (PROMPT_MEAN) + the post's generated tokens per sample
    "v03_llama3_1_8b_8xh100": Case(LLAMA3_1_8B, 8, 4096, PROMPT_MEAN + 795, 2048, 512, 1, (1, 1, 1, 1), 112.0,
                                   phases={"train": 28.0, "sync": 5.0, "rollout": 58.0, "log_prob": 18.0}, **_V03),
    "v03_llama3_1_70b_64xh100": Case(LLAMA3_1_70B, 64, 4096, PROMPT_MEAN + 398, 2048, 512, 4, (4, 1, 1, 4), 147.0,
                                     phases={"train": 28.0, "sync": 14.0, "rollout": 84.0, "log_prob": 18.0}, **_V03),
    "v03_qwen3_32b_64xh100": Case(QWEN3_32B, 64, 4096, PROMPT_MEAN + 3283, 2048, 512, 4, (4, 1, 1, 2), 213.0,
                                  phases={"train": 68.0, "sync": 7.0, "rollout": 96.0, "log_prob": 40.0}, **_V03),
    # the post says sequence packing was on for every run, the model's v0.3.0 recipe sets it off: with PP1 the
    # estimate is the same either way (packing sets the micro-batches, which only the pipeline bubble reads)
    "v03_qwen3_30b_a3b_64xh100": Case(QWEN3_30B_A3B, 64, 4096, PROMPT_MEAN + 3251, 2048, 512, 4, (2, 1, 8, 1), 167.0,
                                      phases={"train": 50.0, "sync": 12.0, "rollout": 78.0, "log_prob": 23.0},
                                      utilization=0.7, **_V03),
}


# NeMo RL's later performance summaries (the same file, the same columns, one section per release), their on-policy
# GRPO rows in bf16 on the Megatron backend: DGX-H100 (8 GPUs a node) and GB200-NVL72 (4 a compute tray, the rack's
# 72 GPUs one NVLink domain). Left out: the 1-step and 8-step off-policy rows (generation overlaps training, which
# verl's colocated step does not), the FP8 rows (all off-policy), the DAPO row (several rollout rounds a step) and
# the SWE row (off-policy). Each row's recipe is the release's examples/configs/recipes/llm/performance/<model>-
# <nodes>n<gpus>g.yaml over grpo_math_1B.yaml (V05_RECIPES, V06_RECIPES): full recompute for DeepSeek-V3,
# Qwen3-235B and Llama-3.1-8B, none for Qwen3-30B-A3B and Qwen3-32B; sequence packing on (micro-batches of
# max_total_sequence_length) except DeepSeek-V3 on GB200 at v0.5 and DeepSeek-V3 everywhere at v0.6
# (sequence_packing.enabled: false); vLLM at gpu_memory_utilization 0.6 unless the recipe sets it (v0.6 DeepSeek-V3
# on GB200 0.3, v0.6 Qwen3-235B on 64 GB200 0.4); the optimizer on the GPU, bf16 gradient reduction, vLLM's level-1
# sleep and the reference pass as at v0.4 (grpo_math_1B.yaml: optimizer_cpu_offload false, grad_reduce_in_fp32
# false, reference_policy_kl_penalty 0.01; vllm_worker.py sleep(level=1)). Where a recipe and its table row differ,
# the row is kept, as for v0.4's Llama (its training column has seven entries, the recipe PP2 on H100): v0.6's
# DeepSeek-V3 on 512 H100 and on 256 GB200 (table EP16, recipe EP32).
SOURCE_V05 = {"repo": "NVIDIA-NeMo/RL", "path": "docs/about/performance-summary.md",
              "commit": "9dbd9adc95a10f5946cceb36e1d5b31e2429e470", "section": "Nemo RL v0.5, GRPO, on policy"}
SOURCE_V06 = {"repo": "NVIDIA-NeMo/RL", "path": "docs/about/performance-summary.md",
              "commit": "66059ab4d8e46b2043f97012ed7d4b1ddfebbecd", "section": "NeMo RL v0.6, GRPO, on policy"}
V05_RECIPES = {"repo": "NVIDIA-NeMo/RL", "path": "examples/configs/recipes/llm/performance", "tag": "v0.5.0",
               "commit": "6c7089300fded94abfa49bb9cbf9eb357d862461"}
V06_RECIPES = {"repo": "NVIDIA-NeMo/RL", "path": "examples/configs/recipes/llm/performance", "tag": "v0.6.0",
               "commit": "5fb588932bf835506a8a5bac01de4f8c7ab0a065"}

_GB = dict(part="GB200", gpus_per_node=4)


def _later(source: dict, name: str, arch: dict, gpus: int, max_seq: int, avg_seq: int, samples: int, gen_tp: int,
           train: tuple, step_s: float, recompute: bool, packed: bool = True, **kw) -> tuple:
    """One on-policy row of a later summary: (name, Case), the row's columns as the table gives them (T-GBS 512)."""
    return name, Case(arch, gpus, max_seq, avg_seq, samples, 512, gen_tp, train, step_s, source=source,
                      recompute=recompute, reference=True, packed_tokens=max_seq if packed else None, **kw)


LATER = dict([
    # v0.5 H100 (SOURCE_V05, V05_RECIPES)
    _later(SOURCE_V05, "v05_llama3_1_8b_16xh100", LLAMA3_1_8B, 16, 4096, 1019, 2048, 1, (1, 1, 1, 1), 92.8, True),
    _later(SOURCE_V05, "v05_deepseek_v3_256xh100", DEEPSEEK_V3, 256, 1536, 744, 512, 32, (1, 1, 16, 16), 134.0,
           True),
    _later(SOURCE_V05, "v05_qwen3_235b_a22b_128xh100", QWEN3_235B_A22B, 128, 8192, 5700, 512, 16, (2, 2, 16, 8),
           431.0, True),
    _later(SOURCE_V05, "v05_qwen3_30b_a3b_32xh100", QWEN3_30B_A3B, 32, 4096, 3196, 2048, 2, (1, 1, 8, 1), 198.0,
           False),
    _later(SOURCE_V05, "v05_qwen3_32b_32xh100", QWEN3_32B, 32, 4096, 3251, 2048, 4, (4, 1, 1, 4), 376.0, False),
    # v0.5 GB200-NVL72
    _later(SOURCE_V05, "v05_llama3_1_8b_8xgb200", LLAMA3_1_8B, 8, 4096, 1066, 2048, 1, (1, 1, 1, 1), 91.0, True,
           **_GB),
    _later(SOURCE_V05, "v05_deepseek_v3_128xgb200", DEEPSEEK_V3, 128, 1536, 996, 512, 32, (1, 1, 16, 8), 128.0,
           True, packed=False, **_GB),
    _later(SOURCE_V05, "v05_qwen3_235b_a22b_64xgb200", QWEN3_235B_A22B, 64, 8192, 5711, 512, 8, (2, 2, 16, 4),
           332.0, True, **_GB),
    _later(SOURCE_V05, "v05_qwen3_30b_a3b_16xgb200", QWEN3_30B_A3B, 16, 4096, 3198, 2048, 1, (1, 1, 16, 1), 232.0,
           False, **_GB),
    _later(SOURCE_V05, "v05_qwen3_32b_16xgb200", QWEN3_32B, 16, 4096, 3253, 2048, 1, (2, 1, 1, 1), 381.0, False,
           **_GB),
    # v0.6 H100 (SOURCE_V06, V06_RECIPES)
    _later(SOURCE_V06, "v06_deepseek_v3_256xh100", DEEPSEEK_V3, 256, 1536, 701, 512, 32, (1, 1, 16, 16), 134.0,
           True, packed=False),
    _later(SOURCE_V06, "v06_deepseek_v3_512xh100", DEEPSEEK_V3, 512, 1536, 697, 512, 32, (1, 1, 16, 16), 111.0,
           True, packed=False),
    _later(SOURCE_V06, "v06_qwen3_235b_a22b_128xh100", QWEN3_235B_A22B, 128, 8192, 5698, 512, 16, (2, 2, 16, 8),
           395.0, True),
    _later(SOURCE_V06, "v06_qwen3_235b_a22b_256xh100", QWEN3_235B_A22B, 256, 8192, 5713, 512, 16, (2, 2, 16, 8),
           312.0, True),
    _later(SOURCE_V06, "v06_qwen3_30b_a3b_32xh100", QWEN3_30B_A3B, 32, 4096, 3203, 2048, 2, (1, 1, 8, 1), 192.0,
           False),
    # v0.6 GB200-NVL72
    _later(SOURCE_V06, "v06_deepseek_v3_128xgb200", DEEPSEEK_V3, 128, 1536, 711, 512, 32, (1, 1, 16, 8), 108.0,
           True, packed=False, utilization=0.3, **_GB),
    _later(SOURCE_V06, "v06_deepseek_v3_256xgb200", DEEPSEEK_V3, 256, 1536, 700, 512, 32, (1, 1, 16, 8), 98.7,
           True, packed=False, utilization=0.3, **_GB),
    _later(SOURCE_V06, "v06_qwen3_235b_a22b_64xgb200", QWEN3_235B_A22B, 64, 8192, 5709, 512, 8, (2, 2, 16, 4),
           286.0, True, utilization=0.4, **_GB),
    _later(SOURCE_V06, "v06_qwen3_235b_a22b_128xgb200", QWEN3_235B_A22B, 128, 8192, 5693, 512, 8, (2, 2, 16, 4),
           345.0, True, **_GB),
    _later(SOURCE_V06, "v06_qwen3_30b_a3b_16xgb200", QWEN3_30B_A3B, 16, 4096, 3199, 2048, 1, (1, 1, 16, 1), 221.0,
           False, **_GB),
])
CASES.update(LATER)


# The same v0.3 recipes rerun on a second cluster (NVIDIA-NeMo/RL issue 959, "70B GRPO training is slower than
# reported", 2025-08-21): per backend and model, the post's (total, training, refit, generation, log-probs) seconds and
# the rerun's. The host factor (vrun/estimate/steptime.py FACTORS["host"]) is the refit's slowdown on the DTensor rows,
# which are not among CASES; the Megatron rows are the cases above and set nothing.
V03_RERUN = {"repo": "NVIDIA-NeMo/RL", "issue": 959, "created": "2025-08-21",
             "rows": {("llama3_1_8b", "megatron"): ((112, 28, 5, 58, 18), (116, 27, 8, 56, 18)),
                      ("llama3_1_8b", "dtensor"): ((122, 38, 4, 57, 19), (129, 40, 6, 55, 19)),
                      ("llama3_1_70b", "megatron"): ((147, 28, 14, 84, 18), (178, 31, 26, 87, 20)),
                      ("llama3_1_70b", "dtensor"): ((230, 97, 15, 82, 28), (266, 117, 20, 88, 29))}}

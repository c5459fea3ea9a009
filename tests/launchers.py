"""The shell launchers this project replaces, as the Hydra override lists they hand to verl.

Written from the facts in shared/notes/launchers.md (verl PR #6791's scripts), one function per script,
each returning (verl config name, overrides) for its default knobs: the env-var knobs a user may change
are the function's arguments, everything else is the script's default. Values are spelled as the scripts
spell them (`True`, `1e-6`, `[console]`): Hydra's override grammar, not Python, decides their types.
The parity tests compose these with Hydra itself and compare against the project's plan.
"""
from __future__ import annotations

# The launchers search pkg://verl_mlite.config. The parity tests replace this entry by the package the plan
# searched: the real verl_mlite when MLITE_ROOT provides it, else the project's record of its config package.
MLITE_SEARCHPATH = "hydra.searchpath=[pkg://vrun.compose.mlite_record.config]"

# ALL_OFFLOAD's default in every launcher
ALL_OFFLOAD = "True"


def _engine(prefix: str, optimizer: str, *, tp: int, pp: int, ep: int, cp: int, etp: int) -> list[str]:
    """The Megatron Lite engine block every launcher writes, under the actor's or the SFT engine's prefix."""
    return [
        f"{prefix}.tp={tp}",
        f"{prefix}.pp={pp}",
        f"{prefix}.vpp=1",
        f"{prefix}.ep={ep}",
        f"{prefix}.cp={cp}",
        f"{prefix}.etp={etp}",
        f"{prefix}.param_offload={ALL_OFFLOAD}",
        f"{prefix}.optimizer_offload={ALL_OFFLOAD}",
        f"{prefix}.grad_offload={ALL_OFFLOAD}",
        f"{prefix}.attention_backend_override=flash",
        f"{prefix}.impl_cfg.use_thd=True",
        f"+{prefix}.impl_cfg.optimizer={optimizer}",
        f"+{prefix}.impl_cfg.recompute=[full]",
    ]


def kimi_k2_6_glm5_1(variant: str, optimizer: str, model_path: str, home: str) -> tuple[str, list[str]]:
    """examples/grpo_trainer/run_kimi_k2_6_glm5_1_megatron_lite.sh (MODEL_VARIANT=kimi_k2_6|glm5_1)."""
    assert variant in ("kimi_k2_6", "glm5_1"), variant
    # 32 nodes × 8 GPUs, TP1 PP8 EP8 CP8 ETP1
    nnodes, per_node = 32, 8
    return "ppo_trainer", [
        MLITE_SEARCHPATH,
        # algorithm
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "algorithm.kl_ctrl.kl_coef=0.0",
        # data
        f"data.train_files={home}/data/gsm8k/train.parquet",
        f"data.val_files={home}/data/gsm8k/test.parquet",
        "data.train_batch_size=128",
        "data.prompt_key=prompt",
        "data.return_raw_chat=True",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "data.max_prompt_length=1024",
        "data.max_response_length=2048",
        # model
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.model.trust_remote_code=True",
        "actor_rollout_ref.model.use_fused_kernels=False",
        # actor
        "actor@actor_rollout_ref.actor=mlite_actor",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.clip_ratio_c=10.0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        *_engine("actor_rollout_ref.actor.engine", optimizer, tp=1, pp=8, ep=8, cp=8, etp=1),
        "+actor_rollout_ref.actor.optim.override_optimizer_config.offload_fraction=1.0",
        # rollout
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
        "actor_rollout_ref.rollout.n=16",
        "actor_rollout_ref.rollout.prompt_length=1024",
        "actor_rollout_ref.rollout.response_length=2048",
        "actor_rollout_ref.rollout.free_cache_engine=True",
        # trainer
        "critic.enable=False",
        "trainer.logger=[console]",
        f"trainer.project_name=verl-mlite-{variant}-grpo",
        f"trainer.experiment_name={variant}_grpo_{optimizer}",
        "trainer.val_before_train=False",
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={per_node}",
        "trainer.total_epochs=1",
    ]


def qwen3_5_35b(optimizer: str, model_path: str, home: str) -> tuple[str, list[str]]:
    """examples/grpo_trainer/run_qwen3_5_35b_megatron_lite.sh."""
    # 1 node × 8 GPUs, TP1 PP1 EP8 CP8 ETP1
    nnodes, per_node = 1, 8
    return "ppo_trainer", [
        MLITE_SEARCHPATH,
        # algorithm: no kl_ctrl.kl_coef here (unlike the Kimi/GLM launcher)
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        # data: geo3k, and no prompt_key / return_raw_chat
        f"data.train_files={home}/data/geo3k/train.parquet",
        f"data.val_files={home}/data/geo3k/test.parquet",
        "data.train_batch_size=32",
        "data.max_prompt_length=1024",
        "data.max_response_length=2048",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        # model
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.model.trust_remote_code=True",
        "actor_rollout_ref.model.use_fused_kernels=False",
        # actor: a token budget per GPU, and no clip ratios
        "actor@actor_rollout_ref.actor=mlite_actor",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        *_engine("actor_rollout_ref.actor.engine", optimizer, tp=1, pp=1, ep=8, cp=8, etp=1),
        "+actor_rollout_ref.actor.optim.override_optimizer_config.offload_fraction=1.0",
        # rollout: one vLLM replica over the whole node
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.rollout.prompt_length=1024",
        "actor_rollout_ref.rollout.response_length=2048",
        "actor_rollout_ref.rollout.free_cache_engine=True",
        # trainer
        "critic.enable=False",
        "trainer.logger=[console]",
        "trainer.project_name=verl-mlite-qwen3_5_35b-geo3k-grpo",
        f"trainer.experiment_name=qwen3_5_35b_grpo_{optimizer}",
        "trainer.val_before_train=False",
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={per_node}",
        "trainer.save_freq=20",
        "trainer.test_freq=5",
        "trainer.total_epochs=15",
    ]


# MODEL_VARIANT → (NNODES, PP, EP, CP) of the DeepSeek-V4 SFT launcher; TP = ETP = 1 always
DEEPSEEK_V4_MESH = {"flash": (16, 4, 8, 4), "pro": (64, 8, 16, 4)}


def deepseek_v4_sft(variant: str, optimizer: str, model_path: str, home: str) -> tuple[str, list[str]]:
    """examples/sft/gsm8k/run_deepseek_v4_megatron_lite.sh (MODEL_VARIANT=flash|pro), under torchrun."""
    nnodes, pp, ep, cp = DEEPSEEK_V4_MESH[variant]
    per_node = 8
    return "sft_trainer_engine", [
        # data
        f"data.train_files={home}/data/gsm8k/train.parquet",
        "data.train_batch_size=32",
        "data.micro_batch_size_per_gpu=1",
        "data.use_dynamic_bsz=True",
        # the launcher feeds MAX_LENGTH to both
        "data.max_token_len_per_gpu=2048",
        "data.max_length=2048",
        "data.pad_mode=no_padding",
        "data.truncation=error",
        "data.messages_key=messages",
        # model
        "model=hf_model",
        f"model.path={model_path}",
        "model.trust_remote_code=True",
        # optimizer
        "optim=megatron",
        "optim.lr=1e-5",
        "optim.min_lr=1e-5",
        "optim.weight_decay=0.1",
        "optim.clip_grad=1.0",
        "optim.lr_warmup_steps=0",
        "optim.lr_decay_style=constant",
        "+optim.override_optimizer_config.offload_fraction=1.0",
        "+optim.override_optimizer_config.use_precision_aware_optimizer=True",
        "+optim.override_optimizer_config.decoupled_weight_decay=True",
        # engine
        MLITE_SEARCHPATH,
        "engine=mlite",
        *_engine("engine", optimizer, tp=1, pp=pp, ep=ep, cp=cp, etp=1),
        # trainer
        "trainer.logger=[console]",
        f"trainer.project_name=verl-mlite-deepseek_v4_{variant}-gsm8k-sft",
        f"trainer.experiment_name=deepseek_v4_{variant}_gsm8k_sft_{optimizer}",
        "trainer.total_epochs=1",
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={per_node}",
    ]

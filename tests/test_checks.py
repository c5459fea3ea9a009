"""Batch and algorithm checks: each fires, none fires on the presets, and they reject whatever verl rejects."""
import copy
import random

import pytest

from conftest import needs_dapo, problems_of
from vrun.compose import verl_tree
from vrun.entrypoints.ppo import ppo_batch_problems
from vrun.estimate.mesh import Mesh

BASE = ["model=glm5_1", "mode=plan"]
A = "verl.actor_rollout_ref.actor"


def first_error(overrides):
    lines = problems_of(BASE + overrides)
    assert lines, f"expected an error for {overrides}"
    return lines


def test_mini_batch_larger_than_train_batch():
    """verl asserts train_batch_size >= ppo_mini_batch_size."""
    lines = first_error([f"{A}.ppo_mini_batch_size=256"])
    assert any("ppo_mini_batch_size=256" in line and "train_batch_size=128" in line for line in lines)


def test_mini_batch_must_divide_train_batch():
    """verl does not check it; the plan does (the remainder would be dropped)."""
    lines = first_error([f"{A}.ppo_mini_batch_size=48"])
    assert any("must divide data.train_batch_size=128" in line for line in lines)


def test_samples_must_split_over_dense_dp():
    """tbs·n must split over Megatron Lite's dense DP (256 GPUs, TP1 CP8 PP4 → DP8)."""
    lines = first_error(["mesh.pp=4", "verl.data.train_batch_size=33", f"{A}.ppo_mini_batch_size=11",
                         "verl.actor_rollout_ref.rollout.n=4"])
    assert any("do not split over dense DP=8" in line for line in lines)


def test_fixed_batch_counts_all_gpus():
    """use_dynamic_bsz=false: verl counts strategy mlite as FSDP (all 256 GPUs) and asserts divisibility."""
    lines = first_error([f"{A}.use_dynamic_bsz=false", "verl.data.train_batch_size=8", f"{A}.ppo_mini_batch_size=8",
                         "verl.actor_rollout_ref.rollout.n=16"])
    assert any("divisible by all 256 GPUs" in line for line in lines)


def test_token_budget_holds_one_sequence():
    """With dynamic batching a single sequence must fit the micro-batch's budget: the per-GPU budget times CP
    (verl_mlite's sp_size); 2048 × CP 8 does, 256 × 8 does not."""
    assert not any("ppo_max_token_len_per_gpu=2048" in line
                   for line in problems_of(BASE + [f"{A}.ppo_max_token_len_per_gpu=2048"]))
    lines = first_error([f"{A}.ppo_max_token_len_per_gpu=256"])
    assert any("ppo_max_token_len_per_gpu=256" in line and "3072" in line and "CP 8" in line for line in lines)


def test_grpo_needs_a_group():
    """GRPO with n=1 has zero advantages everywhere."""
    lines = first_error(["verl.actor_rollout_ref.rollout.n=1"])
    assert any("rollout.n=1" in line for line in lines)


def test_dapo_is_applied():
    """algo=dapo plans with filter_groups, clip-higher, token-mean, no KL, DAPO reward manager."""
    needs_dapo()
    from conftest import plan

    v = plan(["model=glm5_1", "algo=dapo", "mode=plan"]).verl
    assert v["algorithm"]["filter_groups"]["enable"] is True and v["algorithm"]["filter_groups"]["metric"] == "acc"
    a = v["actor_rollout_ref"]["actor"]
    assert (a["clip_ratio_low"], a["clip_ratio_high"], a["loss_agg_mode"], a["use_kl_loss"]) == \
        (0.2, 0.28, "token-mean", False)
    assert v["reward"]["reward_manager"]["name"] == "dapo"
    ob = v["reward"]["reward_kwargs"]
    assert ob["overlong_buffer_cfg"]["enable"] is True and ob["max_resp_len"] == v["data"]["max_response_length"]


def test_overlong_penalty_without_dapo_manager_is_inert():
    """The launcher's mistake: overlong_buffer_cfg with the naive reward manager."""
    needs_dapo()
    lines = problems_of(["model=glm5_1", "algo=dapo", "mode=plan", "verl.reward.reward_manager.name=naive"])
    assert any(line.startswith("error: reward.reward_manager.name=naive") and "inert" in line for line in lines)


def test_dapo_without_dynamic_sampling_is_not_dapo():
    """algo=dapo with filter_groups off is rejected."""
    needs_dapo()
    lines = problems_of(["model=glm5_1", "algo=dapo", "mode=plan", "verl.algorithm.filter_groups.enable=false"])
    assert any("algorithm.filter_groups.enable=False" in line for line in lines)


def test_overlong_buffer_longer_than_response():
    """The DAPO reward manager asserts max_resp_len >= overlong_buffer.len."""
    needs_dapo()
    lines = problems_of(["model=glm5_1", "algo=dapo", "mode=plan",
                         "verl.reward.reward_kwargs.overlong_buffer_cfg.len=8192"])
    assert any("overlong_buffer_cfg.len=8192" in line for line in lines)


def test_sft_batch_splits_over_dp():
    """SFT: train_batch_size must split over dense DP (DS4-Pro on 512 GPUs: DP16)."""
    lines = problems_of(["model=deepseek_v4_pro", "algo=sft", "mode=plan", "verl.data.train_batch_size=24"])
    assert any("data.train_batch_size=24" in line and "DP=16" in line for line in lines)


def test_sft_needs_packed_sequences():
    """Megatron Lite takes only pad_mode=no_padding."""
    lines = problems_of(["model=deepseek_v4_flash", "algo=sft", "mode=plan", "verl.data.pad_mode=left_right"])
    assert any("data.pad_mode" in line for line in lines)


# ---- cross-check against verl's own validate_config, through its built-in Megatron engine configs

def _megatron_tree():
    return verl_tree.base_tree("ppo_trainer", ("model_engine=megatron",))


def _cases(k=120, seed=7):
    rnd = random.Random(seed)
    for _ in range(k):
        nnodes, gpn = rnd.choice([1, 2, 4, 8]), rnd.choice([4, 8])
        tp, pp, cp = rnd.choice([1, 2]), rnd.choice([1, 2, 4]), rnd.choice([1, 2, 3, 4])
        tbs, n = rnd.choice([6, 8, 12, 16, 24, 32, 64]), rnd.choice([1, 2, 3, 4, 8])
        mini = rnd.choice([2, 4, 6, 8, 16, 32, 64])
        micro = rnd.choice([1, 2, 4])
        yield Mesh(nnodes, gpn, tp=tp, pp=pp, cp=cp, ep=1, etp=1), tbs, n, mini, micro


def test_plan_rejects_whatever_verl_rejects():
    """On 120 generated meshes/batches verl's validate_config (Megatron engine, same mesh) rejects, the plan
    rejects too (the mlite engine dataclass cannot be built on CPU or with PyPI verl)."""
    from omegaconf import OmegaConf
    from verl.utils.config import validate_config

    base = _megatron_tree()
    verl_rejects = plan_rejects = both = 0
    for mesh, tbs, n, mini, micro in _cases():
        t = copy.deepcopy(base)
        meg = t["actor_rollout_ref"]["actor"]["megatron"]
        meg.update(tensor_model_parallel_size=mesh.tp, pipeline_model_parallel_size=mesh.pp,
                   context_parallel_size=mesh.cp)
        t["trainer"].update(nnodes=mesh.nnodes, n_gpus_per_node=mesh.gpus_per_node)
        t["data"]["train_batch_size"] = tbs
        t["actor_rollout_ref"]["rollout"].update(n=n, name="vllm", log_prob_micro_batch_size_per_gpu=1)
        t["actor_rollout_ref"]["actor"].update(ppo_mini_batch_size=mini, ppo_micro_batch_size_per_gpu=micro,
                                               use_dynamic_bsz=False)
        t["actor_rollout_ref"]["model"]["path"] = "/nonexistent"
        t["critic"]["enable"] = False
        try:
            validate_config(OmegaConf.create(t), use_reference_policy=False, use_critic=False)
            rejected = False
        except (AssertionError, ValueError) as e:
            rejected = True
            why = str(e)
        dense_ok = mesh.world % mesh.dense == 0
        ours = [] if not dense_ok else ppo_batch_problems(t, mesh)
        ours_rejects = (not dense_ok) or bool(ours)
        verl_rejects += rejected
        plan_rejects += ours_rejects
        if rejected:
            both += ours_rejects
            assert ours_rejects, f"verl rejects {mesh} tbs={tbs} n={n} mini={mini} micro={micro}: {why}"
    assert verl_rejects >= 20 and plan_rejects >= verl_rejects  # the generator exercises both outcomes
    assert both == verl_rejects


def test_presets_pass_batch_checks():
    """No batch check fires on the launchers' own settings."""
    for ov in (["model=glm5_1"], ["model=kimi_k2_6"], ["model=qwen3_5_35b"],
               ["model=deepseek_v4_flash", "algo=sft"], ["model=deepseek_v4_pro", "algo=sft"]):
        assert problems_of(ov + ["mode=plan"]) == [], ov


@pytest.mark.parametrize("bad", ["mesh.tp=0", "mesh.pp=-1"])
def test_non_positive_knob(bad):
    """A non-positive knob is named."""
    assert any(bad.split("=")[0] in line for line in problems_of(BASE + [bad]))


def test_grad_offload_apart_from_param_offload_is_a_warning():
    """Megatron Lite reads no grad_offload (gradients move with the parameters): a plan that sets the two apart is
    told what happens instead; the launchers' ALL_OFFLOAD (both on) and the defaults say nothing."""
    from conftest import plan

    lines = [w.line() for w in plan(["model=kimi_k2_6", "mode=plan", "engine.grad_offload=false"]).warnings]
    (line,) = [x for x in lines if "grad_offload" in x]
    assert line.startswith("warning: engine.grad_offload=False: Megatron Lite ignores it") and "offloaded" in line
    assert not [w for w in plan(["model=kimi_k2_6", "mode=plan"]).warnings if "grad_offload" in w.key]


def test_memory_estimate_moves_gradients_with_parameters():
    """The estimate's gradients follow param_offload whatever grad_offload says."""
    from conftest import plan
    from vrun.planning.phases import memory_inputs

    for params, grads in ((True, False), (False, True)):
        # without param_offload vLLM and the actor's residents exceed 80 GiB by the estimate: allowed here
        p = plan(["model=kimi_k2_6", "mode=plan", f"engine.param_offload={params}", f"engine.grad_offload={grads}",
                  "run.allow_memory_overrun=true"])
        inputs = memory_inputs(p.config, p.entrypoint, p.verl)
        assert inputs["param_offload"] is params and inputs["grad_offload"] is params


def test_dapo_without_dynamic_sampling_plans_on_every_verl(tmp_path):
    """algo.dynamic_sampling=false: DAPO's other three parts stay, filter_groups is off (or absent where verl has
    none), one warning says what is missing, and the plan table lists DAPO's parts."""
    from conftest import plan, runner

    p = plan(["model=glm5_1", "algo=dapo", "algo.dynamic_sampling=false", "mode=plan"])
    assert (p.verl["algorithm"].get("filter_groups") or {}).get("enable") in (None, False)
    a = p.verl["actor_rollout_ref"]["actor"]
    assert (a["clip_ratio_high"], a["loss_agg_mode"], a["use_kl_loss"]) == (0.28, "token-mean", False)
    assert p.verl["reward"]["reward_manager"]["name"] == "dapo"
    assert p.verl["reward"]["reward_kwargs"]["overlong_buffer_cfg"]["enable"] is True
    (w,) = [w.line() for w in p.warnings if w.key == "algo.dynamic_sampling"]
    assert "DAPO without dynamic sampling" in w
    out = runner("model=glm5_1", "algo=dapo", "algo.dynamic_sampling=false", "mode=plan",
                 f"hydra.run.dir={tmp_path}/r").stdout
    assert "dapo    dynamic sampling OFF; clip-higher 0.2/0.28; loss token-mean; no KL; overlong shaping last" in out


def test_dynamic_sampling_off_but_filter_groups_on_is_an_error():
    """Saying DAPO runs without dynamic sampling and switching it on through verl. contradicts."""
    needs_dapo()
    lines = problems_of(["model=glm5_1", "algo=dapo", "algo.dynamic_sampling=false", "mode=plan",
                         "verl.algorithm.filter_groups.enable=true"])
    assert any(x.startswith("error: algorithm.filter_groups.enable=True: algo.dynamic_sampling=false") for x in lines)


def test_dynamic_sampling_outside_dapo_is_a_warning():
    """algo.dynamic_sampling under GRPO does nothing, and the plan says so."""
    from conftest import plan

    p = plan(["model=glm5_1", "algo=grpo", "algo.dynamic_sampling=false", "mode=plan"])
    assert any(w.key == "algo.dynamic_sampling" and "does nothing for algo=grpo" in w.why for w in p.warnings)

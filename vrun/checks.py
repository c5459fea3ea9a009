"""Plan-time checks on the run config and the resolved verl config: what verl or Megatron Lite would reject
at job start (or silently get wrong), found before the allocation. Pure functions of their inputs; the values
Megatron Lite allows come from its record (vrun/mlite_record/record.yaml)."""
from __future__ import annotations

from vrun import mlite
from vrun.dotted import get
from vrun.mesh import Mesh, Rules
from vrun.problems import Problem

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"


def check_all(config, entrypoint, verl: dict, mesh: Mesh, rules: Rules) -> list[Problem]:
    """Every check of the plan: the mesh rules, the engine, then (on a valid mesh) the trainer, the entrypoint's
    mesh-dependent and recipe checks. `entrypoint`: the run's record (vrun.entrypoints)."""
    eng = get(verl, entrypoint.engine, {})
    out = rules.problems(mesh)
    if out:
        return out + engine_problems(eng)
    out += engine_problems(eng)
    out += trainer_problems(verl, mesh)
    out += entrypoint.mesh_problems(verl, mesh, rules)
    out += entrypoint.recipe_problems(verl, config.algo.name)
    return out


def engine_problems(eng: dict) -> list[Problem]:
    rec = mlite.record()
    out = []
    pre = "engine"
    if get(eng, "impl_cfg.use_thd", True) is not True:
        out.append(Problem(f"{pre}.impl_cfg.use_thd", get(eng, "impl_cfg.use_thd"),
                           "the Megatron Lite engine only runs packed (THD) sequences", f"{pre}.impl_cfg.use_thd=true"))
    opt = get(eng, "impl_cfg.optimizer")
    optimizers = [v for v in rec["impl_cfg_optimizer_values"] if v is not None]
    if opt not in optimizers:
        out.append(Problem("optimizer.name", opt, f"Megatron Lite takes {' or '.join(optimizers)}",
                           f"optimizer={optimizers[-1]}"))
    rrm = get(eng, "router_replay_mode", "disabled")
    modes = rec["router_replay_modes"]
    if rrm not in modes:
        out.append(Problem(f"{pre}.router_replay_mode", rrm, f"the Megatron Lite engine supports {' or '.join(modes)}",
                           f"{pre}.router_replay_mode={modes[-1]}"))
    if get(eng, "resync_config") and get(eng, "resync_format") is None:
        out.append(Problem(f"{pre}.resync_config", get(eng, "resync_config"), "resync_config needs resync_format",
                           f"set {pre}.resync_format (e.g. block_fp8)"))
    grads, params = bool(get(eng, "grad_offload")), bool(get(eng, "param_offload"))
    if grads != params:
        # the engine offloads gradients exactly when it offloads parameters; no Megatron Lite code reads grad_offload
        out.append(Problem(f"{pre}.grad_offload", grads, f"Megatron Lite ignores it: gradients are "
                           f"{'offloaded' if params else 'kept on the GPU'} because {pre}.param_offload={params}",
                           f"set {pre}.param_offload={str(grads).lower()} to {'offload' if grads else 'keep'} "
                           f"gradients, or {pre}.grad_offload={str(params).lower()} to say what happens",
                           warning=True))
    return out


def trainer_problems(verl: dict, mesh: Mesh) -> list[Problem]:
    out = []
    for key, want, knob in (("trainer.nnodes", mesh.nnodes, "mesh.nnodes"),
                            ("trainer.n_gpus_per_node", mesh.gpus_per_node, "mesh.gpus_per_node")):
        if get(verl, key) != want:
            out.append(Problem(key, get(verl, key), f"must equal the mesh's {want}", f"set {knob} instead"))
    return out


def ppo_batch_problems(verl: dict, mesh: Mesh) -> list[Problem]:
    """verl's job-start assertions (validate_config, ActorConfig.validate), with Megatron Lite's real DP."""
    out = []
    tbs = get(verl, "data.train_batch_size")
    n = get(verl, f"{ROLLOUT}.n")
    mini = get(verl, f"{ACTOR}.ppo_mini_batch_size")
    micro = get(verl, f"{ACTOR}.ppo_micro_batch_size_per_gpu")
    dyn = bool(get(verl, f"{ACTOR}.use_dynamic_bsz"))
    for key, v in (("data.train_batch_size", tbs), (f"{ROLLOUT}.n", n), (f"{ACTOR}.ppo_mini_batch_size", mini)):
        if not isinstance(v, int) or v < 1:
            return [Problem(key, v, "must be a positive integer", f"set {key}")]
    dp, world = mesh.dp, mesh.world
    if mini > tbs:
        out.append(Problem(f"{ACTOR}.ppo_mini_batch_size", mini, f"larger than data.train_batch_size={tbs}",
                           f"{ACTOR}.ppo_mini_batch_size in {[d for d in _divs(tbs) if d <= tbs][-4:]}"))
    elif tbs % mini:
        out.append(Problem(f"{ACTOR}.ppo_mini_batch_size", mini,
                           f"must divide data.train_batch_size={tbs} (verl does not check: the remainder "
                           "prompts are dropped from every update)",
                           f"{ACTOR}.ppo_mini_batch_size in {_divs(tbs)[-4:]}"))
    if (tbs * n) % dp:
        out.append(Problem("data.train_batch_size", tbs,
                           f"train_batch_size·n = {tbs}·{n} = {tbs * n} samples do not split over dense DP={dp} "
                           f"(world {world} / tp·cp·pp {mesh.dense})",
                           f"data.train_batch_size a multiple of {dp // _gcd(dp, n)}"))
    elif (mini * n) % dp:
        out.append(Problem(f"{ACTOR}.ppo_mini_batch_size", mini,
                           f"mini batch·n = {mini}·{n} samples do not split over dense DP={dp}",
                           f"{ACTOR}.ppo_mini_batch_size a multiple of {dp // _gcd(dp, n)}"))
    if not dyn:
        if micro is None or micro < 1:
            out.append(Problem(f"{ACTOR}.ppo_micro_batch_size_per_gpu", micro,
                               "needed when use_dynamic_bsz=false", f"{ACTOR}.ppo_micro_batch_size_per_gpu=1"))
        else:
            # verl treats strategy mlite like FSDP here: every GPU is a data-parallel rank
            if (tbs * n) % world:
                out.append(Problem("data.train_batch_size", tbs,
                                   f"with use_dynamic_bsz=false verl asserts train_batch_size·n = {tbs * n} divisible "
                                   f"by all {world} GPUs (it counts strategy mlite as FSDP)",
                                   f"data.train_batch_size a multiple of {world // _gcd(world, n)}, or "
                                   f"{ACTOR}.use_dynamic_bsz=true"))
            elif (tbs * n) % (dp * micro):
                out.append(Problem(f"{ACTOR}.ppo_micro_batch_size_per_gpu", micro,
                                   f"train_batch_size·n = {tbs * n} is not divisible by DP·micro = {dp}·{micro}",
                                   f"{ACTOR}.ppo_micro_batch_size_per_gpu in "
                                   f"{[m for m in _divs(tbs * n // dp) if m <= 8]}"))
    else:
        budget = get(verl, f"{ACTOR}.ppo_max_token_len_per_gpu")
        seq = (get(verl, "data.max_prompt_length") or 0) + (get(verl, "data.max_response_length") or 0)
        if isinstance(budget, int) and seq and budget < seq:
            out.append(Problem(f"{ACTOR}.ppo_max_token_len_per_gpu", budget,
                               f"smaller than one full sequence (max_prompt_length+max_response_length = {seq})",
                               f"{ACTOR}.ppo_max_token_len_per_gpu={seq} or more"))
    return out


def algorithm_problems(verl: dict, algo: str) -> list[Problem]:
    out = []
    est = get(verl, "algorithm.adv_estimator")
    n = get(verl, f"{ROLLOUT}.n")
    if est in ("grpo", "rloo", "grpo_passk") and isinstance(n, int) and n < 2:
        out.append(Problem(f"{ROLLOUT}.n", n, f"{est} compares samples within a group: with n={n} every advantage is 0",
                           f"{ROLLOUT}.n=8 (any n >= 2)"))
    if get(verl, f"{ROLLOUT}.name") not in ("vllm", "sglang", "trtllm"):
        out.append(Problem(f"{ROLLOUT}.name", get(verl, f"{ROLLOUT}.name"), "verl rolls out with vllm, sglang or trtllm",
                           f"{ROLLOUT}.name=vllm"))
    fg = get(verl, "algorithm.filter_groups") or {}
    if fg.get("enable") and not fg.get("metric"):
        out.append(Problem("algorithm.filter_groups.metric", fg.get("metric"),
                           "dynamic sampling needs a metric to filter groups on (verl does not check)",
                           "algorithm.filter_groups.metric=acc"))
    rk = get(verl, "reward.reward_kwargs") or {}
    ob = rk.get("overlong_buffer_cfg") or {}
    manager = get(verl, "reward.reward_manager.name")
    if ob.get("enable"):
        if manager != "dapo":
            out.append(Problem("reward.reward_manager.name", manager,
                               "only verl's DAPO reward manager reads overlong_buffer_cfg: the overlong penalty would "
                               "be inert", "reward.reward_manager.name=dapo"))
        resp = get(verl, "data.max_response_length")
        max_resp = rk.get("max_resp_len")
        length = ob.get("len")
        if max_resp is None:
            out.append(Problem("reward.reward_kwargs.max_resp_len", None, "the DAPO reward manager asserts it is set",
                               f"reward.reward_kwargs.max_resp_len={resp}"))
        elif not isinstance(length, int) or length <= 0 or length > max_resp:
            out.append(Problem("reward.reward_kwargs.overlong_buffer_cfg.len", length,
                               f"must be positive and at most max_resp_len={max_resp}",
                               f"reward.reward_kwargs.overlong_buffer_cfg.len={max_resp // 2 if max_resp else 1}"))
    if algo == "dapo":
        want = {"algorithm.filter_groups.enable": True, f"{ACTOR}.loss_agg_mode": "token-mean",
                f"{ACTOR}.use_kl_loss": False, "algorithm.use_kl_in_reward": False,
                "reward.reward_manager.name": "dapo"}
        for key, v in want.items():
            if get(verl, key) != v:
                out.append(Problem(key, get(verl, key), "algo=dapo needs it for DAPO to be applied",
                                   f"{key}={str(v).lower() if isinstance(v, bool) else v}, or algo=grpo"))
        lo, hi = get(verl, f"{ACTOR}.clip_ratio_low"), get(verl, f"{ACTOR}.clip_ratio_high")
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and hi <= lo:
            out.append(Problem(f"{ACTOR}.clip_ratio_high", hi, f"DAPO's clip-higher needs clip_ratio_high > "
                               f"clip_ratio_low={lo}", f"{ACTOR}.clip_ratio_high=0.28"))
    return out


def sft_batch_problems(verl: dict, mesh: Mesh) -> list[Problem]:
    out = []
    tbs = get(verl, "data.train_batch_size")
    micro = get(verl, "data.micro_batch_size_per_gpu")
    dyn = bool(get(verl, "data.use_dynamic_bsz"))
    dp = mesh.dp
    if not isinstance(tbs, int) or tbs < 1:
        return [Problem("data.train_batch_size", tbs, "must be a positive integer", "data.train_batch_size=32")]
    if tbs % dp:
        out.append(Problem("data.train_batch_size", tbs, f"must split over dense DP={dp} "
                           f"(world {mesh.world} / tp·cp·pp {mesh.dense})", f"data.train_batch_size a multiple of {dp}"))
    elif not dyn and isinstance(micro, int) and micro > 0 and (tbs // dp) % micro:
        out.append(Problem("data.micro_batch_size_per_gpu", micro, f"must divide the per-rank batch {tbs}/{dp}",
                           f"data.micro_batch_size_per_gpu in {_divs(tbs // dp)}"))
    if get(verl, "data.pad_mode") != "no_padding":
        out.append(Problem("data.pad_mode", get(verl, "data.pad_mode"), "Megatron Lite only takes packed sequences",
                           "data.pad_mode=no_padding"))
    budget, length = get(verl, "data.max_token_len_per_gpu"), get(verl, "data.max_length")
    if dyn and isinstance(budget, int) and isinstance(length, int) and budget < length:
        out.append(Problem("data.max_token_len_per_gpu", budget, f"smaller than data.max_length={length}",
                           f"data.max_token_len_per_gpu={length}"))
    return out


def _divs(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _gcd(a: int, b: int) -> int:
    import math

    return math.gcd(a, b)

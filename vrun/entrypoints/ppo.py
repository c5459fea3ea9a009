"""PPO on Ray (GRPO, DAPO): verl.trainer.main_ppo's tree, its checks, its command."""
from __future__ import annotations

import math
from typing import Any, Optional

from vrun.core.dotted import MISSING, get
from vrun.entrypoints.base import Entrypoint
from vrun.estimate.mesh import Mesh, Rules, divisors, rollout_problems
from vrun.estimate import rollout
from vrun.estimate.rollout import MAX_NUM_SEQS, ROLLOUT, ROLLOUT_DP, ROLLOUT_TP
from vrun.estimate.steptime import MEAN_FRACTION
from vrun.core.problems import Problem
from vrun.config.schema import EntrypointName, RunConfig

ACTOR = "actor_rollout_ref.actor"
# sections of verl's tree an algorithm relies on, which not every verl has → what the algorithm loses without it
CAPABILITIES = {"algorithm.filter_groups": "dynamic sampling"}


def sequence_length(verl: dict) -> int:
    """One full sequence: the prompt and the response at their maxima (what the token budget and the rollout's
    KV cache must hold)."""
    return int((get(verl, "data.max_prompt_length") or 0) + (get(verl, "data.max_response_length") or 0))


class PPO(Entrypoint):
    name = EntrypointName.ppo
    config_name = "ppo_trainer"
    engine = f"{ACTOR}.engine"
    optim = f"{ACTOR}.optim"
    model = "actor_rollout_ref.model"
    launches = "verl.trainer.main_ppo:run_ppo"
    uses_ray = True
    linked_lengths = {"data.max_prompt_length": (f"{ROLLOUT}.prompt_length",),
                      "data.max_response_length": (f"{ROLLOUT}.response_length", "reward.reward_kwargs.max_resp_len")}
    positive_ints = ("data.train_batch_size", "data.max_prompt_length", "data.max_response_length", f"{ROLLOUT}.n",
                     f"{ACTOR}.ppo_mini_batch_size", ROLLOUT_TP, f"{ACTOR}.ppo_max_token_len_per_gpu",
                     f"{ACTOR}.ppo_micro_batch_size_per_gpu", f"{ACTOR}.ppo_epochs")
    fractions = (f"{ROLLOUT}.gpu_memory_utilization", f"{ACTOR}.clip_ratio")

    def run_problems(self, config: RunConfig) -> list[Problem]:
        """Run-config keys the RL entrypoint never reads: SFT's torchrun module."""
        from vrun.config.schema import RunSettings

        if list(config.run.sft_entry) != RunSettings().sft_entry:
            return [Problem("run.sft_entry", list(config.run.sft_entry), "SFT's module under torchrun; this run is "
                            "verl's PPO trainer on Ray: read by nothing", "drop run.sft_entry, or algo=sft",
                            warning=True)]
        return []

    def groups(self, searchpath: str, values: dict) -> list[str]:
        out = [f"hydra.searchpath=[{searchpath}]", "actor@actor_rollout_ref.actor=mlite_actor"]
        if needs_reference(values):
            out.append("ref@actor_rollout_ref.ref=mlite_ref")
        return out

    def derived(self, config: RunConfig, run_dir: str, env: dict) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        if config.run.dump_rollouts:
            out.append(("trainer.rollout_data_dir", f"{run_dir}/rollouts"))
        out += [(f"ray_kwargs.ray_init.runtime_env.env_vars.{k}", str(v)) for k, v in env.items()]
        ray = config.cluster.ray
        # a fresh local instance ("local") or a deliberate join, never an accidental one
        # cluster=ray: cluster.ray.address is the dashboard the job is submitted to; the job's driver joins the
        # cluster it runs on
        address = "auto" if str(config.cluster.name) in ("ray", "kuberay") else ray.address
        out.append(("ray_kwargs.ray_init.address", address))
        # only a fresh instance takes them: ray.init refuses num_cpus/num_gpus when it joins a running cluster (a
        # SLURM job's nodes are given them by `ray start`; vrun.checks.unread warns where nothing reads them)
        for k in ("num_cpus", "num_gpus"):
            if getattr(ray, k) is not None and address == "local":
                out.append((f"ray_kwargs.ray_init.{k}", getattr(ray, k)))
        return out

    def mesh_problems(self, verl: dict, mesh: Mesh, rules: Rules, rollout_tps: Optional[list] = None) -> list[Problem]:
        if rollout_tps is not None:  # mesh=auto picks the rollout TP from these: none left is a problem
            if not rollout_tps:
                return [Problem(ROLLOUT_TP, None, "no rollout TP fits the mesh",
                                "mesh.gpus_per_node a power of two")]
            return ppo_batch_problems(verl, mesh)
        rtp = get(verl, ROLLOUT_TP)
        return rollout_problems(mesh, rtp, rules.arch, rules.model) + ppo_batch_problems(verl, mesh)

    def recipe_problems(self, verl: dict, algo) -> list[Problem]:
        return algorithm_problems(verl, algo.name, algo.dynamic_sampling)

    def algorithm_values(self, algo, base: dict, values: dict, origin: dict,
                         verl_version: str) -> tuple[dict, list[Problem]]:
        recipe = f"recipe.{self.name.value}"
        if algo.dynamic_sampling is False:
            # DAPO without dynamic sampling: the group file's filter_groups block goes; where verl has the section,
            # it is switched off explicitly (the pass-through may still set it, and the checks then say so)
            values = {k: v for k, v in values.items()
                      if not (origin[k] == recipe and k.startswith("algorithm.filter_groups."))}
            if get(base, "algorithm.filter_groups", MISSING) is not MISSING \
                    and "algorithm.filter_groups.enable" not in values:
                values["algorithm.filter_groups.enable"] = False
                origin["algorithm.filter_groups.enable"] = "project"
        # what the algorithm's own group file sets in a section this verl lacks: one line, not one per key
        from_algo = {k for k in values if origin[k] == recipe}
        problems, lacking = [], []
        for section, loses in CAPABILITIES.items():
            if any(k.startswith(section + ".") for k in from_algo) and get(base, section, MISSING) is MISSING:
                lacking.append(section)
                problems.append(Problem("algo", algo.name, f"the installed verl {verl_version} has no {section} in "
                                        f"its config: {algo.name}'s {loses} would be read by nothing",
                                        "install verl main 1dda039b or later (it has both this and the engine fields "
                                        "Megatron Lite sets; docs/configuration.md 'Which verl'), or plan without it: "
                                        "algo.dynamic_sampling=false"))
        values = {k: v for k, v in values.items()
                  if not (k in from_algo and any(k.startswith(section + ".") for section in lacking))}
        return values, problems

    def token_inputs(self, verl: dict) -> dict:
        seq = sequence_length(verl)
        tokens = get(verl, f"{ACTOR}.ppo_max_token_len_per_gpu") if get(verl, f"{ACTOR}.use_dynamic_bsz") else \
            (get(verl, f"{ACTOR}.ppo_micro_batch_size_per_gpu") or 1) * seq
        return {"tokens_per_gpu": int(tokens or 0), "seq_len": int(seq),
                "rollout_fraction": float(get(verl, f"{ROLLOUT}.gpu_memory_utilization") or 0.0)}

    def token_budget_key(self, verl: dict) -> Optional[str]:
        return f"{ACTOR}.ppo_max_token_len_per_gpu" if get(verl, f"{ACTOR}.use_dynamic_bsz") else None

    def rollout_inputs(self, verl: dict) -> Optional[dict]:
        r = get(verl, ROLLOUT, {}) or {}
        return dict(utilization=float(r.get("gpu_memory_utilization") or 0.0), seq_len=sequence_length(verl),
                    step_sequences=int((get(verl, "data.train_batch_size") or 0) * (r.get("n") or 1)),
                    dtype=str(r.get("dtype") or "bfloat16"), quantization=r.get("quantization"),
                    kv_cache_dtype=get(r, "engine_kwargs.vllm.kv_cache_dtype"),
                    max_num_batched_tokens=int(r.get("max_num_batched_tokens") or rollout.MAX_NUM_BATCHED_TOKENS),
                    max_num_seqs=int(r.get("max_num_seqs") or rollout.MAX_NUM_SEQS),
                    enforce_eager=bool(r.get("enforce_eager")))

    def step_batch(self, verl: dict) -> dict:
        tbs = int(get(verl, "data.train_batch_size") or 0)
        n = int(get(verl, f"{ROLLOUT}.n") or 1)
        pmax = float(get(verl, "data.max_prompt_length") or 0)
        rmax = float(get(verl, "data.max_response_length") or 0)
        return dict(samples=tbs * n, prompt_mean=pmax * MEAN_FRACTION, response_mean=rmax * MEAN_FRACTION,
                    response_max=rmax, rollout=True,
                    reference=needs_reference({f"{ACTOR}.use_kl_loss": get(verl, f"{ACTOR}.use_kl_loss"),
                                               "algorithm.use_kl_in_reward": get(verl, "algorithm.use_kl_in_reward")}),
                    rollout_tp=int(get(verl, ROLLOUT_TP) or 1), rollout_dp=int(get(verl, ROLLOUT_DP) or 1),
                    max_num_seqs=int(get(verl, f"{ROLLOUT}.max_num_seqs") or MAX_NUM_SEQS))

    def mini_batch_tokens(self, verl: dict) -> float:
        tbs = int(get(verl, "data.train_batch_size") or 0)
        n = int(get(verl, f"{ROLLOUT}.n") or 1)
        mini = int(get(verl, f"{ACTOR}.ppo_mini_batch_size") or tbs) * n
        seq = (float(get(verl, "data.max_prompt_length") or 0) + float(get(verl, "data.max_response_length") or 0))
        return mini * seq * MEAN_FRACTION

    def runtime_modules(self, verl: dict) -> list[str]:
        return [get(verl, f"{ROLLOUT}.name")]

    def builds_mlite_workers(self, config: RunConfig) -> bool:
        return not config.run.task_runner

    def validate(self, verl: dict) -> None:
        from omegaconf import OmegaConf
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        config = OmegaConf.create(verl)
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))

    def batch_summary(self, verl: dict, mesh: Mesh) -> dict:
        v, m = verl, mesh
        tbs, n = get(v, "data.train_batch_size"), get(v, f"{ROLLOUT}.n")
        mini = get(v, f"{ACTOR}.ppo_mini_batch_size")
        rtp = get(v, ROLLOUT_TP)
        rdp = get(v, ROLLOUT_DP) or 1
        return {"train_batch_size": tbs, "n": n, "samples_per_step": tbs * n, "mini_batch_size": mini,
                "updates_per_step": tbs // mini, "samples_per_dp_rank": tbs * n // m.dp,
                "dynamic_bsz": get(v, f"{ACTOR}.use_dynamic_bsz"),
                "max_token_len_per_gpu": get(v, f"{ACTOR}.ppo_max_token_len_per_gpu"),
                "prompt_length": get(v, "data.max_prompt_length"), "response_length": get(v, "data.max_response_length"),
                "rollout": {"engine": get(v, f"{ROLLOUT}.name"), "tp": rtp, "dp": rdp, "replicas": m.world // (rtp * rdp),
                            "gpu_memory_utilization": get(v, f"{ROLLOUT}.gpu_memory_utilization")}}

    def batch_rows(self, b: dict) -> list[str]:
        r = b["rollout"]
        return [
            f"batch   {b['train_batch_size']} prompts × n {b['n']} = {b['samples_per_step']} samples/step; "
            f"mini {b['mini_batch_size']} → {b['updates_per_step']} update(s)/step; "
            f"{b['samples_per_dp_rank']} samples per DP rank",
            f"tokens  prompt {b['prompt_length']} + response {b['response_length']}; dynamic bsz "
            f"{b['dynamic_bsz']}, {b['max_token_len_per_gpu']} tokens/GPU",
            f"rollout {r['engine']} TP{r['tp']}·DP{r['dp']} × {r['replicas']} replicas, gpu_memory_utilization "
            f"{r['gpu_memory_utilization']}",
        ]

    def recipe_rows(self, verl: dict, algo) -> list[str]:
        return [f"dapo    {dapo_parts(verl)}"] if algo.name == "dapo" else []

    def command(self, config: RunConfig, run_dir: str, mesh: Mesh, python: str) -> list[str]:
        argv = [python, "-m", "vrun.launch.entry", "ppo", "--config", f"{run_dir}/verl_config.yaml"]
        if config.run.task_runner:
            argv += ["--task-runner", config.run.task_runner]
        for name in config.pass_env:
            argv += ["--pass-env", name]
        return argv


def needs_reference(values: dict) -> bool:
    """verl builds a reference policy when the KL loss or the KL reward is on."""
    return bool(values.get(f"{ACTOR}.use_kl_loss")) or bool(values.get("algorithm.use_kl_in_reward"))


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
                           f"{ACTOR}.ppo_mini_batch_size in {[d for d in divisors(tbs) if d <= tbs][-4:]}"))
    elif tbs % mini:
        out.append(Problem(f"{ACTOR}.ppo_mini_batch_size", mini,
                           f"must divide data.train_batch_size={tbs} (verl does not check: the remainder "
                           "prompts are dropped from every update)",
                           f"{ACTOR}.ppo_mini_batch_size in {divisors(tbs)[-4:]}"))
    if (tbs * n) % dp:
        out.append(Problem("data.train_batch_size", tbs,
                           f"train_batch_size·n = {tbs}·{n} = {tbs * n} samples do not split over dense DP={dp} "
                           f"(world {world} / tp·cp·pp {mesh.dense})",
                           f"data.train_batch_size a multiple of {dp // math.gcd(dp, n)}"))
    elif (mini * n) % dp:
        out.append(Problem(f"{ACTOR}.ppo_mini_batch_size", mini,
                           f"mini batch·n = {mini}·{n} samples do not split over dense DP={dp}",
                           f"{ACTOR}.ppo_mini_batch_size a multiple of {dp // math.gcd(dp, n)}"))
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
                                   f"data.train_batch_size a multiple of {world // math.gcd(world, n)}, or "
                                   f"{ACTOR}.use_dynamic_bsz=true"))
            elif (tbs * n) % (dp * micro):
                out.append(Problem(f"{ACTOR}.ppo_micro_batch_size_per_gpu", micro,
                                   f"train_batch_size·n = {tbs * n} is not divisible by DP·micro = {dp}·{micro}",
                                   f"{ACTOR}.ppo_micro_batch_size_per_gpu in "
                                   f"{[m for m in divisors(tbs * n // dp) if m <= 8]}"))
    else:
        budget = get(verl, f"{ACTOR}.ppo_max_token_len_per_gpu")
        seq = sequence_length(verl)
        # the micro-batch's budget is budget·CP (verl_mlite passes sp_size = CP; verl/workers/engine/utils.py
        # prepare_micro_batches), and verl asserts one sequence fits it (utils/seqlen_balancing.py)
        if isinstance(budget, int) and seq and budget * mesh.cp < seq:
            least = -(-seq // mesh.cp)
            out.append(Problem(f"{ACTOR}.ppo_max_token_len_per_gpu", budget,
                               f"times CP {mesh.cp} smaller than one full sequence "
                               f"(max_prompt_length+max_response_length = {seq})",
                               f"verl.{ACTOR}.ppo_max_token_len_per_gpu={least} or more"))
    return out


def dapo_parts(verl: dict) -> str:
    """Which of DAPO's four parts the verl config applies, in one line."""
    g = get
    a = ACTOR
    ob = g(verl, "reward.reward_kwargs.overlong_buffer_cfg") or {}
    shaping = ob.get("enable") and g(verl, "reward.reward_manager.name") == "dapo"
    return "; ".join([
        f"dynamic sampling {'on (' + str(g(verl, 'algorithm.filter_groups.metric')) + ')' if g(verl, 'algorithm.filter_groups.enable') else 'OFF'}",
        f"clip-higher {g(verl, a + '.clip_ratio_low')}/{g(verl, a + '.clip_ratio_high')}",
        f"loss {g(verl, a + '.loss_agg_mode')}",
        "no KL" if not (g(verl, a + ".use_kl_loss") or g(verl, "algorithm.use_kl_in_reward")) else "KL ON",
        f"overlong shaping {'last ' + str(ob.get('len')) + ' of ' + str(g(verl, 'reward.reward_kwargs.max_resp_len')) + ' tokens' if shaping else 'OFF'}",
    ])


def algorithm_problems(verl: dict, algo: str, dynamic_sampling: Optional[bool] = None) -> list[Problem]:
    out = []
    est = get(verl, "algorithm.adv_estimator")
    n = get(verl, f"{ROLLOUT}.n")
    if est in ("grpo", "rloo", "grpo_passk") and isinstance(n, int) and n < 2:
        out.append(Problem(f"{ROLLOUT}.n", n, f"{est} compares samples within a group: with n={n} every advantage is 0",
                           f"{ROLLOUT}.n=8 (any n >= 2)"))
    if est == "gae" and not get(verl, "critic.enable"):
        out.append(Problem("algorithm.adv_estimator", est, "GAE takes its advantages from a critic's values and "
                           "critic.enable is off (Megatron Lite builds no critic): verl would fail at the first step",
                           "verl.algorithm.adv_estimator=grpo (or reinforce_plus_plus: no critic)"))
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
    if dynamic_sampling is not None and algo != "dapo":
        out.append(Problem("algo.dynamic_sampling", dynamic_sampling, f"only DAPO samples dynamically: it does nothing "
                           f"for algo={algo}", "drop algo.dynamic_sampling, or algo=dapo", warning=True))
    if algo == "dapo":
        want = {f"{ACTOR}.loss_agg_mode": "token-mean", f"{ACTOR}.use_kl_loss": False,
                "algorithm.use_kl_in_reward": False, "reward.reward_manager.name": "dapo"}
        if dynamic_sampling is not False:
            want["algorithm.filter_groups.enable"] = True
        elif fg.get("enable"):
            out.append(Problem("algorithm.filter_groups.enable", True, "algo.dynamic_sampling=false says DAPO runs "
                               "without dynamic sampling", "drop it, or algo.dynamic_sampling=true"))
        else:
            out.append(Problem("algo.dynamic_sampling", False, "DAPO without dynamic sampling: groups whose samples "
                               "all score alike stay in the batch (zero advantage); clip-higher, token-mean loss, no "
                               "KL and overlong reward shaping stay on", "algo.dynamic_sampling=true on a verl that "
                               "has algorithm.filter_groups (PyPI 0.9.1, verl main 1dda039b)", warning=True))
        for key, v in want.items():
            if get(verl, key) != v:
                alt = ", algo.dynamic_sampling=false to plan DAPO without it" if key.startswith("algorithm.filter") \
                    else ""
                out.append(Problem(key, get(verl, key), "algo=dapo needs it for DAPO to be applied",
                                   f"{key}={str(v).lower() if isinstance(v, bool) else v}{alt}, or algo=grpo"))
        lo, hi = get(verl, f"{ACTOR}.clip_ratio_low"), get(verl, f"{ACTOR}.clip_ratio_high")
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and hi <= lo:
            out.append(Problem(f"{ACTOR}.clip_ratio_high", hi, f"DAPO's clip-higher needs clip_ratio_high > "
                               f"clip_ratio_low={lo}", f"{ACTOR}.clip_ratio_high=0.28"))
    return out

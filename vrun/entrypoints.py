"""One record per verl entrypoint: PPO on Ray (GRPO, DAPO) and SFT under torchrun.

Each says where its keys live in verl's tree, which verl config and groups it composes, its batch checks,
what the memory estimate reads from its tree, its batch summary and its command. The plan looks the record up
once (`of(config)`); no other module branches on the entrypoint's name.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from vrun import checks
from vrun.dotted import get
from vrun.mesh import Mesh, Rules, rollout_problems
from vrun.problems import Problem
from vrun.schema import EntrypointName, RunConfig

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"


class Entrypoint:
    name: EntrypointName
    # verl's config tree (under <verl>/trainer/config)
    config_name: str
    # where the engine, optimizer and model blocks live in that tree
    engine: str
    optim: str
    model: str
    # what the command runs (plan.json "entrypoint")
    launches: str
    # on SLURM: a Ray cluster over the nodes (the driver on node 0), or the command itself on every node
    uses_ray: bool

    def groups(self, searchpath: str, values: dict) -> list[str]:
        """verl group choices: Megatron Lite's config groups from `searchpath`."""
        raise NotImplementedError

    def derived(self, config: RunConfig, run_dir: str, env: dict) -> list[tuple[str, Any]]:
        """verl keys the project sets for this entrypoint beyond the shared ones."""
        return []

    def mesh_problems(self, verl: dict, mesh: Mesh, rules: Rules) -> list[Problem]:
        """The checks besides the mesh rules that depend on the mesh (what mesh=auto filters on)."""
        raise NotImplementedError

    def recipe_problems(self, verl: dict, algo: str) -> list[Problem]:
        """The checks that do not depend on the mesh."""
        return []

    def token_inputs(self, verl: dict) -> dict:
        """tokens_per_gpu and rollout_fraction for the memory estimate."""
        raise NotImplementedError

    def runtime_modules(self, verl: dict) -> list[str]:
        """Python modules the run imports besides verl, verl_mlite and the model's own."""
        return []

    def builds_mlite_workers(self, config: RunConfig) -> bool:
        """Whether verl's own code builds Megatron Lite workers (a custom task runner may not)."""
        return True

    def validate(self, verl: dict) -> None:
        """verl's own job-start validation of the tree, where verl has one (raises what verl raises)."""

    def batch_summary(self, verl: dict, mesh: Mesh) -> dict:
        raise NotImplementedError

    def batch_rows(self, b: dict) -> list[str]:
        """The plan table's batch lines."""
        raise NotImplementedError

    def command(self, config: RunConfig, run_dir: str, mesh: Mesh, python: str) -> list[str]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"Entrypoint({self.name.value})"


class PPO(Entrypoint):
    name = EntrypointName.ppo
    config_name = "ppo_trainer"
    engine = f"{ACTOR}.engine"
    optim = f"{ACTOR}.optim"
    model = "actor_rollout_ref.model"
    launches = "verl.trainer.main_ppo:run_ppo"
    uses_ray = True

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
        out.append(("ray_kwargs.ray_init.address", ray.address))
        for k in ("num_cpus", "num_gpus"):
            if getattr(ray, k) is not None:
                out.append((f"ray_kwargs.ray_init.{k}", getattr(ray, k)))
        return out

    def mesh_problems(self, verl: dict, mesh: Mesh, rules: Rules) -> list[Problem]:
        rtp = get(verl, f"{ROLLOUT}.tensor_model_parallel_size")
        return rollout_problems(mesh, rtp, rules.arch, rules.model) + checks.ppo_batch_problems(verl, mesh)

    def recipe_problems(self, verl: dict, algo: str) -> list[Problem]:
        return checks.algorithm_problems(verl, algo)

    def token_inputs(self, verl: dict) -> dict:
        seq = (get(verl, "data.max_prompt_length") or 0) + (get(verl, "data.max_response_length") or 0)
        tokens = get(verl, f"{ACTOR}.ppo_max_token_len_per_gpu") if get(verl, f"{ACTOR}.use_dynamic_bsz") else \
            (get(verl, f"{ACTOR}.ppo_micro_batch_size_per_gpu") or 1) * seq
        return {"tokens_per_gpu": int(tokens or 0),
                "rollout_fraction": float(get(verl, f"{ROLLOUT}.gpu_memory_utilization") or 0.0)}

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
        rtp = get(v, f"{ROLLOUT}.tensor_model_parallel_size")
        return {"train_batch_size": tbs, "n": n, "samples_per_step": tbs * n, "mini_batch_size": mini,
                "updates_per_step": tbs // mini, "samples_per_dp_rank": tbs * n // m.dp,
                "dynamic_bsz": get(v, f"{ACTOR}.use_dynamic_bsz"),
                "max_token_len_per_gpu": get(v, f"{ACTOR}.ppo_max_token_len_per_gpu"),
                "prompt_length": get(v, "data.max_prompt_length"), "response_length": get(v, "data.max_response_length"),
                "rollout": {"engine": get(v, f"{ROLLOUT}.name"), "tp": rtp, "replicas": m.world // rtp,
                            "gpu_memory_utilization": get(v, f"{ROLLOUT}.gpu_memory_utilization")}}

    def batch_rows(self, b: dict) -> list[str]:
        r = b["rollout"]
        return [
            f"batch   {b['train_batch_size']} prompts × n {b['n']} = {b['samples_per_step']} samples/step; "
            f"mini {b['mini_batch_size']} → {b['updates_per_step']} update(s)/step; "
            f"{b['samples_per_dp_rank']} samples per DP rank",
            f"tokens  prompt {b['prompt_length']} + response {b['response_length']}; dynamic bsz "
            f"{b['dynamic_bsz']}, {b['max_token_len_per_gpu']} tokens/GPU",
            f"rollout {r['engine']} TP{r['tp']} × {r['replicas']} replicas, gpu_memory_utilization "
            f"{r['gpu_memory_utilization']}",
        ]

    def command(self, config: RunConfig, run_dir: str, mesh: Mesh, python: str) -> list[str]:
        argv = [python, "-m", "vrun.entry", "ppo", "--config", f"{run_dir}/verl_config.yaml"]
        if config.run.task_runner:
            argv += ["--task-runner", config.run.task_runner]
        for name in config.pass_env:
            argv += ["--pass-env", name]
        return argv


class SFT(Entrypoint):
    name = EntrypointName.sft
    config_name = "sft_trainer_engine"
    engine = "engine"
    optim = "optim"
    model = "model"
    launches = "verl.trainer.sft_trainer (torchrun, verl_mlite.launch)"
    uses_ray = False

    def groups(self, searchpath: str, values: dict) -> list[str]:
        return [f"hydra.searchpath=[{searchpath}]", "engine=mlite", "optim=megatron"]

    def mesh_problems(self, verl: dict, mesh: Mesh, rules: Rules) -> list[Problem]:
        return checks.sft_batch_problems(verl, mesh)

    def token_inputs(self, verl: dict) -> dict:
        tokens = get(verl, "data.max_token_len_per_gpu") if get(verl, "data.use_dynamic_bsz") else \
            (get(verl, "data.micro_batch_size_per_gpu") or 1) * (get(verl, "data.max_length") or 0)
        return {"tokens_per_gpu": int(tokens or 0), "rollout_fraction": 0.0}

    def batch_summary(self, verl: dict, mesh: Mesh) -> dict:
        v = verl
        tbs = get(v, "data.train_batch_size")
        return {"train_batch_size": tbs, "per_dp_rank": tbs // mesh.dp, "micro_batch_size_per_gpu":
                get(v, "data.micro_batch_size_per_gpu"), "dynamic_bsz": get(v, "data.use_dynamic_bsz"),
                "max_token_len_per_gpu": get(v, "data.max_token_len_per_gpu"), "max_length": get(v, "data.max_length")}

    def batch_rows(self, b: dict) -> list[str]:
        return [f"batch   {b['train_batch_size']} sequences/step, {b['per_dp_rank']} per DP rank; dynamic bsz "
                f"{b['dynamic_bsz']}, {b['max_token_len_per_gpu']} tokens/GPU, max_length {b['max_length']}"]

    def command(self, config: RunConfig, run_dir: str, mesh: Mesh, python: str) -> list[str]:
        return torchrun_argv(python, config.run.sft_entry, run_dir, nnodes=mesh.nnodes,
                             nproc_per_node=mesh.gpus_per_node, node_rank=0, master_addr="127.0.0.1",
                             master_port=config.cluster.master_port)


def torchrun_argv(python: str, module: list, run_dir: str, *, nnodes: int, nproc_per_node: int, node_rank: int,
                  master_addr: str, master_port: int) -> list[str]:
    """torchrun over `module` (python -m ...) on verl's SFT config in the run dir; SLURM nodes call it with
    their own rank and the head's address."""
    torchrun = Path(python).parent / "torchrun"
    return [str(torchrun) if torchrun.exists() else "torchrun", "--nnodes", str(nnodes),
            "--nproc_per_node", str(nproc_per_node), "--node_rank", str(node_rank),
            "--master_addr", master_addr, "--master_port", str(master_port),
            "-m", *module, "--config-path", run_dir, "--config-name", "verl_config",
            f"hydra.run.dir={run_dir}/sft", "hydra.output_subdir=null"]


def needs_reference(values: dict) -> bool:
    """verl builds a reference policy when the KL loss or the KL reward is on."""
    return bool(values.get(f"{ACTOR}.use_kl_loss")) or bool(values.get("algorithm.use_kl_in_reward"))


ENTRYPOINTS: dict[EntrypointName, Entrypoint] = {EntrypointName.ppo: PPO(), EntrypointName.sft: SFT()}


def of(config: RunConfig) -> Entrypoint:
    return ENTRYPOINTS[config.algo.entrypoint]

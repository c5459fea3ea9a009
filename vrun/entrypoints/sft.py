"""SFT under torchrun: verl.trainer.sft_trainer's tree, its checks, its command (also each SLURM node's)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from vrun.core.dotted import get
from vrun.entrypoints.base import Entrypoint
from vrun.estimate.mesh import Mesh, Rules, divisors
from vrun.estimate.steptime import MEAN_FRACTION
from vrun.core.problems import Problem
from vrun.config.schema import EntrypointName, RunConfig
from vrun.core import fs, hydra_text


class SFT(Entrypoint):
    name = EntrypointName.sft
    config_name = "sft_trainer_engine"
    engine = "engine"
    optim = "optim"
    model = "model"
    launches = "verl.trainer.sft_trainer (torchrun, verl_mlite.launch)"
    uses_ray = False
    positive_ints = ("data.train_batch_size", "data.micro_batch_size_per_gpu", "data.max_length")

    def builds_mlite_workers(self, config: RunConfig) -> bool:
        """run.sft_entry replaced by another module: that module decides what it needs."""
        return list(config.run.sft_entry)[:1] == ["verl_mlite.launch"]

    def groups(self, searchpath: str, values: dict) -> list[str]:
        return [f"hydra.searchpath=[{searchpath}]", "engine=mlite", "optim=megatron"]

    def mesh_problems(self, verl: dict, mesh: Mesh, rules: Rules, rollout_tps: Optional[list] = None) -> list[Problem]:
        return sft_batch_problems(verl, mesh)

    def token_inputs(self, verl: dict) -> dict:
        tokens = get(verl, "data.max_token_len_per_gpu") if get(verl, "data.use_dynamic_bsz") else \
            (get(verl, "data.micro_batch_size_per_gpu") or 1) * (get(verl, "data.max_length") or 0)
        return {"tokens_per_gpu": int(tokens or 0), "seq_len": int(get(verl, "data.max_length") or 0),
                "rollout_fraction": 0.0}

    def token_budget_key(self, verl: dict) -> Optional[str]:
        return "data.max_token_len_per_gpu" if get(verl, "data.use_dynamic_bsz") else None

    def step_batch(self, verl: dict) -> dict:
        """No rollout: the sequence is the data's (prompt_mean carries all of it)."""
        seq = float(get(verl, "data.max_length") or 0) * MEAN_FRACTION
        return dict(samples=int(get(verl, "data.train_batch_size") or 0), prompt_mean=seq, response_mean=0.0,
                    response_max=0.0, rollout=False,
                    mean_source=f"mean sequence = {MEAN_FRACTION:g} × data.max_length (assumed)")

    def mini_batch_tokens(self, verl: dict) -> float:
        """One update per step: the whole batch."""
        return int(get(verl, "data.train_batch_size") or 0) * float(get(verl, "data.max_length") or 0) * MEAN_FRACTION

    def run_problems(self, config: RunConfig) -> list[Problem]:
        """Run-config keys SFT never reads: rollouts, DAPO's dynamic sampling, and Ray (SFT runs under torchrun)."""
        from dataclasses import fields

        from vrun.config.schema import RayCfg

        out = []
        if config.run.dump_rollouts:
            out.append(Problem("run.dump_rollouts", True, "SFT has no rollouts: read by nothing",
                               "drop it, or algo=grpo|dapo", warning=True))
        if config.algo.dynamic_sampling is not None:
            out.append(Problem("algo.dynamic_sampling", config.algo.dynamic_sampling, "SFT samples nothing: read by "
                               "nothing", "drop it, or algo=dapo", warning=True))
        if config.run.task_runner:
            out.append(Problem("run.task_runner", config.run.task_runner, "a Ray task runner for verl's PPO trainer; "
                               "SFT runs under torchrun: read by nothing", "drop run.task_runner, or algo=grpo|dapo",
                               warning=True))
        default = RayCfg()
        address = "auto" if str(config.cluster.name) == "slurm" else "local"  # the cluster group's own value
        for f in fields(RayCfg):
            if f.name == "interface" and str(config.cluster.name) == "slurm":
                continue  # a SLURM node's torchrun takes its rendezvous address from it (torchrun_node)
            v = getattr(config.cluster.ray, f.name)
            if v != (address if f.name == "address" else getattr(default, f.name)):
                out.append(Problem(f"cluster.ray.{f.name}", v, "SFT runs under torchrun, not Ray: read by nothing",
                                   f"drop cluster.ray.{f.name}, or algo=grpo|dapo", warning=True))
        return out

    def batch_summary(self, verl: dict, mesh: Mesh) -> dict:
        v = verl
        tbs = get(v, "data.train_batch_size")
        return {"train_batch_size": tbs, "per_dp_rank": tbs // mesh.dp, "micro_batch_size_per_gpu":
                get(v, "data.micro_batch_size_per_gpu"), "dynamic_bsz": get(v, "data.use_dynamic_bsz"),
                "max_token_len_per_gpu": get(v, "data.max_token_len_per_gpu"), "max_length": get(v, "data.max_length")}

    def batch_rows(self, b: dict) -> list[str]:
        return [f"batch   {b['train_batch_size']} sequences/step, {b['per_dp_rank']} per DP rank; dynamic bsz "
                f"{b['dynamic_bsz']}, {b['max_token_len_per_gpu']} tokens/GPU, max_length {b['max_length']}"]

    def run_dir_problems(self, run_dir: str, key: str) -> list[Problem]:
        """verl's SFT trainer reads its run dir from its own Hydra command line (torchrun_argv): written there as
        a quoted literal, it must read back as itself (Hydra's parser, then OmegaConf's resolution)."""
        if hydra_text.reads_back(run_dir + "/sft"):
            return []
        return [Problem(key, run_dir, "verl's SFT command line (Hydra's override grammar) cannot give this path "
                        "back as written: a backslash right before '${' makes it an interpolation there",
                        f"{key}=<the path without a backslash before '${{'>")]

    def command(self, config: RunConfig, run_dir: str, mesh: Mesh, python: str) -> list[str]:
        return torchrun_argv(python, config.run.sft_entry, run_dir, nnodes=mesh.nnodes,
                             nproc_per_node=mesh.gpus_per_node, node_rank=0, master_addr="127.0.0.1",
                             master_port=config.cluster.master_port)


def torchrun_argv(python: str, module: list, run_dir: str, *, nnodes: int, nproc_per_node: int, node_rank: int,
                  master_addr: str, master_port: int) -> list[str]:
    """torchrun over `module` (python -m ...) on verl's SFT config in the run dir; SLURM nodes call it with
    their own rank and the head's address."""
    torchrun = Path(python).parent / "torchrun"
    return [str(torchrun) if fs.exists(torchrun) else "torchrun", "--nnodes", str(nnodes),
            "--nproc_per_node", str(nproc_per_node), "--node_rank", str(node_rank),
            "--master_addr", master_addr, "--master_port", str(master_port),
            "-m", *module, "--config-path", run_dir, "--config-name", "verl_config",
            f"hydra.run.dir={hydra_text.literal(run_dir + '/sft')}", "hydra.output_subdir=null"]


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
                           f"data.micro_batch_size_per_gpu in {divisors(tbs // dp)}"))
    if get(verl, "data.pad_mode") != "no_padding":
        out.append(Problem("data.pad_mode", get(verl, "data.pad_mode"), "Megatron Lite only takes packed sequences",
                           "data.pad_mode=no_padding"))
    budget, length = get(verl, "data.max_token_len_per_gpu"), get(verl, "data.max_length")
    if dyn and isinstance(budget, int) and isinstance(length, int) and budget < length:
        out.append(Problem("data.max_token_len_per_gpu", budget, f"smaller than data.max_length={length}",
                           f"data.max_token_len_per_gpu={length}"))
    return out

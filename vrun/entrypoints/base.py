"""What every entrypoint's record says (vrun.entrypoints.ppo and .sft fill it in)."""
from __future__ import annotations

from typing import Any, Optional

from vrun.estimate.mesh import Mesh, Rules
from vrun.core.problems import Problem
from vrun.config.schema import EntrypointName, RunConfig


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
    # lengths with one source: a data key → the keys of this tree that repeat it (the plan sets them from it and
    # refuses a tree where they differ); conf/data and conf/algo interpolate them
    linked_lengths: dict[str, tuple[str, ...]] = {}
    # keys of this tree with a range verl (or its first step) enforces: positive integers, fractions in (0, 1]
    # (vrun.checks.values.range_problems; the trainer's and the optimizer block's are checked for every tree)
    positive_ints: tuple[str, ...] = ()
    fractions: tuple[str, ...] = ()

    def groups(self, searchpath: str, values: dict) -> list[str]:
        """verl group choices: Megatron Lite's config groups from `searchpath`."""
        raise NotImplementedError

    def derived(self, config: RunConfig, run_dir: str, env: dict) -> list[tuple[str, Any]]:
        """verl keys the project sets for this entrypoint beyond the shared ones."""
        return []

    def mesh_problems(self, verl: dict, mesh: Mesh, rules: Rules, rollout_tps: Optional[list] = None) -> list[Problem]:
        """The checks besides the mesh rules that depend on the mesh (what mesh=auto filters on). rollout_tps: the
        rollout (TP, DP) choices mesh=auto may pick from instead of the configured rollout TP."""
        raise NotImplementedError

    def recipe_problems(self, verl: dict, algo) -> list[Problem]:
        """The checks that do not depend on the mesh (algo: the config's algo group, vrun.config.schema.Algo)."""
        return []

    def algorithm_values(self, algo, base: dict, values: dict, origin: dict,
                         verl_version: str) -> tuple[dict, list[Problem]]:
        """What the algorithm changes in the values bound for verl's tree before they become overrides (algo: the
        config's algo group; base: verl's composed tree; origin: key → which block set it, `recipe.<name>` for the
        group files) and the problems it finds with the installed verl."""
        return values, []

    def token_inputs(self, verl: dict) -> dict:
        """tokens_per_gpu, seq_len (the longest sequence) and rollout_fraction for the memory estimate."""
        raise NotImplementedError

    def token_budget_key(self, verl: dict) -> Optional[str]:
        """The verl key of the per-GPU token budget of a training micro-batch, when the batch is sized in tokens
        (dynamic batch size); None otherwise."""
        return None

    def rollout_inputs(self, verl: dict) -> Optional[dict]:
        """The rollout phase's inputs from the tree (vrun.estimate.rollout's: utilization, seq_len, step_sequences,
        dtype, quantization, kv_cache_dtype), or None when the entrypoint generates nothing before it trains (then
        there is no rollout estimate, no rollout TP for mesh=auto to choose and no rollout phase in the step)."""
        return None

    def step_batch(self, verl: dict) -> dict:
        """The step's batch as the step-time estimate reads it (vrun.estimate.steptime.Workload's fields):
        samples, mean and longest lengths, whether a rollout generates them (with its replica's TP, DP and
        sequence cap) and whether a reference pass runs."""
        raise NotImplementedError

    def mini_batch_tokens(self, verl: dict) -> float:
        """Tokens of one mini-batch (one optimizer update) at the step's mean lengths."""
        raise NotImplementedError

    def run_problems(self, config: RunConfig) -> list[Problem]:
        """Settings of the run config this entrypoint reads nothing of (warnings)."""
        return []

    def typed_problems(self, overrides: list[str]) -> list[Problem]:
        """Overrides typed on the command line that this entrypoint never reads (warnings): another entrypoint's
        recipe block (the data groups fill both, so only what was typed is said)."""
        from vrun.config.schema import EntrypointName

        algos = {"ppo": "algo=grpo|dapo", "sft": "algo=sft"}
        out = []
        for text in overrides:
            key, _, value = text.lstrip("+~").partition("=")
            other = next((e.value for e in EntrypointName if e != self.name and key.startswith(f"recipe.{e.value}.")),
                         None)
            if other:
                out.append(Problem(key, value, f"recipe.{other}.* is read by the {other} entrypoint; this run "
                                   f"({self.name.value}) reads recipe.{self.name.value}.* only: read by nothing",
                                   f"recipe.{self.name.value}.{key.split('.', 2)[2]}={value}, or "
                                   f"{algos.get(other, 'another algo')}", warning=True))
        return out

    def run_dir_problems(self, run_dir: str, key: str) -> list[Problem]:
        """The run dir as this entrypoint's command line reads it (none reads it from text by default)."""
        return []

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

    def recipe_rows(self, verl: dict, algo) -> list[str]:
        """The plan table's lines on what the algorithm applies (algo: vrun.config.schema.Algo)."""
        return []

    def command(self, config: RunConfig, run_dir: str, mesh: Mesh, python: str) -> list[str]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"Entrypoint({self.name.value})"

"""Parity: each run config hands verl the same resolved config as the shell launcher it replaces.

The launcher side is composed by Hydra's own compose API from the installed verl's config dir with the
launcher's override strings (tests/launchers.py), exactly as `python -m verl.trainer.main_ppo ...` would;
the project side is the run config composed from conf/ and planned by vrun.planning.plan.make_plan. The two trees
are compared leaf by leaf; only the differences in DELIBERATE are taken out, and every other difference
fails the test with its key and both values.
"""
from __future__ import annotations

import copy
import importlib.util
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import launchers
from vrun.compose import mlite
from vrun.planning import plan
from vrun.config import schema

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

# A fixed HOME for both sides: the launchers expand $HOME in the shell, the project reads ${oc.env:HOME}.
# It need not exist; nothing reads the data files at plan time.
HOME = "/home/parity"

OPTIMIZERS = ["fsdp2", "dist_opt"]

# Keys where the project departs from the launchers on purpose (removed from both trees before comparing;
# a key's whole subtree goes with it).
DELIBERATE = {
    "trainer.default_local_dir":
        "the project writes checkpoints under its run dir, not under the launch directory",
    "ray_kwargs.ray_init.runtime_env.env_vars":
        "the project carries its env vars to Ray workers explicitly instead of relying on the launching shell",
    "ray_kwargs.ray_init.address":
        "the project starts a fresh local Ray (or joins a named one) deliberately instead of whatever is running",
    "actor_rollout_ref.actor.engine.model_name":
        "the project pins the Megatron Lite model family instead of `auto` (guessed from the checkpoint)",
    "engine.model_name":
        "the same pin for the SFT trainer's engine",
}

# Per launcher: keys where the project departs from that launcher on purpose
DELIBERATE_FOR = {
    launcher: {
        "actor_rollout_ref.rollout.tensor_model_parallel_size":
            "the launcher's rollout TP2 cannot hold the model's weights: the project's replica is TP8·DP8·EP64",
        "actor_rollout_ref.rollout.data_parallel_size": "the same rollout replica (DP8)",
        "actor_rollout_ref.rollout.expert_parallel_size": "the same rollout replica (EP = TP·DP = 64)",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu":
            "verl's 16384 tokens per GPU, which the launcher leaves, puts the measured step over 80 GiB: 10240",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "follows the actor's budget (verl's interpolation)",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "follows the actor's budget (verl's interpolation)",
    } for launcher in ("kimi_k2_6_grpo", "glm5_1_grpo")
}

# Shown for a key one tree has and the other lacks
ABSENT = "<absent>"


# ---------------------------------------------------------------- composing


@contextmanager
def _hydra_at(config_dir: Path) -> Iterator[None]:
    """Hydra initialised on one config dir, with no global state leaking in or out."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            yield
    finally:
        GlobalHydra.instance().clear()


def compose_plain(config_dir: Path, config_name: str, overrides: list[str]) -> dict:
    """Compose with Hydra's compose API and resolve every interpolation into plain containers."""
    with _hydra_at(config_dir):
        cfg = compose(config_name=config_name, overrides=overrides)
        return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture(scope="module")
def verl_config_dir() -> Path:
    """The installed verl's own trainer/config, located without importing verl (that takes seconds)."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations, "verl is not installed in this Python"
    return Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"


@pytest.fixture(autouse=True)
def fixed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same HOME on both sides (MLITE_ROOT is left as the user has it: both sides search the same package)."""
    monkeypatch.setenv("HOME", HOME)


def launcher_tree(verl_config_dir: Path, launcher: tuple[str, list[str]], searchpath: str) -> dict:
    """The launcher's config, searching the same verl_mlite config package as the plan did: the real one
    (`pkg://verl_mlite.config`, the launchers' own string) with MLITE_ROOT, the project's record without."""
    config_name, overrides = launcher
    overrides = [f"hydra.searchpath=[{searchpath}]" if o == launchers.MLITE_SEARCHPATH else o for o in overrides]
    return compose_plain(verl_config_dir, config_name, overrides)


def project_tree(command: list[str], path_env: str, model_path: str, run_dir: Path) -> tuple[dict, str]:
    from hydra_plugins.vrun_launcher.vrun_launcher import register

    register()
    cfg = compose_plain(CONF_DIR, "run", command)
    p = plan.make_plan(schema.typed(cfg), str(run_dir), environ={"HOME": HOME, path_env: model_path})
    # the plan uses the real package exactly when the environment provides one
    assert p.mlite.kind == ("verl_mlite" if mlite.find_source().location else "record"), p.mlite
    return p.verl, p.mlite.searchpath


# ---------------------------------------------------------------- comparing


def without(tree: dict, keys) -> dict:
    """A copy of tree with each dotted key (and its subtree) removed where present, and the containers that
    removal left empty."""
    out = copy.deepcopy(tree)
    for key in keys:
        *parents, leaf = key.split(".")
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node.pop(leaf)
            _prune(out, parents)
    return out


def _prune(tree: dict, parents: list[str]) -> None:
    """Drop the containers a removal left empty (a verl whose tree lacks the parent has none to compare)."""
    while parents:
        node: Any = tree
        for part in parents[:-1]:
            node = node[part]
        if node[parents[-1]] != {}:
            return
        node.pop(parents[-1])
        parents = parents[:-1]


def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key → value; lists and empty dicts are leaves, so a section dropped on one side still shows."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: tree}


def same(a: Any, b: Any) -> bool:
    """Equal values of the same type: verl's dataclasses see 1 and 1.0, or 1 and True, differently."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def diff(launcher: dict, project: dict) -> list[tuple[str, Any, Any]]:
    """(dotted key, launcher value, project value) for every leaf that differs."""
    a, b = leaves(launcher), leaves(project)
    out = []
    for key in sorted(a.keys() | b.keys()):
        x, y = a.get(key, ABSENT), b.get(key, ABSENT)
        if not same(x, y):
            out.append((key, x, y))
    return out


def assert_parity(verl_config_dir: Path, launcher: tuple[str, list[str]], command: list[str], path_env: str,
                  model_path: str, run_dir: Path, deliberate: dict = DELIBERATE) -> None:
    tree, searchpath = project_tree(command, path_env, model_path, run_dir)
    ours = without(tree, deliberate)
    theirs = without(launcher_tree(verl_config_dir, launcher, searchpath), deliberate)
    found = diff(theirs, ours)
    assert not found, f"{len(found)} difference(s) from the launcher:\n" + "\n".join(
        f"  {k}: launcher={x!r} project={y!r}" for k, x, y in found)


# ---------------------------------------------------------------- one case per launcher command

# (launcher command, its MODEL_PATH variable and path, the project's command): the README's table
CASES = {
    "kimi_k2_6_grpo": (lambda opt, path: launchers.kimi_k2_6_glm5_1("kimi_k2_6", opt, path, HOME),
                       "KIMI_K2_6_MODEL_PATH", "/models/Kimi-K2.6", ["model=kimi_k2_6", "mesh=256gpu", "algo=grpo"]),
    "glm5_1_grpo": (lambda opt, path: launchers.kimi_k2_6_glm5_1("glm5_1", opt, path, HOME),
                    "GLM5_1_MODEL_PATH", "/models/GLM-5.1", ["model=glm5_1", "mesh=256gpu", "algo=grpo"]),
    "qwen3_5_35b_grpo": (lambda opt, path: launchers.qwen3_5_35b(opt, path, HOME),
                         "QWEN3_5_35B_MODEL_PATH", "/models/Qwen3.5-35B-A3B",
                         ["model=qwen3_5_35b", "mesh=8gpu", "algo=grpo"]),
    "deepseek_v4_flash_sft": (lambda opt, path: launchers.deepseek_v4_sft("flash", opt, path, HOME),
                              "FLASH_MODEL_PATH", "/models/DeepSeek-V4-Flash", ["model=deepseek_v4_flash", "algo=sft"]),
    "deepseek_v4_pro_sft": (lambda opt, path: launchers.deepseek_v4_sft("pro", opt, path, HOME),
                            "PRO_MODEL_PATH", "/models/DeepSeek-V4-Pro", ["model=deepseek_v4_pro", "algo=sft"]),
}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("case", list(CASES))
def test_plan_matches_launcher(verl_config_dir, tmp_path, case, optimizer):
    """Each launcher equivalent (README table) plans the launcher's own verl config, for both optimizers."""
    launcher, path_env, path, command = CASES[case]
    # the launchers' dist_opt configs are over 80 GiB by the estimate (refused unless allowed; no verl key changes)
    allow = ["run.allow_memory_overrun=true"] if optimizer == "dist_opt" else []
    assert_parity(verl_config_dir, launcher(optimizer, path), command + [f"optimizer={optimizer}"] + allow, path_env,
                  path, tmp_path, {**DELIBERATE, **DELIBERATE_FOR.get(case, {})})

"""Let the installed verl judge saved run dirs, in one process (verl's imports and Megatron Lite's sitecustomize
cost seconds per start): for each run dir, verl's own CLI loads verl_config.yaml (`--cfg job`) and prints it back;
then what verl's entrypoint and workers do with the config on their way to the GPUs: for PPO, `validate_config` as
`main_ppo.main` calls it and the dataclasses its workers build (actor and ref with their engine config, rollout,
algorithm); for SFT, the engine, optimizer, checkpoint and profiler dataclasses `sft_trainer` builds.
Not built: the model config (HFModelConfig reads the checkpoint's files, which a plan-only run dir has not got).

Usage: python verl_judge.py RUN_DIR... → one JSON object per run dir on the last lines of stdout.
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback

import yaml


def cli_reads_back(module, run_dir: str) -> str:
    """'' when verl's CLI prints the saved config back unchanged, else what went wrong."""
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    argv = sys.argv
    sys.argv = [module.__file__, "--config-path", run_dir, "--config-name", "verl_config", "--cfg", "job",
                "hydra.output_subdir=null", f"hydra.run.dir={run_dir}/cli"]
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            module.main()
    except SystemExit as e:
        if e.code not in (0, None):
            return f"exit {e.code}: {(err.getvalue() + out.getvalue())[-500:]}"
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()
    saved = yaml.safe_load(open(f"{run_dir}/verl_config.yaml"))
    lines = out.getvalue().splitlines()
    first = f"{next(iter(saved))}:"
    start = next((i for i, line in enumerate(lines) if line.startswith(first)), None)
    if start is None:
        return "the CLI printed no config"
    printed = yaml.safe_load("\n".join(lines[start:]))
    if printed != saved:
        keys = sorted(k for k in saved.keys() | printed.keys() if saved.get(k) != printed.get(k))
        return f"printed config differs from the saved one under {keys}"
    return ""


def build(what: str, fn) -> tuple[str, str]:
    try:
        obj = fn()
        return what, f"ok:{type(obj).__name__}"
    except Exception as e:  # noqa: BLE001 - any failure is the verdict, reported with its first line
        # Hydra wraps the dataclass's own error: keep the first two lines, which name the class and the cause
        lines = [line.strip() for line in str(e).splitlines() if line.strip()][:2]
        return what, f"error:{type(e).__name__}: {' '.join(lines)}"


def judge(run_dir: str) -> dict:
    from omegaconf import OmegaConf

    from verl.utils.config import omega_conf_to_dataclass

    plan = json.load(open(f"{run_dir}/plan.json"))
    ppo = plan["verl_config_name"] == "ppo_trainer"
    if ppo:
        import verl.trainer.main_ppo as module
    else:
        import verl.trainer.sft_trainer as module
    verdict = {"run_dir": run_dir, "cli": cli_reads_back(module, run_dir)}
    config = OmegaConf.load(f"{run_dir}/verl_config.yaml")
    if ppo:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config
        from verl.utils.device import auto_set_device

        def validate():
            auto_set_device(config)
            validate_config(config=config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
            return config

        arr = config.actor_rollout_ref
        parts = [build("validate_config", validate), build("actor", lambda: omega_conf_to_dataclass(arr.actor)),
                 build("actor.engine", lambda: omega_conf_to_dataclass(arr.actor.engine)),
                 build("rollout", lambda: omega_conf_to_dataclass(arr.rollout)),
                 build("algorithm", lambda: omega_conf_to_dataclass(config.algorithm))]
        if need_reference_policy(config):
            parts.append(build("ref", lambda: omega_conf_to_dataclass(arr.ref)))
    else:
        parts = [build(k, lambda k=k: omega_conf_to_dataclass(config[k]))
                 for k in ("engine", "optim", "checkpoint", "profiler")]
    verdict["built"] = dict(parts)
    return verdict


def main() -> None:
    results = []
    for run_dir in sys.argv[1:]:
        try:
            results.append(judge(run_dir))
        except Exception:  # noqa: BLE001
            results.append({"run_dir": run_dir, "crash": traceback.format_exc()[-1500:]})
    print("\n".join(["=== verdicts"] + [json.dumps(r) for r in results]))


if __name__ == "__main__":
    main()

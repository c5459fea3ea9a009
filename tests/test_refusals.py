"""Bad input, by family, through the real CLI: refused at plan time with one line naming the key (or planned
with a warning naming it), nothing written outside the run dir, nothing left by a refused run, no secret in any
byte printed or written. One row per case; R is the run dir, S the secret's value (exported as WANDB_API_KEY).
"""
import os
from pathlib import Path

import pytest

from conftest import assert_a_fix, needs_dapo, runner

S = "s3cr3t-wandb-value-4711"
OK, REFUSED = 0, 2

# (id, args, exit, key the first error/warning line must name, extra text that line must hold)
CASES = [
    # --- secrets by any path
    ("secret-in-runtime-env", ["+verl.ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY=" + S], REFUSED,
     "verl.ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY", "pass_env"),
    ("secret-key-in-env", ["+env.HF_TOKEN=abcdef123"], REFUSED, "env.HF_TOKEN", "pass_env"),
    ("secret-interpolated", ["+verl.trainer.foo=${oc.env:WANDB_API_KEY}"], REFUSED, "verl.trainer.foo",
     "WANDB_API_KEY"),
    ("secret-value-under-other-key", ["verl.trainer.project_name=" + S], REFUSED, "verl.trainer.project_name",
     "WANDB_API_KEY"),
    ("secret-in-env-value", ["+env.MY_VAR=" + S], REFUSED, "env.MY_VAR", "WANDB_API_KEY"),
    ("secret-in-parse-error", ["verl.trainer.foo=[" + S], REFUSED, None, "does not parse"),
    ("secret-in-pass-env", ["pass_env=[" + S + "]"], REFUSED, "pass_env[0]", "names"),
    # --- injection into sbatch.sh, command lines, file names
    ("newline-experiment-name", ["run.experiment_name='a\nb'"], REFUSED, "run.experiment_name", "control"),
    ("newline-partition", ["cluster=slurm", "cluster.partition='p\n#SBATCH --nodes=999'"], REFUSED,
     "cluster.partition", "control"),
    ("space-partition", ["cluster=slurm", "cluster.partition='p --nodes=999'"], REFUSED, "cluster.partition",
     "sbatch"),
    ("shell-experiment-name", ["run.experiment_name='x;rm -rf ~'"], REFUSED, "run.experiment_name", "letters"),
    ("sbatch-parameter-name", ["cluster=slurm", "+cluster.additional_parameters.X='a\nb'"], REFUSED,
     "cluster.additional_parameters.X", None),
    # --- Hydra starting the run itself, past the sweeper's checks
    ("hydra-mode-run", ["hydra.mode=RUN"], REFUSED, "hydra.mode", "sweeper"),
    ("hydra-mode-run-multirun-flag", ["-m", "hydra.mode=RUN"], REFUSED, "hydra.mode", "sweeper"),
    # --- escaping the run dir
    ("model-name-dotdot", ["model.name=x/../../esc"], REFUSED, "model.name", "model=<option>"),
    ("algo-name-dotdot", ["algo.name=../../esc"], REFUSED, "algo.name", "algo=<option>"),
    ("sweep-model-name-dotdot", ["-m", "model.name=x/../../esc"], REFUSED, "model.name", None),
    ("images-for-a-text-model", ["data=geo3k", "model=glm5_1"], REFUSED, "data", "no vision tower"),
    ("images-for-a-vision-model", ["data=geo3k", "model=qwen3_5_35b"], OK, None, None),
    # --- settings the chosen entrypoint never reads: warned, naming the key (typed recipes of the other one)
    ("recipe-sft-under-rl", ["model=qwen3_5_35b", "recipe.sft.data.max_length=999"], OK, "recipe.sft.data.max_length",
     "read by nothing"),
    ("recipe-ppo-under-sft", ["model=qwen3_5_35b", "algo=sft", "mesh=8gpu", "recipe.ppo.data.max_prompt_length=9"], OK,
     "recipe.ppo.data.max_prompt_length", "recipe.sft.data.max_prompt_length=9"),
    ("sft-entry-under-rl", ["model=qwen3_5_35b", "run.sft_entry=[x]"], OK, "run.sft_entry", "read by nothing"),
    ("task-runner-under-sft", ["model=qwen3_5_35b", "algo=sft", "mesh=8gpu", "run.task_runner=a.B"], OK,
     "run.task_runner", "read by nothing"),
    ("comma-run-dir-plans", ["hydra.run.dir='R,x'"], OK, None, None),  # legal: no command line splits it
    # --- owned keys through any door
    ("owned-engine-tp", ["engine.tp=2"], REFUSED, "engine.tp", "mesh.tp"),
    ("owned-impl-optimizer", ["engine.impl_cfg.optimizer=dist_opt"], REFUSED, "engine.impl_cfg.optimizer",
     "optimizer="),
    ("owned-recipe-nnodes", ["recipe.ppo.trainer.nnodes=4"], REFUSED, "recipe.ppo.trainer.nnodes", "mesh.nnodes"),
    ("owned-verl-nnodes", ["verl.trainer.nnodes=4"], REFUSED, "verl.trainer.nnodes", "mesh.nnodes"),
    # --- ranges and values verl rejects
    ("fraction-gpu-mem", ["verl.actor_rollout_ref.rollout.gpu_memory_utilization=1.5"], REFUSED,
     "verl.actor_rollout_ref.rollout.gpu_memory_utilization", "(0, 1]"),
    ("bool-as-int", ["verl.data.train_batch_size=true"], REFUSED, "verl.data.train_batch_size", "positive"),
    ("negative-epochs", ["verl.trainer.total_epochs=-1"], REFUSED, "verl.trainer.total_epochs", None),
    ("zero-training-steps", ["verl.trainer.total_training_steps=0"], REFUSED, "verl.trainer.total_training_steps",
     "positive"),
    ("negative-training-steps-sft", ["algo=sft", "verl.trainer.total_training_steps=-5"], REFUSED,
     "verl.trainer.total_training_steps", "positive"),
    ("zero-response", ["verl.data.max_response_length=0"], REFUSED, "verl.data.max_response_length", None),
    ("ray-zero-gpus", ["cluster.ray.num_gpus=0"], REFUSED, "cluster.ray.num_gpus", "no GPU"),
    ("ray-address-form", ["cluster.ray.address=nowhere"], REFUSED, "cluster.ray.address", "host:port"),
    ("gpu-mem-zero", ["cluster.gpu_mem_gib=0"], REFUSED, "cluster.gpu_mem_gib", None),
    ("slurm-time-zero", ["cluster=slurm", "cluster.time_min=0"], REFUSED, "cluster.time_min", "no time limit"),
    ("mesh-bool", ["mesh.tp=true"], REFUSED, "mesh.tp", None),
    ("huge-world", ["mesh.nnodes=100000000", "mesh.cp=3"], REFUSED, "mesh.nnodes", "1,000,000"),
    ("logger-backend", ["verl.trainer.logger=[console,wandbb]"], REFUSED, "verl.trainer.logger", "wandb"),
    ("gae-without-critic", ["verl.algorithm.adv_estimator=gae"], REFUSED, "algorithm.adv_estimator", "critic"),
    ("adv-estimator", ["verl.algorithm.adv_estimator=grpoo"], REFUSED, "verl.algorithm.adv_estimator", "grpo"),
    ("loss-agg-mode", ["verl.actor_rollout_ref.actor.loss_agg_mode=mean"], REFUSED,
     "verl.actor_rollout_ref.actor.loss_agg_mode", "token-mean"),
    ("rollout-name", ["verl.actor_rollout_ref.rollout.name=hf"], REFUSED, "verl.actor_rollout_ref.rollout.name",
     "vllm"),
    ("actor-strategy", ["verl.actor_rollout_ref.actor.strategy=fsdp"], REFUSED,
     "verl.actor_rollout_ref.actor.strategy", "mlite"),
    # --- one value, one source
    ("dapo-short-response", ["algo=dapo", "verl.data.max_response_length=2048"], REFUSED,
     "reward.reward_kwargs.overlong_buffer_cfg.len", "max_resp_len=2048"),
    ("rollout-length-elsewhere", ["verl.actor_rollout_ref.rollout.response_length=100"], REFUSED,
     "verl.actor_rollout_ref.rollout.response_length", "data.max_response_length"),
    # --- paths verl chokes on
    ("model-path-trailing-slash", ["model.path=/nonexistent/ckpt/"], OK, "model.path", "/nonexistent/ckpt "),
    ("model-path-relative", ["model.path=ckpt"], OK, "model.path", "absolute"),
    ("model-path-tilde", ["model.path='~/ckpt/'"], OK, "model.path", "/home/ckpt"),
    ("model-path-unquoted-tilde", ["model.path=~/ckpt"], REFUSED, None, "quote"),
    # --- conflicts
    ("slurm-local-ray", ["cluster=slurm", "cluster.ray.address=local"], REFUSED, "cluster.ray.address", "auto"),
    ("misspelt-recipe", ["+recipe.ppp.x=1"], REFUSED, "recipe.ppp", "recipe.ppo"),
    ("sft-recipe-under-grpo", ["+recipe.sft.x=1"], OK, "recipe.sft.x", "algo=sft"),
    ("ppo-recipe-under-sft", ["model=deepseek_v4_flash", "algo=sft", "+recipe.ppo.trainer.foo=1"], OK,
     "recipe.ppo.trainer.foo", "read by nothing"),
    ("dump-rollouts-sft", ["model=deepseek_v4_flash", "algo=sft", "run.dump_rollouts=true"], OK,
     "run.dump_rollouts", None),
    ("dynamic-sampling-sft", ["model=deepseek_v4_flash", "algo=sft", "algo.dynamic_sampling=true"], OK,
     "algo.dynamic_sampling", "read by nothing"),
    *[(f"ray-under-sft-{k}", ["model=deepseek_v4_flash", "algo=sft", *door, f"cluster.ray.{k}={v}"], OK,
       f"cluster.ray.{k}", "torchrun") for door in ([], ["cluster=slurm"])
      for k, v in (("num_gpus", 4), ("num_cpus", 8), ("address", "auto" if not door else "local"),
                   ("join_timeout_s", 60), ("interface", "ib0")) if not (door and k == "interface")],
    # a SLURM node's torchrun takes its rendezvous address from cluster.ray.interface: read, not warned
    ("interface-under-slurm-sft", ["model=deepseek_v4_flash", "algo=sft", "cluster=slurm", "cluster.ray.interface=ib0"],
     OK, None, None),
    # --- Hydra's own syntax
    # the design card's command: choosing the launcher chooses the cluster group that carries its knobs
    ("launcher-without-cluster", ["-m", "hydra/launcher=submitit_slurm"], OK, None, None),
    ("launcher-single-run", ["hydra/launcher=submitit_slurm"], OK, None, None),
    ("launcher-and-other-cluster", ["-m", "hydra/launcher=submitit_slurm", "cluster=local"], REFUSED,
     "hydra/launcher", "cluster=slurm in place of cluster=local"),
    ("bad-interpolation", ["run.experiment_name=${foo.bar}"], REFUSED, "run.experiment_name", "foo.bar"),
    # --- errors that help: the fix is the one that works
    ("verl-section-at-top", ["trainer.save_freq=10"], REFUSED, "trainer.save_freq", "verl.trainer.save_freq=10"),
    ("map-entry-without-plus", ["model.env.VLLM_FOO=1"], REFUSED, "model.env.VLLM_FOO", "+model.env.VLLM_FOO=1"),
    ("unset-env-interpolation", ["run.experiment_name=${oc.env:VRUN_NOPE_UNSET}"], REFUSED, "run.experiment_name",
     "export VRUN_NOPE_UNSET"),
    ("glob-sweep", ["-m", "model=glob(qwen*)"], OK, None, None),
    ("unquoted-comma", ["hydra.run.dir=R,x"], REFUSED, "hydra.run.dir", "quote"),
    ("run-dir-name-too-long", ["hydra.run.dir=R/" + "d" * 300], REFUSED, "hydra.run.dir", "at most 255"),
]


def _env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MLITE", "RAY_")) and not k.endswith("MODEL_PATH")}
    e.update(HOME=str(tmp_path / "home"), WANDB_API_KEY=S)
    return e


def _files(root: Path) -> dict:
    return {str(p.relative_to(root)): p for p in root.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, case):
    """Refused (or warned) naming the key; no traceback or Python warning; no secret anywhere; nothing outside."""
    _, args, code, key, text = case
    if "algo=dapo" in args:
        needs_dapo()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (tmp_path / "home").mkdir()
    run_dir = tmp_path / "out" / "run"
    multirun = "-m" in args or "cluster=slurm" in args
    args = [a.replace("R", str(run_dir)) if a.startswith("hydra.run.dir") else a for a in args]
    dir_arg = [] if any(a.startswith("hydra.run.dir") for a in args) else \
        [f"hydra.sweep.dir={run_dir}" if multirun else f"hydra.run.dir={run_dir}"]
    proc = runner(*args, "mode=plan", *dir_arg, cwd=cwd, env=_env(tmp_path), timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-2000:]
    assert "Traceback" not in out and "Warning:" not in out and "warnings.warn" not in out, out[-2000:]
    assert S not in out
    if code == OK and key is None:  # plans: nothing more to say about its lines
        return
    kind = "error: " if code else "warning: "
    lines = [line for line in out.splitlines() if kind in line]
    assert lines, out[-2000:]
    first = lines[0][lines[0].index(kind):]
    if not code:  # the warning about this key, among the plan's others
        first = next((x for x in lines if x.startswith(f"{kind}{key}=")), first)
    if key is not None:
        assert first.startswith(f"{kind}{key}="), first
    if text is not None:
        assert text in first, first
    assert ": " in first and "fix: " in first, first
    if code:
        assert all("\n" not in x for x in lines)
        for line in lines:
            assert_a_fix(line[line.index("error: "):], " ".join(args))
        assert not (tmp_path / "out").exists(), sorted(_files(tmp_path / "out"))
    assert list(cwd.iterdir()) == []
    for name, p in _files(tmp_path).items():
        assert name.startswith(("cwd", "home", "out")), name
        if p.is_file():
            assert S.encode() not in p.read_bytes(), name


def test_slurm_plan_writes_where_hydra_run_dir_says(tmp_path):
    """cluster=slurm is a multirun: hydra.run.dir is honoured for its one point (nothing in the checkout's
    multirun/), and refused for a sweep, naming hydra.sweep.dir."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = runner("model=qwen3_5_35b", "cluster=slurm", "mode=plan", f"hydra.run.dir={tmp_path}/r", cwd=cwd,
                  env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "r" / "sbatch.sh").is_file() and (tmp_path / "r" / "plan.json").is_file()
    assert list(cwd.iterdir()) == []
    proc = runner("-m", "model=qwen3_5_35b", "optimizer=fsdp2,dist_opt", "cluster=slurm", "mode=plan",
                  f"hydra.run.dir={tmp_path}/s", cwd=cwd, env=_env(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: hydra.run.dir={tmp_path}/s:")
    assert "hydra.sweep.dir=" in proc.stderr and not (tmp_path / "s").exists()


@pytest.mark.parametrize("door", [[], ["-m"], ["cluster=slurm"]], ids=["run", "multirun-flag", "slurm"])
def test_one_run_given_both_dirs_writes_to_run_dir(tmp_path, door):
    """One point given hydra.run.dir and hydra.sweep.dir is a run: it lands in hydra.run.dir, and the sweep dir
    is never made."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = runner(*door, "model=qwen3_5_35b", "mode=plan", f"hydra.run.dir={tmp_path}/r",
                  f"hydra.sweep.dir={tmp_path}/s", cwd=cwd, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "r" / "plan.json").is_file()
    assert not (tmp_path / "s").exists() and list(cwd.iterdir()) == []


def test_sbatch_script_bytes(tmp_path):
    """The values that reach sbatch.sh come out as one line each: one --nodes, the partition as given."""
    proc = runner("model=qwen3_5_35b", "cluster=slurm", "mode=plan", "cluster.partition=gpu-a_1",
                  "cluster.constraint='h100&ib'", f"hydra.run.dir={tmp_path}/r", env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    script = (tmp_path / "r" / "sbatch.sh").read_text()
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert [line for line in sbatch if line.startswith("#SBATCH --nodes")] == ["#SBATCH --nodes=1"]
    # submitit quotes a value with shell characters
    assert "#SBATCH --partition=gpu-a_1" in sbatch and "#SBATCH --constraint='h100&ib'" in sbatch


def test_checkpoint_without_weights_fails_preflight(tmp_path):
    """A directory with config.json and no weights plans, and preflight refuses it naming the variable; an empty
    shard is refused by the plan itself."""
    from conftest import plan, problems_of
    from vrun.launch import preflight

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    p = plan(["model=qwen3_5_35b", f"model.path={ckpt}", "mode=preflight"], run_dir=str(tmp_path / "r"))
    (problem,) = preflight.model_path_problems(p)
    assert problem.key == "QWEN3_5_35B_MODEL_PATH" and "no weights" in problem.why and not problem.warning
    # an empty shard is no longer found only on the allocation: the plan reads it and refuses it in one line
    (ckpt / "model.safetensors").write_bytes(b"")
    lines = problems_of(["model=qwen3_5_35b", f"model.path={ckpt}"], run_dir=str(tmp_path / "r"))
    assert len(lines) == 1 and lines[0].startswith("error: QWEN3_5_35B_MODEL_PATH=") and \
        "too short for a safetensors header" in lines[0] and "fix: " in lines[0], lines


def test_hydra_mode_is_read_from_run_yaml_without_a_composition(monkeypatch):
    """Hydra composes the whole config only to read hydra.mode; conf/run.yaml sets MULTIRUN, so the runner skips that
    composition (vrun.config.cli_errors.mode_from_run_yaml); a typed RUN is refused there, any other typed value is
    Hydra's to read."""
    import yaml
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from conftest import ROOT
    from vrun.config import cli_errors

    assert yaml.safe_load((ROOT / "conf" / "run.yaml").read_text())["hydra"]["mode"] == "MULTIRUN"
    calls = []
    monkeypatch.setattr(Hydra, "get_mode", Hydra.get_mode)  # restored after the test
    monkeypatch.setattr(Hydra, "compose_config", lambda self, **kw: calls.append(kw["overrides"]) or
                        OmegaConf.create({"hydra": {"mode": "FOO"}}))
    cli_errors.mode_from_run_yaml()
    hydra = object.__new__(Hydra)
    for overrides in (["model=glm5_1"], ["hydra.mode=MULTIRUN"]):
        assert hydra.get_mode(config_name="run", overrides=overrides) is RunMode.MULTIRUN
    assert calls == []
    assert hydra.get_mode(config_name="run", overrides=["++hydra.mode=FOO"]) == "FOO"
    assert calls == [["++hydra.mode=FOO"]]
    with pytest.raises(SystemExit):
        hydra.get_mode(config_name="run", overrides=["hydra.mode=RUN"])


def test_train_file_with_an_image_column_for_a_text_model(tmp_path):
    """A train file readable here that has verl's image column (data.image_key) is read as images, whatever the
    data group says: refused for a text-only model, naming the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"prompt": ["q"], "images": [[b"\x89PNG"]]}), f)
    proc = runner("model=glm5_1", "mode=plan", f"verl.data.train_files={f}", f"hydra.run.dir={tmp_path}/r",
                  env=_env(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: data.train_files={f}: it has verl's image column"), \
        proc.stderr[-2000:]
    assert not (tmp_path / "r").exists()
    plain = tmp_path / "text.parquet"
    pq.write_table(pa.table({"prompt": ["q"]}), plain)
    proc = runner("model=glm5_1", "mode=plan", f"verl.data.train_files={plain}", f"hydra.run.dir={tmp_path}/r",
                  env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]

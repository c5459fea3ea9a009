"""The hand-off, as far as a CPU machine allows.

GRPO: mode=train cluster=local starts a real local Ray instance and reaches verl's run_ppo, which starts the
task runner the run config names (tests/support/vrun_probe.py) inside a Ray worker; the config it receives must equal
verl_config.yaml and the run's variables must be there. What cannot run here: verl's own TaskRunner and the
Megatron Lite workers (no GPUs, no verl_mlite) — preflight says so for runs that would need them.
SFT: verl's own SFT entrypoint reads the saved config back; the torchrun command is asserted.
"""
import hashlib
import json
import os
import subprocess

import pytest
import yaml

from conftest import PY, ROOT, another_models_checkpoint, plan, runner, verl_has


def grpo_env(tmp_path):
    home = tmp_path / "home"
    for split in ("train", "test"):
        (home / "data" / "geo3k").mkdir(parents=True, exist_ok=True)
        (home / "data" / "geo3k" / f"{split}.parquet").write_bytes(b"")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLITE", "RAY_"))}
    env.update(HOME=str(home), QWEN3_5_35B_MODEL_PATH=str(ckpt), WANDB_API_KEY="wandb-test-secret",
               CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7", ROCR_VISIBLE_DEVICES="0", RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=str(ROOT / "tests" / "support"))
    return env


@pytest.mark.ray
def test_grpo_reaches_run_ppo_on_a_real_ray_cluster(tmp_path):
    """Config and env vars arrive in the Ray worker; ROCR is unset; the secret arrives but is never written."""
    env = grpo_env(tmp_path)
    run = tmp_path / "run"
    proc = runner("model=qwen3_5_35b", "mesh=8gpu", "algo=grpo", "mode=train", "cluster=local",
                  "cluster.ray.num_gpus=8", "cluster.ray.num_cpus=2", "run.task_runner=vrun_probe.ProbeTaskRunner",
                  f"hydra.run.dir={run}", env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((run / "probe.json").read_text())
    saved = yaml.safe_load((run / "verl_config.yaml").read_text())
    saved["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"].pop("WANDB_API_KEY", None)
    assert report["config"] == saved
    assert report["in_ray_worker"] and report["pid"] != os.getpid()
    e = report["env"]
    assert e["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and e["VLLM_USE_V1"] == "1" and e["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"
    assert str(ROOT) in e["PYTHONPATH"].split(":")
    assert e["ROCR_VISIBLE_DEVICES"] is None and e["HIP_VISIBLE_DEVICES"] is None
    assert report["secret_sha256"]["WANDB_API_KEY"] == hashlib.sha256(b"wandb-test-secret").hexdigest()
    for f in run.rglob("*"):
        if f.is_file():
            assert "wandb-test-secret" not in f.read_text(errors="ignore"), f
    assert "planned against" not in proc.stderr


def test_declared_gpus_beyond_cuda_visible_devices(tmp_path):
    """Ray would refuse 8 declared GPUs with CUDA_VISIBLE_DEVICES=0: caught before starting it."""
    env = dict(grpo_env(tmp_path), CUDA_VISIBLE_DEVICES="0")
    proc = runner("model=qwen3_5_35b", "mode=train", "cluster.ray.num_gpus=8",
                  "run.task_runner=vrun_probe.ProbeTaskRunner", f"hydra.run.dir={tmp_path}/r", env=env)
    assert proc.returncode == 2 and "error: cluster.ray.num_gpus=8" in proc.stderr and "Traceback" not in proc.stderr


def test_train_needs_the_gpus_on_this_machine(tmp_path):
    """A 256-GPU mesh on cluster=local is an error pointing at cluster=slurm."""
    proc = runner("model=glm5_1", "mode=train", "cluster=local", f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert any(line.startswith("error: mesh.nnodes=32") and "cluster=slurm" in line for line in proc.stderr.splitlines())


def test_sft_torchrun_command(tmp_path):
    """SFT runs torchrun over verl_mlite.launch with the saved config, one node rank per node."""
    p = plan(["model=deepseek_v4_flash", "algo=sft", "mode=plan"], run_dir=str(tmp_path / "r"))
    a = p.argv
    assert os.path.basename(a[0]) == "torchrun"
    assert a[1:11] == ["--nnodes", "16", "--nproc_per_node", "8", "--node_rank", "0", "--master_addr", "127.0.0.1",
                       "--master_port", "29500"]
    assert a[11:16] == ["-m", "verl_mlite.launch", "verl.trainer.sft_trainer", "--config-path", p.run_dir]
    assert a[16:18] == ["--config-name", "verl_config"]


def test_sft_node_command_from_the_plan_record(tmp_path):
    """Each SLURM node builds its torchrun command from the run dir's plan.json: the plan's command with its own rank,
    the node count and the head's address."""
    from vrun import entrypoints
    from vrun.planning import report
    from vrun.rundir.record import PlanRecord

    p = plan(["model=deepseek_v4_flash", "algo=sft", "mode=plan"], run_dir=str(tmp_path / "r"))
    report.write(p)
    t = PlanRecord.load(p.run_dir).torchrun  # what every node reads back
    node = entrypoints.torchrun_argv(t.python, t.module, p.run_dir, nnodes=16, nproc_per_node=t.nproc_per_node,
                                     node_rank=0, master_addr="127.0.0.1", master_port=29500)
    assert node == p.argv
    node3 = entrypoints.torchrun_argv(t.python, t.module, p.run_dir, nnodes=16, nproc_per_node=t.nproc_per_node,
                                      node_rank=3, master_addr="10.0.0.1", master_port=21009)
    assert node3[5:11] == ["--node_rank", "3", "--master_addr", "10.0.0.1", "--master_port", "21009"]
    assert node3[11:] == p.argv[11:]


def reads_back(module, overrides, tmp_path):
    """Plan, then let verl's own CLI load verl_config.yaml (--config-path/--config-name) and print it."""
    proc = runner(*overrides, "mode=plan", f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([PY, "-m", module, "--config-path", str(tmp_path / "r"), "--config-name", "verl_config",
                          "--cfg", "job", "hydra.output_subdir=null", f"hydra.run.dir={tmp_path}/r/cli"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    saved = yaml.safe_load((tmp_path / "r" / "verl_config.yaml").read_text())
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{next(iter(saved))}:"))  # skip logs
    assert yaml.safe_load("\n".join(lines[start:])) == saved


def test_sft_entrypoint_reads_the_saved_config(tmp_path):
    """verl's own SFT entrypoint accepts verl_config.yaml and composes it unchanged."""
    reads_back("verl.trainer.sft_trainer", ["model=deepseek_v4_flash", "algo=sft"], tmp_path)


def test_main_ppo_cli_reads_the_saved_config(tmp_path):
    """verl's own PPO CLI accepts verl_config.yaml and composes it unchanged (DAPO, the larger tree, where the
    installed verl has it)."""
    reads_back("verl.trainer.main_ppo", ["model=glm5_1", "algo=dapo" if verl_has("filter_groups") else "algo=grpo"],
               tmp_path)


def test_slurm_cluster_composes_and_plans(tmp_path):
    """cluster=slurm composes and plans (submission is SLURM's part); Ray is joined, not started locally."""
    p = plan(["model=glm5_1", "cluster=slurm", "mode=plan"], run_dir=str(tmp_path / "r"))
    assert p.verl["ray_kwargs"]["ray_init"]["address"] == "auto" and p.mesh.world == 256


def test_sft_train_without_verl_mlite_is_one_line(tmp_path):
    """SFT needs the real verl_mlite: train fails before launching, naming MLITE_ROOT."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLITE")}
    # (DeepSeek-V4-Flash cannot be held by 8 GPUs at all: the plan refuses it for memory first)
    proc = runner("model=qwen3_5_35b", "algo=sft", "mesh=8gpu", "mode=train", f"hydra.run.dir={tmp_path}/r", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert any(line.startswith("error: MLITE_ROOT=") for line in proc.stderr.splitlines())


@pytest.mark.ray
def test_a_local_train_resumes_only_this_plans_whole_checkpoint(tmp_path):
    """cluster=local, mode=train, run.resume=true: before the command starts, the checkpoint verl would load is
    checked as on a SLURM node — another model's is refused in one line and nothing starts; this plan's whole one is
    said and recorded (`resumed`), then the run goes on."""
    from vrun.rundir import records

    env = grpo_env(tmp_path)
    run = tmp_path / "run"
    base = ["model=qwen3_5_35b", "mesh=8gpu", "algo=grpo", "cluster=local", "cluster.ray.num_gpus=8",
            "cluster.ray.num_cpus=2", "run.task_runner=vrun_probe.ProbeTaskRunner", f"hydra.run.dir={run}"]
    first = runner(*base, "mode=plan", env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    stamp, good = another_models_checkpoint(run)
    refused = runner(*base, "mode=train", "run.resume=true", env=env, timeout=400)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    errors = [x for x in refused.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: model=") and "saved by model glm5_1" in errors[0], errors
    assert "resume: refused" in refused.stdout and not (run / "probe.json").exists()
    assert records.events(str(run))[-1]["event"] == "failed"
    stamp.write_text(good)
    resumed = runner(*base, "mode=train", "run.resume=true", env=env, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "vrun: resume: global_step_2 (the tracker's)" in resumed.stdout, resumed.stdout[-2000:]
    (back,) = [e for e in records.events(str(run)) if e["event"] == "resumed"]
    assert back["step"] == 2 and back["tracker_step"] == 2 and (run / "probe.json").exists()


def test_the_entry_checks_the_checkpoint_where_no_launcher_did(tmp_path, monkeypatch):
    """vrun.launch.entry (the command of cluster=ray and cluster=kuberay jobs) checks the checkpoint verl will load
    when the environment does not say a launcher did (VRUN_RESUME_CHECKED): another model's is one line; this plan's
    whole step is said and recorded as `resumed`; a plan not for training checks nothing."""
    from omegaconf import OmegaConf

    from conftest import record_json
    from vrun.launch import entry
    from vrun.rundir import checkpoints, records

    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps(record_json(run, mode="train", cluster="ray")))
    stamp, good = another_models_checkpoint(run)
    root = run / "checkpoints"
    config = OmegaConf.create({"trainer": {"default_local_dir": str(root)}})
    cfg_path = str(run / "verl_config.yaml")
    monkeypatch.delenv(checkpoints.CHECKED_ENV, raising=False)
    line = entry.resume_problem(cfg_path, config)
    assert line.startswith("error: model=") and "saved by model glm5_1" in line, line
    monkeypatch.setenv(checkpoints.CHECKED_ENV, "1")
    assert entry.resume_problem(cfg_path, config) == ""
    monkeypatch.delenv(checkpoints.CHECKED_ENV)
    stamp.write_text(good)
    assert entry.resume_problem(cfg_path, config) == ""
    (back,) = [e for e in records.events(str(run)) if e["event"] == "resumed"]
    assert back["step"] == 2 and back["line"] == "resume: global_step_2 (the tracker's)", back
    (run / "plan.json").write_text(json.dumps(record_json(run, mode="preflight", cluster="ray")))
    stamp.write_text(json.dumps({**json.loads(good), "model": "glm5_1"}))
    assert entry.resume_problem(cfg_path, config) == ""

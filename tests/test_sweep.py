"""--multirun: every point is planned and checked before the first runs."""
from pathlib import Path

from conftest import runner, without_mlite


def test_invalid_point_stops_the_sweep(tmp_path):
    """One bad point: nothing runs, nothing is written, the point is named."""
    proc = runner("-m", "model=glm5_1,kimi_k2_6", "mesh.cp=8,3", "mode=plan", f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "2 of 4 point(s) do not plan; nothing was run" in proc.stderr
    assert any(line.startswith("point 1 [model=glm5_1 mesh.cp=3") for line in proc.stderr.splitlines())
    assert not Path(tmp_path / "s").exists()


def test_plan_sweep_writes_every_point(tmp_path):
    """A valid 4-point plan sweep writes each point's plan, verl config and manifest."""
    # dist_opt's estimate is over 80 GiB for both models: planned with run.allow_memory_overrun
    proc = runner("-m", "model=glm5_1,kimi_k2_6", "optimizer=fsdp2,dist_opt", "mode=plan", "run.allow_memory_overrun=true",
                  f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0, proc.stderr
    dirs = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert dirs == ["0_glm5_1_grpo_fsdp2", "1_glm5_1_grpo_dist_opt", "2_kimi_k2_6_grpo_fsdp2",
                    "3_kimi_k2_6_grpo_dist_opt"]
    for d in dirs:
        assert {p.name for p in (tmp_path / "s" / d).iterdir()} == {"plan.json", "verl_config.yaml", "manifest.json"}


def test_model_path_for_several_models(tmp_path):
    """MODEL_PATH alone with several models planned is an error, not one checkpoint for all."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.endswith("MODEL_PATH")}
    env["MODEL_PATH"] = "/ckpt/one"
    proc = runner("-m", "model=glm5_1,kimi_k2_6", "mode=plan", f"hydra.sweep.dir={tmp_path}/s", env=env)
    assert proc.returncode == 2 and "MODEL_PATH=/ckpt/one" in proc.stderr and "GLM5_1_MODEL_PATH" in proc.stderr
    single = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/r", env=env)
    assert single.returncode == 0 and "/ckpt/one  [MODEL_PATH]" in single.stdout


def test_basic_launcher_runs_checked_points(tmp_path):
    """Past the checks, points go to the configured launcher (here: preflight, which fails without verl_mlite in
    reach)."""
    proc = runner("-m", "model=qwen3_5_35b", "mode=preflight", f"hydra.sweep.dir={tmp_path}/s", env=without_mlite())
    assert "1 point(s) planned and checked; launching" in proc.stdout
    assert proc.returncode == 2 and "error: MLITE_ROOT=" in proc.stderr
    assert (tmp_path / "s" / "0_qwen3_5_35b_grpo_fsdp2" / "plan.json").exists()
    # the job took the plan the sweeper left in its run dir
    assert not (tmp_path / "s" / "0_qwen3_5_35b_grpo_fsdp2" / ".plan.pickle").exists()


def test_planned_point_passes_through_the_run_dir(tmp_path):
    """The sweeper leaves a point's plan in its run dir; the job takes it once (a later run plans afresh)."""
    from conftest import plan
    from vrun.launch import task

    p = plan(["model=qwen3_5_35b", "mode=preflight"], run_dir=str(tmp_path / "r"))
    task.leave_planned(p)
    got = task.take_planned(p.run_dir)
    assert got.argv == p.argv and got.verl == p.verl and got.mesh == p.mesh and got.config == p.config
    assert task.take_planned(p.run_dir) is None


def test_sweep_points_equal_single_runs(tmp_path):
    """The sweeper composes once per set of group choices and applies value overrides with Hydra's own
    logic: each point's verl config equals a plain run with the same overrides."""
    import yaml

    proc = runner("-m", "model=glm5_1,qwen3_5_35b", "verl.trainer.save_freq=5,10", "mode=plan",
                  f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0, proc.stderr
    for d, ov in (("1_glm5_1_grpo_fsdp2", ["model=glm5_1", "verl.trainer.save_freq=10"]),
                  ("2_qwen3_5_35b_grpo_fsdp2", ["model=qwen3_5_35b", "verl.trainer.save_freq=5"])):
        single = runner(*ov, "mode=plan", f"hydra.run.dir={tmp_path}/{d}-single")
        assert single.returncode == 0, single.stderr
        a = yaml.safe_load((tmp_path / "s" / d / "verl_config.yaml").read_text())
        b = yaml.safe_load((tmp_path / f"{d}-single" / "verl_config.yaml").read_text())
        for c in (a, b):
            c["trainer"].pop("default_local_dir")
        assert a == b

"""The runner as users call it: what plan prints, writes, and does not import."""
import json
import os

from conftest import PY, ROOT, runner


def test_plan_prints_the_table_and_writes_the_run_dir(tmp_path):
    """make run's command: the 256-GPU GLM-5.1 GRPO plan, both decompositions, files in the run dir."""
    proc = runner("model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan", f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "dense   TP1 · CP8 · PP8 · DP4 = 256" in out and "expert  ETP1 · EP8 · PP8 · EDP4 = 256" in out
    assert "128 prompts × n 16 = 2048 samples/step" in out and "vllm TP8·DP8 × 4 replicas" in out
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    assert plan["mesh"] == {"world": 256, "nnodes": 32, "gpus_per_node": 8, "tp": 1, "cp": 8, "pp": 8, "dp": 4,
                            "ep": 8, "etp": 1, "edp": 4, "vpp": 1}
    assert plan["entrypoint"] == "verl.trainer.main_ppo:run_ppo"
    assert plan["argv"][1:5] == ["-m", "vrun.launch.entry", "ppo", "--config"]
    assert plan["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    m = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert m["packages"]["verl"]["version"] and "commit" in m["git"] and m["config"]["model"]["name"] == "glm5_1"


def test_plan_writes_nothing_outside_the_run_dir(tmp_path):
    """Run from an empty cwd: only the run dir appears."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = runner("model=glm5_1", "mode=plan", "hydra.run.dir=r", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in cwd.iterdir()] == ["r"]


def test_plan_imports_no_torch_ray_or_verl(tmp_path):
    """mode=plan keeps torch, ray and verl's Python modules out of the process."""
    code = ("import sys, runpy, atexit; sys.argv=['runner.py','model=glm5_1','mode=plan','hydra.run.dir=%s'];"
            "atexit.register(lambda: print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch','ray','verl','vllm','transformers'})));"
            "runpy.run_path('runner.py', run_name='__main__')") % (tmp_path / "r")
    import subprocess

    proc = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr


def test_secrets_never_written(tmp_path):
    """A token in the environment reaches nothing written: plan, verl config, manifest."""
    env = dict(os.environ, WANDB_API_KEY="sekrit-123", HF_TOKEN="hf-sekrit-456")
    proc = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/r", "verl.trainer.logger=[console,wandb]",
                  env=env)
    assert proc.returncode == 0, proc.stderr
    for f in (tmp_path / "r").iterdir():
        text = f.read_text()
        assert "sekrit" not in text, f.name
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    assert "WANDB_API_KEY" in plan["pass_env"] and "--pass-env" in plan["argv"]


def test_secret_on_the_command_line_is_redacted(tmp_path):
    """A secret-looking override is redacted in the manifest's command line."""
    proc = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/r", "+verl.trainer.wandb_api_key=abc999")
    text = "".join(f.read_text() for f in (tmp_path / "r").iterdir()) if (tmp_path / "r").exists() else ""
    assert "abc999" not in text + proc.stdout + proc.stderr

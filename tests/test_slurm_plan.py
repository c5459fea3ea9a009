"""cluster=slurm without a cluster: what would be submitted, the confirmation rule, the login-node guard."""
import json

from conftest import runner


def test_plan_shows_the_submission(tmp_path):
    """mode=plan cluster=slurm: launcher parameters from the mesh, GPU-hours, the sbatch script; no submission."""
    proc = runner("model=glm5_1", "cluster=slurm", "cluster.partition=gpu", "cluster.time_min=120", "mode=plan",
                  f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0, proc.stderr
    assert "32 node(s) × 8 GPU(s), 120 min, partition gpu: 512.0 GPU-hours" in proc.stdout
    (d,) = [p for p in (tmp_path / "s").iterdir()]
    plan = json.loads((d / "plan.json").read_text())
    assert plan["slurm"]["parameters"]["nodes"] == 32 and plan["slurm"]["parameters"]["gpus_per_node"] == 8
    assert plan["slurm"]["gpu_hours"] == 512.0
    script = (d / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=32" in script and "#SBATCH --partition=gpu" in script and "#SBATCH --signal=USR2@120" in script
    assert "#SBATCH --ntasks-per-node=1" in script


def test_launcher_overrides_win(tmp_path):
    """hydra.launcher.* given by hand wins over the cluster group's value."""
    proc = runner("model=qwen3_5_35b", "cluster=slurm", "hydra.launcher.partition=debug", "mode=plan",
                  f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0 and "partition debug" in proc.stdout


def test_big_submission_needs_a_yes(tmp_path):
    """Above cluster.confirm_gpu_hours a non-interactive submission stops (one line) unless cluster.yes=true."""
    proc = runner("model=glm5_1", "cluster=slurm", "cluster.confirm_gpu_hours=100", "mode=train",
                  f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 2 and "error: cluster.yes=False: 1024 GPU-hours exceed" in proc.stderr
    assert not list((tmp_path / "s").glob(".submitit"))


def test_slurm_launcher_on_a_plain_run_never_trains_locally(tmp_path):
    """hydra/launcher=submitit_slurm without cluster=slurm would run here: refused, pointing at cluster=slurm."""
    proc = runner("model=qwen3_5_35b", "hydra/launcher=submitit_slurm", "mode=train", f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 2 and "add cluster=slurm" in proc.stderr and "Traceback" not in proc.stderr

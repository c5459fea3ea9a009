"""Secrets on a real SLURM cluster: a GRPO job on two nodes gets WANDB_API_KEY and HF_TOKEN to its Ray worker, and
no file the job wrote (run dir, submitit's logs with verl's printed ray.init kwargs and config) holds them.
Same cluster, skips and helpers as tests/test_slurm.py."""
import hashlib
import json

from test_slurm import TWO_NODES, only_dir, pytestmark, run, shared  # noqa: F401 - the fixture and the marks

SECRETS = {"WANDB_API_KEY": "wandb-slurm-s3cret-9931", "HF_TOKEN": "hf-slurm-s3cret-5577"}


def test_secrets_reach_the_worker_and_no_log(shared):  # noqa: F811 - the fixture imported above
    """The probe task runner in a Ray worker sees each secret (as a digest); every file under the sweep dir is
    free of them, while verl's own printout of the ray.init kwargs is there."""
    proc = run(shared, "model=qwen3_5_35b", *TWO_NODES, "mode=train", "cluster.ray.join_timeout_s=120",
               "run.task_runner=vrun_probe.ProbeTaskRunner", env=SECRETS)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for value in SECRETS.values():
        assert value not in proc.stdout + proc.stderr
    d = only_dir(shared)
    report = json.loads((d / "probe.json").read_text())
    for name, value in SECRETS.items():
        assert report["secret_sha256"][name] == hashlib.sha256(value.encode()).hexdigest(), name
    files = [f for f in (shared / "sweep").rglob("*") if f.is_file()]
    logs = [f for f in files if f.name.endswith((".out", ".err"))]
    assert logs and any("ray init kwargs" in f.read_text(errors="ignore") for f in logs), [str(f) for f in logs]
    for f in files:
        data = f.read_bytes()
        for value in SECRETS.values():
            assert value.encode() not in data, f

"""mode=preflight on the target (cluster=local): the checks a SLURM job's nodes make before Ray starts, made on this
machine by the local preflight (vrun.launch.preflight.node_check_problems): a checkpoint dir this machine cannot
write is refused in one line naming it; the GPU count is said once (the preflight's own count comes first)."""
import socket

from conftest import plan
from vrun.launch import nodecheck, preflight


def test_local_preflight_refuses_a_checkpoint_dir_it_cannot_write(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    p = plan(["model=qwen3_5_35b", "mode=preflight", "cluster.ray.num_gpus=8"], run_dir=str(tmp_path / "r"))
    (tmp_path / "r").mkdir(parents=True, exist_ok=True)
    if nodecheck.smi() is None:  # no nvidia-smi and no CUDA_VISIBLE_DEVICES: no GPU verdict here
        assert preflight.node_check_problems(p) == []
    (tmp_path / "r" / "checkpoints").symlink_to(tmp_path / "unmounted" / "ckpt")
    found = [x for x in preflight.collect(p) if x.key == "node check"]
    assert [x.line() for x in found] == [
        f"error: node check=checkpoint dir on {socket.gethostname()}: {tmp_path}/r/checkpoints: a link to "
        f"{tmp_path}/unmounted/ckpt, which is missing on this node; fix: mount it on this node as on the others (the "
        f"same shared storage), or drain it (scontrol update nodename={socket.gethostname()} state=drain reason=...) "
        "and check it with nvidia-smi"]
    assert nodecheck.TOKENS not in [x.name for x in (tmp_path / "r").iterdir()]  # its tokens removed


def test_local_preflight_counts_hidden_gpus_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    p = plan(["model=qwen3_5_35b", "mode=preflight", "cluster.ray.num_gpus=8"], run_dir=str(tmp_path / "r"))
    (tmp_path / "r").mkdir(parents=True, exist_ok=True)
    lines = [x.line() for x in preflight.collect(p) if "GPU" in x.why or x.key == "node check"]
    assert len([x for x in lines if "visible" in x or "CUDA_VISIBLE_DEVICES" in x]) == 1, lines

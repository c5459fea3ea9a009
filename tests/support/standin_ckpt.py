"""A stand-in trainer's checkpoint writer: the files, folders and order that verl's trainer, verl_mlite's engine and
Megatron Lite leave for one save (small byte payloads in place of tensors), so that a restart can be tested without
GPUs. Derived from their code, not from vrun/rundir/checkpoints.py:

- verl (0.9.1, a6ef5009, 1dda039b alike): PPO `RayPPOTrainer._save_checkpoint` (verl/trainer/ppo/ray_trainer.py;
  v1/trainer_base.py the same in sync mode): the actor worker group saves into `global_step_N/actor`, and when every
  rank has returned the driver writes `global_step_N/data.pt`, then the tracker with a plain open("w") + write.
  SFT `CheckpointHandler.save_checkpoint` (verl/utils/checkpoint/checkpoint_handler.py): the engine saves into
  `global_step_N/` itself, each rank with tp and cp rank 0 on the last pipeline stage writes
  `data_<dense dp rank>.pt`, and rank 0 writes the tracker right after its own part, through `.tmp` + rename.
- verl_mlite (`MegatronLiteEngine.save_checkpoint`): Megatron Lite's save on every rank, then rank 0's
  `lr_scheduler.pt` beside `step_N/`, then a barrier.
- Megatron Lite (megatron/lite/primitive/ckpt/dcp.py, `save_training_checkpoint`) into `step_N/`: optimizer=fsdp2 —
  torch DCP, one `__<rank>_0.distcp` per rank (empty when the rank holds nothing), `.metadata` by the coordinator
  (written as `.metadata.tmp`, renamed) once every rank's data is written, then `optimizer_rank_<rank>.pt`;
  optimizer=dist_opt — Megatron Core's dist_checkpointing (megatron/core/dist_checkpointing/serialization.py): with
  core 0.17–0.18 rank 0's `common.pt` first, `__<rank>_0.distcp` only for a rank that has something to save,
  `.metadata`, then rank 0's `metadata.json`; both then each rank's `rng_state_rank_<rank:05d>.pt`.

Coordination is the caller's, as the collective calls are in the real thing: call `save` for every rank, rank 0
last (or concurrently with `wait_s` > 0: rank 0 then waits for the other ranks' shards before it writes `.metadata`
— DCP's gather — and for their rng files before its driver part — the barrier; the others wait for `.metadata`).
Rank 0's call plays the coordinator and, for PPO, verl's driver: `data.pt`, then the tracker through
`write_tracker` when `tracker` is true (false: the caller writes it, or — verl's actor.checkpoint.async_save — no
one does). A kill stops every rank: give every rank that was still saving the same `cut_short`:
True or "shards" (this rank's shard half written, nothing after), "rank_state" (after `.metadata` and
`metadata.json`: this rank's optimizer file half written, no rng file), "driver" (rank 0: every rank's files and
lr_scheduler.pt, no data.pt), "tracker" (rank 0: all written, the tracker truncated by verl's open("w") and
never written — PPO; SFT's atomic write leaves the old tracker and an empty `.tmp`).
Standard library only.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Union

TRACKER = "latest_checkpointed_iteration.txt"
PAYLOAD = b"\x80\x04standin-payload" + b"\0" * 48   # what torch.save / pickle would have written, in short
STAGES = ("shards", "rank_state", "driver", "tracker")


def write_tracker(root, step: int, *, trainer: str = "ppo") -> None:
    """The tracker as verl writes it: PPO (ray_trainer / v1 trainer_base `_save_checkpoint`) with a plain
    open("w") + write(str(step)); SFT (CheckpointHandler) to `<tracker>.tmp`, then renamed over it."""
    path = Path(root) / TRACKER
    if trainer == "sft":
        tmp = Path(str(path) + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(step))
        os.rename(tmp, path)
    else:
        with open(path, "w") as f:
            f.write(str(step))


def _cut(cut_short: Union[bool, str]) -> str:
    if cut_short is True:
        return "shards"
    if not cut_short:
        return ""
    if cut_short not in STAGES:
        raise ValueError(f"cut_short={cut_short!r}: one of {STAGES}")
    return cut_short


def _write(path: Path, data: bytes = PAYLOAD, half: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2] if half else data)


def _regular(path: Path) -> bool:
    try:
        return path.is_file() and not path.is_symlink()
    except OSError:
        return False


def _written(path: Path) -> bool:
    """A shard written to its end (the stand-in's payload, or empty for a rank holding nothing): what DCP's
    coordinator learns from each rank's write results, which a rank killed mid-write never sends."""
    try:
        return _regular(path) and path.stat().st_size in (0, len(PAYLOAD))
    except OSError:
        return False


def _wait(paths: list, wait_s: float, done=_regular) -> bool:
    """Every path done within wait_s (checked at once when 0)."""
    end = time.monotonic() + wait_s
    while True:
        if all(done(p) for p in paths):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)


def _mp_src_dp_rank(rank: int, world: int, mesh: tuple):
    """The dense DP rank of a rank that writes SFT's dataloader state (tp and cp rank 0 on the last pipeline stage:
    Megatron Lite's `is_mp_src_rank_with_outputs`), None for the others. Ranks are laid out [PP, DP, CP, TP]."""
    tp, cp, pp = mesh
    dp = world // (tp * cp * pp)
    tp_rank, cp_rank = rank % tp, (rank // tp) % cp
    dp_rank, pp_rank = (rank // (tp * cp)) % dp, rank // (tp * cp * dp)
    return dp_rank if tp_rank == 0 and cp_rank == 0 and pp_rank == pp - 1 else None


def save(root, step: int, rank: int, world: int, *, cut_short: Union[bool, str] = False, tracker: bool = True,
         optimizer: str = "fsdp2", trainer: str = "ppo", mesh: tuple = (1, 1, 1), has_data: bool = True,
         common_pt: bool = False, wait_s: float = 0.0) -> bool:
    """One rank's part of the save of `step` under `root` (trainer.default_local_dir); True when it finished.
    mesh: (tp, cp, pp), for SFT's data files. has_data=False: the rank holds nothing to save (DCP still writes its
    file empty; Megatron Core writes none). common_pt: Megatron Core 0.17–0.18's layout (dist_opt)."""
    cut = _cut(cut_short)
    root = Path(root)
    base = root / f"global_step_{step}"
    owner = base if trainer == "sft" else base / "actor"     # the engine's local_path
    ckpt = owner / f"step_{step}"
    ckpt.mkdir(parents=True, exist_ok=True)
    others = [r for r in range(world) if r != rank]
    # -- Megatron Lite's save_training_checkpoint: the sharded (collective) part
    if optimizer == "dist_opt" and common_pt and rank == 0:
        _write(ckpt / "common.pt")
    if optimizer == "fsdp2" or has_data:
        _write(ckpt / f"__{rank}_0.distcp", PAYLOAD if has_data else b"", half=cut == "shards")
    if cut == "shards":
        return False
    if rank == 0:  # the coordinator, once every rank's data is written
        if optimizer == "fsdp2" and not _wait([ckpt / f"__{r}_0.distcp" for r in others], wait_s, _written):
            return False
        tmp = ckpt / ".metadata.tmp"
        _write(tmp)
        os.rename(tmp, ckpt / ".metadata")
        if optimizer == "dist_opt":
            config = {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
            if common_pt:
                config.update(common_backend="torch", common_backend_version=1)
            with open(ckpt / "metadata.json", "w") as f:
                json.dump(config, f)
    elif wait_s > 0 and not _wait([ckpt / ".metadata"] + ([ckpt / "metadata.json"] if optimizer == "dist_opt" else []),
                                  wait_s):
        return False
    if optimizer == "fsdp2":
        _write(ckpt / f"optimizer_rank_{rank}.pt", half=cut == "rank_state")
    if cut == "rank_state":
        return False
    _write(ckpt / f"rng_state_rank_{rank:05d}.pt")
    # -- the engine: rank 0's scheduler state, then a barrier
    if rank == 0:
        _write(owner / "lr_scheduler.pt")
        if not _wait([ckpt / f"rng_state_rank_{r:05d}.pt" for r in others], wait_s):
            return False
    if trainer == "sft":
        dp_rank = _mp_src_dp_rank(rank, world, mesh)
        if cut == "driver":
            return False
        if dp_rank is not None:
            _write(base / f"data_{dp_rank}.pt")
        if rank == 0 and tracker:
            if cut == "tracker":
                open(str(root / TRACKER) + ".tmp", "w").close()
                return False
            write_tracker(root, step, trainer="sft")
        return True
    if rank != 0:
        return True
    # -- verl's driver, after every rank returned
    if cut == "driver":
        return False
    _write(base / "data.pt")
    if tracker:
        if cut == "tracker":
            open(root / TRACKER, "w").close()
            return False
        write_tracker(root, step)
    return True

"""A checkpoint's step dirs judged by their files (`judge`, `scan`), and verl's tracker read as it reads it
(`read_tracker`): what a whole save leaves, for PPO and SFT, fsdp2 and dist_opt, is in vrun.rundir.checkpoints'
docstring, which decides from these judgements what a restart resumes from. Standard library only; every read is
bounded, regular files only, and never blocks."""
from __future__ import annotations

import json
import os
import re
import stat as _stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vrun.core import fs
from vrun.core.problems import show


TRACKER = "latest_checkpointed_iteration.txt"


TRACKER_LIMIT = 64                  # bytes: a step number, with room for whitespace


JSON_LIMIT = 64 << 10               # the stamp and metadata.json


MAX_ENTRIES = 1 << 20               # names read from one dir


STEP_DIR = re.compile(r"global_step_(0|[1-9][0-9]{0,11})")      # verl's "global_step_{}".format(N)


STEP_NUMBER = re.compile(r"\s*([0-9]{1,12})\s*", re.ASCII)


def shard(rank: int) -> str:
    return f"__{rank}_0.distcp"


def optimizer_file(rank: int) -> str:
    return f"optimizer_rank_{rank}.pt"


def rng_file(rank: int) -> str:
    return f"rng_state_rank_{rank:05d}.pt"


@dataclass(frozen=True)
class StepDir:
    step: int
    whole: bool
    why: str = ""                       # what is missing, when not whole
    optimizer: Optional[str] = None     # what its files show it was saved with (dist_opt, fsdp2), when they tell


# ---------------------------------------------------------------------------------------------- reading, bounded
def lstat(path: Path) -> Optional[os.stat_result]:
    return fs.stat(path, follow=False)[0]


def regular(path: Path) -> bool:
    st = lstat(path)
    return st is not None and _stat.S_ISREG(st.st_mode)


def real_dir(path: Path) -> bool:
    st = lstat(path)
    return st is not None and _stat.S_ISDIR(st.st_mode)


def _kind(st: os.stat_result) -> str:
    m = st.st_mode
    return ("a symbolic link" if _stat.S_ISLNK(m) else "a FIFO" if _stat.S_ISFIFO(m) else "a directory"
            if _stat.S_ISDIR(m) else "a socket" if _stat.S_ISSOCK(m) else "a device" if _stat.S_ISCHR(m) or
            _stat.S_ISBLK(m) else "a regular file" if _stat.S_ISREG(m) else "not a regular file")


def _names(d: Path) -> set:
    """The names in a dir (at most MAX_ENTRIES); empty when it cannot be listed."""
    out = set()
    try:
        with os.scandir(d) as it:
            for e in it:
                out.add(e.name)
                if len(out) >= MAX_ENTRIES:
                    break
    except (OSError, ValueError, TypeError):
        pass
    return out


def _count(d: Path, names: set, files: list) -> int:
    """How many of `files` are regular files in `d` (a name seen in the listing, then lstat'ed, never opened)."""
    return sum(1 for f in files if f in names and regular(d / f))


def small(path: Path, limit: int) -> Optional[str]:
    """A regular file's text (not through a link), at most `limit` bytes; None otherwise."""
    return fs.read_small(path, limit) if regular(path) else None


def json_object(path: Path) -> Optional[dict]:
    text = small(path, JSON_LIMIT)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def read_tracker(root: Path) -> tuple:
    """(the step the tracker names, why it cannot be used): (N, ""), (None, "") when there is none, (None, why)
    when it is there but verl could not use it (empty, not a number, not a regular file, too large)."""
    path = Path(root) / TRACKER
    st = lstat(path)
    if st is None:
        return None, ""
    if not _stat.S_ISREG(st.st_mode):
        return None, f"is {_kind(st)}"
    if st.st_size > TRACKER_LIMIT:
        return None, f"is {st.st_size} bytes, not a step number"
    text = fs.read_small(path, TRACKER_LIMIT)
    if text is None:
        return None, "cannot be read"
    m = STEP_NUMBER.fullmatch(text)
    if m is None:
        return None, "is empty" if not text.strip() else f"holds {show(text.strip()[:24])!r}, not a step number"
    return int(m.group(1)), ""


def tracker_step(root: Path) -> Optional[int]:
    return read_tracker(root)[0]


def step_entries(root: Path) -> dict:
    """step number → the global_step_<N> name, for every name spelled as verl spells it."""
    out = {}
    for name in _names(Path(root)):
        m = STEP_DIR.fullmatch(name)
        if m:
            out[int(m.group(1))] = name
    return out


# ------------------------------------------------------------------------------------------------------ judging
def trainer_of(plan) -> str:
    return "sft" if getattr(plan, "launcher", "ppo") == "sft" else "ppo"


def judge(root: Path, step: int, plan) -> StepDir:
    """Whether global_step_<step> under root holds a whole save for `plan`'s trainer and world (see the module's
    docstring); `why` names the first piece missing, in the order the save writes them."""
    world, dp = max(int(plan.mesh.world), 1), max(int(plan.mesh.dp), 1)
    base = Path(root) / f"global_step_{step}"
    st = lstat(base)
    if st is None:
        return StepDir(step, False, f"there is no global_step_{step}/")
    if not _stat.S_ISDIR(st.st_mode):
        return StepDir(step, False, f"global_step_{step} is {_kind(st)}, not a save dir")
    sft = trainer_of(plan) == "sft"
    owner, where = (base, "") if sft else (base / "actor", "actor/")
    if not sft and not real_dir(owner):
        return StepDir(step, False, "no actor/ (the actor's save never began)")
    ckpt, at = owner / f"step_{step}", f"{where}step_{step}/"
    owner_names = _names(owner)
    if not real_dir(ckpt):
        return StepDir(step, False, f"no {at} (Megatron Lite's save never began)")
    for name in sorted(n for n in owner_names if n.startswith("step_") and n != f"step_{step}"):
        key = name.split("_")[1]  # how Megatron Lite's loader orders them
        if not (key.isascii() and key.isdigit()):
            return StepDir(step, False, f"{where}{name} is there, which Megatron Lite's loader cannot order")
        if int(key) >= step:
            return StepDir(step, False, f"{where}{name} is there, which Megatron Lite would load instead")
    names = _names(ckpt)
    saved_with = "dist_opt" if "metadata.json" in names else \
        "fsdp2" if any(n.startswith("optimizer_rank_") for n in names) else None
    layout = saved_with or getattr(plan, "optimizer", "dist_opt")
    ranks = range(world)
    if layout == "fsdp2":
        n = _count(ckpt, names, [shard(r) for r in ranks])
        if n < world:
            return StepDir(step, False, f"{n} of {world} ranks' shards (__<rank>_0.distcp) in {at} (the save was cut "
                                        "short)", saved_with)
    if not regular(ckpt / ".metadata"):
        return StepDir(step, False, f"no .metadata in {at} (the save was cut short)", saved_with)
    if layout == "dist_opt":
        config = json_object(ckpt / "metadata.json")
        if config is None or not isinstance(config.get("sharded_backend"), str):
            why = "no" if "metadata.json" not in names else "an unreadable"
            return StepDir(step, False, f"{why} metadata.json in {at} (Megatron Core writes it last: the save was cut "
                                        "short)", saved_with)
        if "common_backend" in config and not regular(ckpt / "common.pt"):
            return StepDir(step, False, f"no common.pt in {at}, which its metadata.json names", saved_with)
    else:
        n = _count(ckpt, names, [optimizer_file(r) for r in ranks])
        if 0 < n < world:
            return StepDir(step, False, f"{n} of {world} ranks' optimizer states (optimizer_rank_<rank>.pt) in {at}",
                           saved_with)
    n = _count(ckpt, names, [rng_file(r) for r in ranks])
    if n < world:
        return StepDir(step, False, f"{n} of {world} ranks' rng_state_rank_<rank>.pt in {at} (each rank's last file: "
                                    "the save was cut short)", saved_with)
    if sft:
        n = _count(base, _names(base), [f"data_{d}.pt" for d in range(dp)])
        if n < dp:
            return StepDir(step, False, f"{n} of {dp} data_<dp rank>.pt (the trainer's dataloader state)", saved_with)
    elif not regular(base / "data.pt"):
        return StepDir(step, False, "no data.pt (verl writes it after the actor's save)", saved_with)
    return StepDir(step, True, "", saved_with)


def scan(root: Path, plan) -> list:
    """Every global_step_<N> under root, newest first, judged for `plan` (its trainer, optimizer and world)."""
    return [judge(Path(root), s, plan) for s in sorted(step_entries(Path(root)), reverse=True)]

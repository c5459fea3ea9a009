"""The checkpoint a restart resumes from: whole, and this plan's.

verl's PPO trainer (trainer.resume_mode=auto, trainer.default_local_dir=<run dir>/checkpoints) loads the step that
`latest_checkpointed_iteration.txt` names (`find_latest_ckpt_path`, verl/utils/checkpoint/checkpoint_manager.py):
`global_step_<N>/`. Its `_save_checkpoint` (verl/trainer/ppo/ray_trainer.py) has the actor saved under
`global_step_<N>/actor/`, writes the dataloader's state to `global_step_<N>/data.pt`, then the tracker (not when
async_save is on). verl_mlite's engine (`MegatronLiteEngine.save_checkpoint`) hands the actor to Megatron Lite's
`save_training_checkpoint` (megatron/lite/primitive/ckpt/dcp.py, Megatron-LM dev d48bd6be), which writes
`actor/step_<N>/` with torch.distributed.checkpoint: one `__<rank>_<k>.distcp` per rank and `.metadata`, which DCP's
coordinator writes after every rank's data; per-rank `optimizer_rank_<rank>.pt` beside them; then (rank 0)
`actor/lr_scheduler.pt`.

A step is whole when `actor/step_<N>/.metadata` is there, every rank of the plan's world wrote its `.distcp` (and its
optimizer file, where any was written), and `data.pt` is there. A save cut short normally leaves the tracker on the
step before; a tracker naming an incomplete step comes from a save that returned without finishing (asynchronous
writes, a storage error) or a step damaged since. Either way verl would load it and fail, or continue from a wrong
state: the restart is moved to the last whole step instead, saying so.

Whose checkpoint: the job stamps each step it finishes with its plan (`vrun_stamp.json`: model, mesh, stack); a
step of another model or stack is refused, of another mesh too unless run.resume_mesh_change=true (Megatron Lite's
DCP checkpoints reshard on load). A step without a stamp was made outside this project: judged by format only.
Standard library only (the node imports it); every read is bounded and never blocks.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vrun.core import fs, writer
from vrun.core.problems import Problem

TRACKER = "latest_checkpointed_iteration.txt"
STAMP = "vrun_stamp.json"
STEP_DIR = re.compile(r"global_step_(\d{1,12})$")
SHARD = re.compile(r"__(\d+)_(\d+)\.distcp$")
OPTIM = re.compile(r"optimizer_rank_(\d+)\.pt$")
MESH_KEYS = ("tp", "cp", "pp", "dp", "ep", "etp", "edp", "nnodes", "gpus_per_node", "world")


@dataclass(frozen=True)
class StepDir:
    step: int
    whole: bool
    why: str = ""               # what is missing, when not whole


@dataclass(frozen=True)
class Resume:
    tracker_step: Optional[int]
    step: Optional[int]                         # what verl will load after apply(); None: from step 0
    skipped: tuple = ()                         # (step, why) for steps passed over
    refused: Optional[Problem] = None
    unstamped: bool = False

    def lines(self) -> list:
        if self.refused is not None:
            return [f"resume refused: {self.refused.why}"]
        skipped = "; ".join(f"global_step_{s} skipped: {why}" for s, why in self.skipped)
        if self.step is None:
            if self.tracker_step is None and not self.skipped:
                return ["resume: no checkpoint yet: starts from step 0"]
            return ["resume: none whole: starts from step 0" + (f" — {skipped}" if skipped else "")]
        head = f"resume: global_step_{self.step}" + (" (the tracker's)" if self.step == self.tracker_step else "")
        if skipped:
            head += f" — {skipped}"
        if self.unstamped:
            head += " (no stamp: made outside vrun, judged by its files only)"
        return [head]


def _entries(d: Path) -> list:
    try:
        return list(os.scandir(d))
    except (OSError, ValueError):
        return []


def judge(step_dir: Path, step: int, world: int) -> StepDir:
    """Whether one global_step_<N> dir holds a whole save (see the module's docstring)."""
    ckpt = step_dir / "actor" / f"step_{step}"
    if not fs.is_dir(ckpt):
        return StepDir(step, False, f"no actor/step_{step}/ (the save never began)")
    names = {e.name: e for e in _entries(ckpt)}
    meta = names.get(".metadata")
    if meta is None or not meta.is_file(follow_symlinks=False):
        return StepDir(step, False, f"no .metadata in actor/step_{step}/ (the save was cut short)")
    shards = {int(m.group(1)) for n in names if (m := SHARD.match(n))}
    if world and len(shards & set(range(world))) < world:
        return StepDir(step, False, f"{len(shards & set(range(world)))} of {world} ranks' shards in actor/step_{step}/")
    optim = {int(m.group(1)) for n in names if (m := OPTIM.match(n))}
    if optim and world and len(optim & set(range(world))) < world:
        return StepDir(step, False, f"{len(optim & set(range(world)))} of {world} ranks' optimizer states")
    if not fs.is_file(step_dir / "data.pt"):
        return StepDir(step, False, "no data.pt (the trainer's dataloader state)")
    return StepDir(step, True)


def scan(root: Path, world: int) -> list:
    """Every global_step_<N> under root, newest first, judged."""
    out = []
    for e in _entries(Path(root)):
        m = STEP_DIR.match(e.name)
        if m and e.is_dir(follow_symlinks=False):
            out.append(judge(Path(root) / e.name, int(m.group(1)), world))
    return sorted(out, key=lambda s: -s.step)


def tracker_step(root: Path) -> Optional[int]:
    text = fs.read_small(Path(root) / TRACKER, 64)
    return int(text.strip()) if text is not None and text.strip().isdigit() else None


def stamp_of(plan) -> dict:
    return {"run_id": plan.run_id, "model": plan.model.name,
            "mesh": {k: getattr(plan.mesh, k) for k in MESH_KEYS},
            "stack": {"verl": (plan.stack.get("verl") or {}).get("version"),
                      "verl_mlite": (plan.stack.get("verl_mlite") or {}).get("commit")}}


def stamp(root: Path, step: int, plan) -> bool:
    """Stamp a whole step with the plan it was made under (the job calls it when the tracker moves to it)."""
    d = Path(root) / f"global_step_{step}"
    if not fs.is_dir(d) or fs.exists(d / STAMP):
        return False
    writer.write_text(d / STAMP, json.dumps(stamp_of(plan)) + "\n", root=str(Path(root).parent))
    return True


def _stamp(d: Path) -> Optional[dict]:
    try:
        data = json.loads(fs.read_small(d / STAMP, 64 << 10) or "null")
    except ValueError:
        return {}
    return data if isinstance(data, dict) or data is None else {}


def _mismatch(saved: dict, plan, allow_mesh_change: bool) -> Optional[Problem]:
    want = stamp_of(plan)
    if saved.get("model") != want["model"]:
        return Problem("run.resume", saved.get("model"), f"the checkpoint is of model {saved.get('model')}, this plan "
                       f"is {want['model']}", "a fresh run dir (hydra.run.dir=...), or the model it was saved with")
    if (saved.get("stack") or {}) != want["stack"]:
        a, b = saved.get("stack") or {}, want["stack"]
        what = ", ".join(f"{k} {a.get(k)} → {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
        return Problem("run.resume", "stack", f"the checkpoint was saved by another stack ({what})",
                       "install the stack it was saved with, or a fresh run dir")
    mesh = saved.get("mesh") or {}
    changed = [f"mesh.{k} {mesh.get(k)} → {want['mesh'][k]}" for k in MESH_KEYS if mesh.get(k) != want["mesh"][k]]
    if changed and not allow_mesh_change:
        return Problem("run.resume_mesh_change", False, f"the checkpoint was saved on another mesh "
                       f"({', '.join(changed)})", "run.resume_mesh_change=true (Megatron Lite reshards on load), "
                       "or the mesh it was saved on")
    return None


def decide(root: Path, plan, allow_mesh_change: bool = False) -> Resume:
    """What verl will load at the next start, checked (see the module's docstring)."""
    root = Path(root)
    tracked = tracker_step(root)
    if tracked is None:
        return Resume(None, None)
    steps = {s.step: s for s in scan(root, plan.mesh.world)}
    skipped = []
    if tracked not in steps:
        skipped.append((tracked, f"the tracker names it, but there is no {root / f'global_step_{tracked}'}"))
    for step in sorted((s for s in steps if s <= tracked), reverse=True):
        s = steps[step]
        if not s.whole:
            skipped.append((step, s.why))
            continue
        saved = _stamp(root / f"global_step_{step}")
        if saved:
            problem = _mismatch(saved, plan, allow_mesh_change)
            if problem is not None:
                return Resume(tracked, None, tuple(skipped), refused=problem)
        return Resume(tracked, step, tuple(skipped), unstamped=saved is None)
    return Resume(tracked, None, tuple(skipped))


def apply(resume: Resume, root: Path) -> None:
    """Make verl load resume.step: the tracker rewritten (the replaced one kept beside it), or moved aside when no
    step is whole (verl then starts from step 0). Writes only inside root."""
    root = Path(root)
    if resume.refused is not None or resume.step == resume.tracker_step:
        return
    old = root / TRACKER
    if fs.exists(old):
        os.replace(old, root / f"{TRACKER}.replaced-{int(time.time())}")
    if resume.step is not None:
        writer.write_text(old, f"{resume.step}", root=str(root.parent))


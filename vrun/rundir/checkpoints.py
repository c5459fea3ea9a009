"""The checkpoint a restart resumes from: whole, and this plan's (`decide`, then `apply`; `scan` lists every step,
`stamp` marks a step with the plan it was made under).

What verl loads. PPO (verl/trainer/ppo/ray_trainer.py and verl/trainer/ppo/v1/trainer_base.py, `_load_checkpoint`,
resume_mode=auto) and SFT (verl/utils/checkpoint/checkpoint_handler.py, `CheckpointHandler.load_checkpoint`) both
ask `find_latest_ckpt_path` (verl/utils/checkpoint/checkpoint_manager.py): it reads
`<trainer.default_local_dir>/latest_checkpointed_iteration.txt` with `int(f.read().decode())` and returns
`global_step_<N>/` if that path exists, else None — a tracker naming a missing dir starts training from step 0
without a word, an empty or garbled one raises, a FIFO in its place blocks the trainer forever. The same in
verl 0.9.1 (PyPI), a6ef5009 (0.9.0.dev, Megatron Lite's REQUIRED_VERL.txt) and 1dda039b (0.10.0.dev).

What a whole save leaves, in the order it is written (the three verls alike unless said):

- PPO, `_save_checkpoint` (ray_trainer.py, and v1/trainer_base.py when trainer.use_v1): the actor worker group's
  `save_checkpoint(<step dir>/actor, ..., global_step=N)` returns when every rank has finished
  (verl/workers/engine_workers.py: `TrainingWorker.save_checkpoint` → the engine); then the driver writes
  `global_step_N/data.pt` (torch.save of the dataloader state); then — v1 trainer in an async trainer mode only —
  `global_step_N/transfer_queue/` (0.9.1 always, 1dda039b when TransferQueue ≥ 0.1.9 has checkpoints, a6ef5009
  never); then the tracker, a plain `open(..., "w")` + `write(str(N))`, skipped altogether when
  `actor.checkpoint.async_save` is set. data.pt is the last file of the step dir; the tracker moves after it.
- SFT, `CheckpointHandler.save_checkpoint`: the engine saves into `global_step_N/` itself (no actor/); then each rank
  with tp, cp rank 0 on the last pipeline stage writes `global_step_N/data_<dense dp rank>.pt` (one per dense DP
  rank); rank 0 writes the tracker atomically (`.tmp` + rename) right after its own part — with pp > 1 before the
  other ranks' data files are there (the barrier comes after).
- verl_mlite's engine (Megatron-LM dev d48bd6be, experimental/lite/examples/verl/verl_mlite/engine/mlite_engine.py,
  `MegatronLiteEngine.save_checkpoint`, default save_contents): `save_training_checkpoint(..., global_step, <dir>)`
  on every rank, then rank 0 writes `<dir>/lr_scheduler.pt` (when the engine built a scheduler:
  optim.total_training_steps > 0), then (save_contents with hf_model only) `<dir>/huggingface/` (weights,
  config.json, tokenizer), then a barrier. `load_checkpoint` loads the highest `step_*` entry of `<dir>`
  (megatron/lite/primitive/ckpt/dcp.py: `_resolve_step_checkpoint_path`). max_ckpt_to_keep is ignored: old steps stay.
- Megatron Lite (megatron/lite/primitive/ckpt/dcp.py, `save_training_checkpoint`) writes `<dir>/step_N/`, by the
  optimizer the plan sets (engine.impl_cfg.optimizer):
  - fsdp2: torch.distributed.checkpoint's `FileSystemWriter` (torch/distributed/checkpoint/filesystem.py): every
    rank writes exactly one `__<rank>_0.distcp` (thread_count 1; empty when the rank holds nothing), rank 0 then
    writes `.metadata` (as `.metadata.tmp`, renamed) after gathering every rank's results; then each rank
    `optimizer_rank_<rank>.pt`; then `rng_state_rank_<rank:05d>.pt`.
  - dist_opt (the engine's default): Megatron Core's `dist_checkpointing.save`
    (megatron/core/dist_checkpointing/serialization.py, called from megatron/lite/primitive/ckpt/distckpt.py
    `save_dist_opt_checkpoint`): Megatron Core 0.17–0.18 first write `common.pt` (rank 0); then its torch_dist
    writer (strategies/filesystem_async.py) writes `__<rank>_0.distcp` only for a rank that has something to save,
    then `.metadata` (renamed into place); then rank 0 writes `metadata.json` ({"sharded_backend": "torch_dist",
    ...}; 0.17–0.18 add "common_backend"), last of the format, 0.19 and dev keep the common state inside the DCP
    files (no common.pt); then each rank `rng_state_rank_<rank:05d>.pt`.
  Each rank's `rng_state_rank_<rank:05d>.pt` is its last file, written after the collective save returned.

So a step is whole when: it is a real dir; `step_N/` is there (under actor/ for PPO) and is the highest `step_*`
entry; `.metadata` is there; fsdp2: every rank of the plan's world has its shard (and, where any was written, its
optimizer file); dist_opt: `metadata.json` is there (with `common.pt` when it names a common backend); every rank's
rng file is there; and PPO's `data.pt`, or SFT's one data file per dense DP rank. Files are counted only when they
are regular files (a FIFO or a link in a shard's place does not count, and is never opened). The files tell the
optimizer a step was saved with (metadata.json: dist_opt; optimizer_rank_*: fsdp2): the other engine cannot load it.

A save cut short leaves the tracker on the step before; a tracker naming an incomplete step comes from damage since
(a partial copy, a clean-up) or a save that returned without finishing. verl would fail there, or start from 0, or
hang: the restart is moved to the newest whole step at or below the tracker's (any step, when the tracker is
garbled), saying what was skipped and why. Steps above the tracker are never taken: verl moves the tracker last.

Whose checkpoint: the job stamps each step it saves with its plan (`vrun_stamp.json`: run id, model, optimizer,
mesh, stack); a step of another model, optimizer or stack (verl version, verl_mlite commit) is refused, of another
mesh too unless run.resume_mesh_change=true (Megatron Lite reshards on load: dist_opt fully, fsdp2 the model only —
each rank reloads its own optimizer_rank_<rank>.pt as saved). A step without a stamp was made outside this project:
judged by its files only, and the line says so.

Standard library only (the SLURM node imports it); every read is bounded, regular files only, and never blocks.
"""
from __future__ import annotations

import json
import os
import re
import stat as _stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vrun.core import fs, writer
from vrun.core.problems import Problem, show

TRACKER = "latest_checkpointed_iteration.txt"
STAMP = "vrun_stamp.json"
STAMP_FORMAT = 1
TRACKER_LIMIT = 64                  # bytes: a step number, with room for whitespace
JSON_LIMIT = 64 << 10               # the stamp and metadata.json
MAX_ENTRIES = 1 << 20               # names read from one dir
STEP_DIR = re.compile(r"global_step_(0|[1-9][0-9]{0,11})")      # verl's "global_step_{}".format(N)
STEP_NUMBER = re.compile(r"\s*([0-9]{1,12})\s*", re.ASCII)
MESH_KEYS = ("tp", "cp", "pp", "dp", "ep", "etp", "edp", "nnodes", "gpus_per_node", "world")
# a change in these is a change of mesh; nnodes × gpus_per_node alone places the same ranks on other machines
LAYOUT_KEYS = ("tp", "cp", "pp", "dp", "ep", "etp", "edp", "world")
STACK_KEYS = (("verl", "version"), ("verl_mlite", "commit"))
FRESH = "a fresh run dir (hydra.run.dir=<new dir>)"


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


@dataclass(frozen=True)
class Resume:
    tracker_step: Optional[int]                 # what the tracker names; None: absent or garbled
    step: Optional[int]                         # what verl loads after apply(); None: from step 0
    skipped: tuple = ()                         # (step, why) for the steps passed over, newest first
    refused: Optional[Problem] = None           # the checkpoint belongs to another plan
    unstamped: bool = False                     # the step has no stamp: judged by its files only
    tracker: str = ""                           # why the tracker cannot be used as it is ("": absent or fine)
    notes: tuple = ()                           # further lines (a mesh change let through, steps without a tracker)

    def lines(self) -> list:
        if self.refused is not None:
            return [f"resume: refused — {self.refused.why}; fix: {self.refused.fix}"]
        skipped = "; ".join(f"global_step_{s} skipped: {why}" for s, why in self.skipped)
        tail = (f" — {skipped}" if skipped else "") + (f" (the tracker {self.tracker})" if self.tracker else "")
        if self.step is None:
            if self.tracker_step is None and not self.tracker and not self.skipped:
                head = "resume: no checkpoint yet: starts from step 0" if not self.notes else \
                    "resume: no tracker: starts from step 0"
                return [head, *self.notes]
            return ["resume: none whole: starts from step 0" + tail, *self.notes]
        head = f"resume: global_step_{self.step}"
        if self.step == self.tracker_step and not self.tracker:
            head += " (the tracker's)"
        elif self.tracker:
            head += " (the newest whole)"
        head += tail
        if self.unstamped:
            head += " (no stamp: made outside vrun, judged by its files only)"
        return [head, *self.notes]


# ---------------------------------------------------------------------------------------------- reading, bounded
def _lstat(path: Path) -> Optional[os.stat_result]:
    return fs.stat(path, follow=False)[0]


def _regular(path: Path) -> bool:
    st = _lstat(path)
    return st is not None and _stat.S_ISREG(st.st_mode)


def _real_dir(path: Path) -> bool:
    st = _lstat(path)
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
    return sum(1 for f in files if f in names and _regular(d / f))


def _small(path: Path, limit: int) -> Optional[str]:
    """A regular file's text (not through a link), at most `limit` bytes; None otherwise."""
    return fs.read_small(path, limit) if _regular(path) else None


def _json_object(path: Path) -> Optional[dict]:
    text = _small(path, JSON_LIMIT)
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
    st = _lstat(path)
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


def _step_entries(root: Path) -> dict:
    """step number → the global_step_<N> name, for every name spelled as verl spells it."""
    out = {}
    for name in _names(Path(root)):
        m = STEP_DIR.fullmatch(name)
        if m:
            out[int(m.group(1))] = name
    return out


# ------------------------------------------------------------------------------------------------------ judging
def _trainer(plan) -> str:
    return "sft" if getattr(plan, "launcher", "ppo") == "sft" else "ppo"


def judge(root: Path, step: int, plan) -> StepDir:
    """Whether global_step_<step> under root holds a whole save for `plan`'s trainer and world (see the module's
    docstring); `why` names the first piece missing, in the order the save writes them."""
    world, dp = max(int(plan.mesh.world), 1), max(int(plan.mesh.dp), 1)
    base = Path(root) / f"global_step_{step}"
    st = _lstat(base)
    if st is None:
        return StepDir(step, False, f"there is no global_step_{step}/")
    if not _stat.S_ISDIR(st.st_mode):
        return StepDir(step, False, f"global_step_{step} is {_kind(st)}, not a save dir")
    sft = _trainer(plan) == "sft"
    owner, where = (base, "") if sft else (base / "actor", "actor/")
    if not sft and not _real_dir(owner):
        return StepDir(step, False, "no actor/ (the actor's save never began)")
    ckpt, at = owner / f"step_{step}", f"{where}step_{step}/"
    owner_names = _names(owner)
    if not _real_dir(ckpt):
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
    if not _regular(ckpt / ".metadata"):
        return StepDir(step, False, f"no .metadata in {at} (the save was cut short)", saved_with)
    if layout == "dist_opt":
        config = _json_object(ckpt / "metadata.json")
        if config is None or not isinstance(config.get("sharded_backend"), str):
            why = "no" if "metadata.json" not in names else "an unreadable"
            return StepDir(step, False, f"{why} metadata.json in {at} (Megatron Core writes it last: the save was cut "
                                        "short)", saved_with)
        if "common_backend" in config and not _regular(ckpt / "common.pt"):
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
    elif not _regular(base / "data.pt"):
        return StepDir(step, False, "no data.pt (verl writes it after the actor's save)", saved_with)
    return StepDir(step, True, "", saved_with)


def scan(root: Path, plan) -> list:
    """Every global_step_<N> under root, newest first, judged for `plan` (its trainer, optimizer and world)."""
    return [judge(Path(root), s, plan) for s in sorted(_step_entries(Path(root)), reverse=True)]


# ------------------------------------------------------------------------------------------------------ stamps
def stamp_of(plan) -> dict:
    return {"format": STAMP_FORMAT, "run_id": plan.run_id, "model": plan.model.name,
            "optimizer": getattr(plan, "optimizer", None), "trainer": _trainer(plan),
            "mesh": {k: getattr(plan.mesh, k) for k in MESH_KEYS}, "stack": dict(plan.stack or {})}


def stamp(root: Path, step: int, plan) -> bool:
    """Stamp global_step_<step> with the plan it was saved under (the job calls it when a new step appears); a step
    already stamped keeps its stamp. False when there is no such dir or it already has one."""
    d = Path(root) / f"global_step_{step}"
    if not _real_dir(d) or _lstat(d / STAMP) is not None:
        return False
    writer.write_text(d / STAMP, json.dumps(stamp_of(plan), indent=1) + "\n", root=str(root))
    return True


def read_stamp(step_dir: Path) -> tuple:
    """(the stamp, why not): (dict, ""), (None, "") when there is none, (None, why) when it cannot be read."""
    path = Path(step_dir) / STAMP
    if _lstat(path) is None:
        return None, ""
    data = _json_object(path)
    if data is None or data.get("format") != STAMP_FORMAT:
        return None, "its stamp cannot be read"
    return data, ""


def _part(stack: dict, part: str, key: str):
    side = (stack or {}).get(part)
    return side.get(key) if isinstance(side, dict) else None


def _short(v) -> str:
    return "unknown" if v is None else show(v)[:8] if len(str(v)) == 40 else show(v)


def _mismatch(step: int, saved: dict, plan, allow_mesh_change: bool) -> tuple:
    """(a Problem when the step is another plan's, notes when a difference is let through)."""
    name = f"global_step_{step}"
    want = stamp_of(plan)
    if saved.get("model") != want["model"]:
        model = show(saved.get("model"))
        return Problem("model", want["model"], f"{name} was saved by model {model}, this plan trains {want['model']}",
                       f"model={model}, or {FRESH}"), ()
    if saved.get("optimizer") not in (None, want["optimizer"]):
        return _other_optimizer(step, show(saved.get("optimizer")), "its stamp", plan), ()
    changed = [f"{part} {_short(_part(saved.get('stack'), part, key))} → {_short(_part(want['stack'], part, key))}"
               for part, key in STACK_KEYS
               if _part(saved.get("stack"), part, key) != _part(want["stack"], part, key)]
    if changed:
        return Problem("stack", "changed", f"{name} was saved by another stack ({', '.join(changed)})",
                       f"run where the stack it was saved with is installed (plan there), or {FRESH}"), ()
    mesh = saved.get("mesh") if isinstance(saved.get("mesh"), dict) else {}
    moved = [f"mesh.{k} {show(mesh.get(k))} → {want['mesh'][k]}" for k in LAYOUT_KEYS
             if mesh.get(k) != want["mesh"][k]]
    placed = [f"mesh.{k} {show(mesh.get(k))} → {want['mesh'][k]}" for k in ("nnodes", "gpus_per_node")
              if mesh.get(k) != want["mesh"][k]]
    notes = []
    if moved:
        how = "the model resharded; each rank reloads its own optimizer_rank_<rank>.pt as saved" \
            if want["optimizer"] == "fsdp2" else "model and optimizer resharded"
        if not allow_mesh_change:
            back = " ".join(f"mesh.{k}={show(mesh.get(k))}" for k in ("nnodes", "gpus_per_node", "tp", "cp", "pp", "ep",
                                                                          "etp") if mesh.get(k) != want["mesh"][k])
            return Problem("run.resume_mesh_change", False, f"{name} was saved on another mesh ({', '.join(moved)})",
                           f"run.resume_mesh_change=true (Megatron Lite loads it {how}), the mesh it was saved on"
                           + (f" ({back})" if back else "") + f", or {FRESH}"), ()
        notes.append(f"resume: mesh change let through (run.resume_mesh_change=true): {', '.join(moved)}; Megatron "
                     f"Lite loads it {how}")
    if placed and not moved:
        notes.append(f"resume: {', '.join(placed)}: the same ranks on other machines")
    return None, tuple(notes)


def _other_optimizer(step: int, saved: str, evidence: str, plan) -> Problem:
    return Problem("optimizer", plan.optimizer, f"global_step_{step} was saved with optimizer={saved} ({evidence}), "
                   f"which the {plan.optimizer} engine cannot load", f"optimizer={saved}, or {FRESH}")


# ------------------------------------------------------------------------------------------------------ deciding
def decide(root: Path, plan, allow_mesh_change: bool = False) -> Resume:
    """What verl will load at the next start, checked: the tracker's step if whole and this plan's; else the newest
    whole step below it (any step when the tracker is garbled), or none (step 0); or refused (another plan's)."""
    root = Path(root)
    tracked, bad = read_tracker(root)
    entries = _step_entries(root)
    if tracked is None and not bad:
        if not entries:
            return Resume(None, None)
        on_disk = ", ".join(entries[s] for s in sorted(entries, reverse=True)[:3]) + (", …" if len(entries) > 3
                                                                                      else "")
        return Resume(None, None, notes=(f"resume: {on_disk} on disk but no {TRACKER} (verl loads only the step the "
                                         "tracker names)",))
    skipped = []
    if tracked is not None and tracked not in entries:
        skipped.append((tracked, f"the tracker names it, but there is no global_step_{tracked}/ (verl would start from "
                                 "step 0)"))
    for step in sorted((s for s in entries if tracked is None or s <= tracked), reverse=True):
        s = judge(root, step, plan)
        if not s.whole:
            skipped.append((step, s.why))
            continue
        saved, unreadable = read_stamp(root / entries[step])
        if unreadable:
            return Resume(tracked, None, tuple(skipped), refused=Problem(
                "checkpoint", f"global_step_{step}", f"global_step_{step}/{STAMP} cannot be read (not this project's "
                "JSON): whose save it is cannot be told", f"remove global_step_{step}/{STAMP} to judge the step by its "
                f"files only, or {FRESH}"), tracker=bad)
        notes = ()
        if saved is not None:
            problem, notes = _mismatch(step, saved, plan, allow_mesh_change)
            if problem is not None:
                return Resume(tracked, None, tuple(skipped), refused=problem, tracker=bad)
        if s.optimizer is not None and s.optimizer != plan.optimizer:
            evidence = "its metadata.json" if s.optimizer == "dist_opt" else "its optimizer_rank_<rank>.pt"
            return Resume(tracked, None, tuple(skipped), refused=_other_optimizer(step, s.optimizer, evidence, plan),
                          tracker=bad)
        return Resume(tracked, step, tuple(skipped), unstamped=saved is None, tracker=bad, notes=notes)
    return Resume(tracked, None, tuple(skipped), tracker=bad)


def apply(resume: Resume, root: Path) -> bool:
    """Make verl load resume.step: the tracker rewritten to name it (the replaced one kept beside it as
    <tracker>.replaced-<unix time>), or moved aside when no step is whole (verl then starts from step 0). Nothing
    for a refused decision or one verl already follows. Writes only inside root. True when it changed anything."""
    root = Path(root)
    if resume.refused is not None or linked(root) is not None:  # never renamed through a link
        return False
    if resume.step is not None and resume.step == resume.tracker_step and not resume.tracker:
        return False
    path = root / TRACKER
    present = _lstat(path) is not None
    if resume.step is None and not present:
        return False
    if present:
        stamp_s = int(time.time())
        aside = root / f"{TRACKER}.replaced-{stamp_s}"
        n = 0
        while _lstat(aside) is not None:
            n += 1
            aside = root / f"{TRACKER}.replaced-{stamp_s}-{n}"
        os.rename(path, aside)
    if resume.step is not None:
        writer.write_text(path, str(resume.step), root=str(root), verbatim=True)
    return True


def linked(root: Path) -> Optional[str]:
    """Where `root` really is when it is itself a link (a checkpoints/ link the user made to other storage); None
    otherwise (links above it are the machine's own layout)."""
    return os.path.realpath(root) if os.path.islink(root) else None


def check(root: Path, plan, say) -> Resume:
    """Before a training attempt starts: decide what verl will load (decide), say each line (say: a function of one
    line), and make verl load it (apply) unless refused. The caller records `resumed` (resumed_fields) or stops on
    decision.refused. A root reached through a link is followed for reading and said; the tracker is never
    renamed or written through it (what apply would have changed is said instead), and a tracker that cannot be
    changed is one line, never an exception."""
    decision = decide(Path(root), plan, allow_mesh_change=plan.resume_mesh_change)
    for line in decision.lines():
        say(f"vrun: {line}")
    if decision.refused is not None:
        return decision
    target = linked(root)
    changes = not (decision.step is not None and decision.step == decision.tracker_step and not decision.tracker) \
        and not (decision.step is None and _lstat(Path(root) / TRACKER) is None)
    if target is not None:
        say(f"vrun: resume: {root} is a link to {show(target)}: read through it; the tracker there is never "
            "rewritten through it" + (f" (verl loads what it names, not global_step_{decision.step}: point it there "
                                      "yourself, or make checkpoints/ a plain dir)" if changes else ""))
        return decision
    try:
        apply(decision, Path(root))
    except OSError as e:
        say(f"vrun: resume: the tracker in {root} was not changed: {str(e).splitlines()[0][:300]}")
    return decision


def resumed_fields(decision: Resume) -> dict:
    """The `resumed` event's fields (vrun.rundir.state reads them)."""
    return dict(step=decision.step, tracker_step=decision.tracker_step,
                skipped=[[s, why] for s, why in decision.skipped], line="; ".join(decision.lines()))


# set in the environment of a command whose launcher already checked the checkpoint (a SLURM node, cluster=local):
# vrun.launch.entry checks it itself otherwise (cluster=ray, cluster=kuberay)
CHECKED_ENV = "VRUN_RESUME_CHECKED"

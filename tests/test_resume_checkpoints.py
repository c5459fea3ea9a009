"""The checkpoint a restart resumes from (vrun/rundir/checkpoints.py): whole by the layout verl, verl_mlite and
Megatron Lite write (tests/support/standin_ckpt.py writes it, derived from their code), and this plan's."""
import dataclasses
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from conftest import record_json
from vrun.rundir import checkpoints
from vrun.rundir.record import PlanRecord

sys.path.insert(0, str(Path(__file__).parent / "support"))
import standin_ckpt  # noqa: E402

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

TRACKER = checkpoints.TRACKER


@pytest.fixture
def plan(tmp_path):
    """The plan of qwen3_5_35b GRPO on 8 GPUs, optimizer=fsdp2 (a real plan.json read back)."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "plan.json").write_text(json.dumps(record_json(d, mode="train", cluster="slurm")))
    p = PlanRecord.load(d)
    assert (p.mesh.world, p.optimizer, p.launcher) == (8, "fsdp2", "ppo")
    return p


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "run" / "checkpoints"
    r.mkdir(parents=True)
    return r


def save(root, step, world, *, cut=None, cut_ranks=None, skip_ranks=(), tracker=True, stamp_plan=None, **kw):
    """Every rank's part, rank 0 last (it coordinates and plays verl's driver). cut: the stage a kill stopped the
    ranks in `cut_ranks` (all by default); skip_ranks: ranks that never began writing."""
    cut_ranks = range(world) if cut_ranks is None else cut_ranks
    for r in [*range(1, world), 0]:
        if r not in skip_ranks:
            standin_ckpt.save(root, step, r, world, cut_short=cut if cut and r in cut_ranks else False,
                              tracker=tracker, **kw)
    if stamp_plan is not None:
        assert checkpoints.stamp(root, step, stamp_plan)


def quick(fn, *args, timeout=20):
    """fn(*args) in a thread: it must return (not hang) and not raise."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("v", fn(*args)), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn.__name__} hung"
    assert "v" in out, f"{fn.__name__} raised"
    return out["v"]


def replaced(root):
    return sorted(p.read_text() for p in root.glob(f"{TRACKER}.replaced-*"))


# ---------------------------------------------------------------------------------------------------- whole saves
def test_whole_saves_are_found_and_the_trackers_is_kept(plan, root):
    assert checkpoints.decide(root, plan).lines() == ["resume: no checkpoint yet: starts from step 0"]
    save(root, 10, 8, stamp_plan=plan)
    save(root, 20, 8, stamp_plan=plan)
    a = root / "global_step_20" / "actor" / "step_20"
    assert sorted(os.listdir(a)) == [".metadata"] + [f"__{r}_0.distcp" for r in range(8)] + \
        [f"optimizer_rank_{r}.pt" for r in range(8)] + [f"rng_state_rank_{r:05d}.pt" for r in range(8)]
    assert sorted(os.listdir(root / "global_step_20")) == ["actor", "data.pt", checkpoints.STAMP]
    assert (root / TRACKER).read_text() == "20"
    assert [(s.step, s.whole, s.optimizer) for s in checkpoints.scan(root, plan)] == \
        [(20, True, "fsdp2"), (10, True, "fsdp2")]
    r = checkpoints.decide(root, plan)
    assert (r.tracker_step, r.step, r.skipped, r.refused, r.unstamped) == (20, 20, (), None, False)
    assert r.lines() == ["resume: global_step_20 (the tracker's)"]
    assert checkpoints.apply(r, root) is False and replaced(root) == []


def test_dist_opt_and_sft_layouts(plan, root, tmp_path):
    """dist_opt (Megatron Core's format: metadata.json last; a rank holding nothing writes no shard; core 0.17–0.18
    also common.pt) and SFT (no actor/, one data_<dp>.pt per dense DP rank, the tracker renamed into place)."""
    dist = dataclasses.replace(plan, optimizer="dist_opt")
    save(root, 5, 8, optimizer="dist_opt", skip_ranks=())
    os.remove(root / "global_step_5" / "actor" / "step_5" / "__6_0.distcp")  # rank 6 held nothing to save
    assert checkpoints.decide(root, dist).lines() == ["resume: global_step_5 (the tracker's) (no stamp: made outside "
                                                      "vrun, judged by its files only)"]
    save(root, 6, 8, optimizer="dist_opt", common_pt=True)
    assert checkpoints.decide(root, dist).step == 6
    os.remove(root / "global_step_6" / "actor" / "step_6" / "common.pt")
    r = checkpoints.decide(root, dist)
    assert r.step == 5 and r.skipped == ((6, "no common.pt in actor/step_6/, which its metadata.json names"),)
    save(root, 7, 8, optimizer="dist_opt", cut="rank_state", tracker=False)
    os.remove(root / "global_step_7" / "actor" / "step_7" / "metadata.json")
    standin_ckpt.write_tracker(root, 7)
    r = checkpoints.decide(root, dist)
    assert r.skipped[0] == (7, "no metadata.json in actor/step_7/ (Megatron Core writes it last: the save was cut "
                               "short)")

    sft = dataclasses.replace(plan, launcher="sft", mesh=dataclasses.replace(plan.mesh, cp=1, pp=2, dp=4))
    s = tmp_path / "sft"
    save(s, 3, 8, trainer="sft", mesh=(1, 1, 2))
    assert sorted(n for n in os.listdir(s / "global_step_3") if n.startswith("data_")) == \
        [f"data_{d}.pt" for d in range(4)]
    assert (s / TRACKER).read_text() == "3" and not (s / f"{TRACKER}.tmp").exists()
    assert checkpoints.decide(s, sft).step == 3
    save(s, 6, 8, trainer="sft", mesh=(1, 1, 2))
    os.remove(s / "global_step_6" / "data_2.pt")  # rank 0 moves the tracker before the other ranks' data files
    r = checkpoints.decide(s, sft)
    assert r.lines() == ["resume: global_step_3 — global_step_6 skipped: 3 of 4 data_<dp rank>.pt (the trainer's "
                         "dataloader state) (no stamp: made outside vrun, judged by its files only)"]
    assert checkpoints.scan(s, plan)[0].why == "no actor/ (the actor's save never began)"  # a PPO plan's eyes


# ---------------------------------------------------------------------------------------------- saves cut short
def test_a_save_cut_short_is_skipped_for_the_last_whole_one(plan, root):
    save(root, 2, 8, stamp_plan=plan)
    save(root, 4, 8, cut="shards")  # a kill mid-save: every rank's shard half written, nothing after
    r = checkpoints.decide(root, plan)
    assert (r.step, r.skipped) == (2, ()) and r.lines() == ["resume: global_step_2 (the tracker's)"]
    standin_ckpt.write_tracker(root, 4)  # a save that returned without finishing (or damaged since)
    r = checkpoints.decide(root, plan)
    assert (r.tracker_step, r.step) == (4, 2)
    assert r.lines() == ["resume: global_step_2 — global_step_4 skipped: no .metadata in actor/step_4/ (the save was "
                         "cut short)"]
    assert checkpoints.apply(r, root) is True
    assert (root / TRACKER).read_text() == "2" and replaced(root) == ["4"]
    assert checkpoints.decide(root, plan).lines() == ["resume: global_step_2 (the tracker's)"]


@pytest.mark.parametrize("how, why", [
    ({"skip_ranks": range(2, 8)}, "2 of 8 ranks' shards (__<rank>_0.distcp) in actor/step_4/ (the save was cut short)"),
    ({"cut": "rank_state", "cut_ranks": [5]},
     "7 of 8 ranks' rng_state_rank_<rank>.pt in actor/step_4/ (each rank's last file: the save was cut short)"),
    ({"cut": "rank_state", "cut_ranks": [5], "optimizer": "dist_opt"},
     "7 of 8 ranks' rng_state_rank_<rank>.pt in actor/step_4/ (each rank's last file: the save was cut short)"),
    ({"damage": "optimizer_rank_5.pt"}, "7 of 8 ranks' optimizer states (optimizer_rank_<rank>.pt) in actor/step_4/"),
    ({"cut": "driver"}, "no data.pt (verl writes it after the actor's save)"),
])
def test_each_missing_piece_is_named(plan, root, how, why):
    how = dict(how)
    damage = how.pop("damage", None)
    p = dataclasses.replace(plan, optimizer=how.get("optimizer", plan.optimizer))
    save(root, 2, 8, optimizer=p.optimizer)
    save(root, 4, 8, tracker=False, **how)
    if damage:
        os.remove(root / "global_step_4" / "actor" / "step_4" / damage)
    standin_ckpt.write_tracker(root, 4)
    r = checkpoints.decide(root, p)
    assert (r.step, r.skipped) == (2, ((4, why),))


def test_none_whole_starts_from_step_0(plan, root):
    save(root, 3, 8, cut="driver", tracker=False)
    save(root, 4, 8, cut="shards", tracker=False)
    standin_ckpt.write_tracker(root, 4)
    r = checkpoints.decide(root, plan)
    assert (r.tracker_step, r.step) == (4, None)
    assert r.lines() == ["resume: none whole: starts from step 0 — global_step_4 skipped: no .metadata in "
                         "actor/step_4/ (the save was cut short); global_step_3 skipped: no data.pt (verl writes it "
                         "after the actor's save)"]
    assert checkpoints.apply(r, root) is True
    assert not (root / TRACKER).exists() and replaced(root) == ["4"]  # verl finds no tracker: step 0
    r = checkpoints.decide(root, plan)
    assert r.step is None and r.lines() == [
        "resume: no tracker: starts from step 0",
        f"resume: global_step_4, global_step_3 on disk but no {TRACKER} (verl loads only the step the tracker names)"]
    assert checkpoints.apply(r, root) is False


# ---------------------------------------------------------------------------------------------------- the tracker
def test_a_garbled_tracker_or_one_naming_a_missing_dir(plan, root):
    save(root, 2, 8)
    save(root, 4, 8, cut="tracker")  # a kill while verl wrote the tracker: open("w") emptied it
    assert (root / TRACKER).read_text() == ""
    r = checkpoints.decide(root, plan)
    assert (r.tracker_step, r.step, r.tracker) == (None, 4, "is empty")
    assert r.lines() == ["resume: global_step_4 (the newest whole) (the tracker is empty) (no stamp: made outside "
                         "vrun, judged by its files only)"]
    checkpoints.apply(r, root)
    assert (root / TRACKER).read_text() == "4" and replaced(root) == [""]
    (root / TRACKER).write_text("forty\n")
    r = checkpoints.decide(root, plan)
    assert r.step == 4 and r.tracker == "holds 'forty', not a step number"
    (root / TRACKER).write_text(" 4\n")  # verl's int() takes it: so does the check
    assert checkpoints.decide(root, plan).lines()[0].startswith("resume: global_step_4 (the tracker's)")
    (root / TRACKER).write_text("9")
    r = checkpoints.decide(root, plan)
    assert (r.tracker_step, r.step) == (9, 4)
    assert r.skipped == ((9, "the tracker names it, but there is no global_step_9/ (verl would start from step 0)"),)
    checkpoints.apply(r, root)
    assert (root / TRACKER).read_text() == "4"


def test_verl_loads_what_apply_leaves(plan, root):
    """verl's own find_latest_ckpt_path, after apply, names the decided step (or nothing: step 0)."""
    manager = pytest.importorskip("verl.utils.checkpoint.checkpoint_manager")
    save(root, 2, 8)
    save(root, 4, 8, cut="shards", tracker=False)
    standin_ckpt.write_tracker(root, 4)
    assert manager.find_latest_ckpt_path(str(root)) == str(root / "global_step_4")  # verl alone: a broken step
    checkpoints.apply(checkpoints.decide(root, plan), root)
    assert manager.find_latest_ckpt_path(str(root)) == str(root / "global_step_2")
    os.remove(root / "global_step_2" / "data.pt")
    checkpoints.apply(checkpoints.decide(root, plan), root)
    assert manager.find_latest_ckpt_path(str(root)) is None


# --------------------------------------------------------------------------------------------------- whose save
def test_stamps_and_another_plans_checkpoint(plan, root):
    save(root, 2, 8, stamp_plan=plan)
    stamp = json.loads((root / "global_step_2" / checkpoints.STAMP).read_text())
    assert stamp["run_id"] == plan.run_id and stamp["model"] == "qwen3_5_35b" and stamp["stack"] == plan.stack
    assert {k: stamp["mesh"][k] for k in ("tp", "cp", "pp", "dp", "ep", "etp", "edp", "nnodes", "gpus_per_node",
                                          "world")} == {k: getattr(plan.mesh, k) for k in checkpoints.MESH_KEYS}
    assert checkpoints.stamp(root, 2, dataclasses.replace(plan, run_id="other")) is False  # a stamp is kept
    assert checkpoints.stamp(root, 99, plan) is False
    path = root / "global_step_2" / checkpoints.STAMP

    other_mesh = dataclasses.replace(plan, mesh=dataclasses.replace(plan.mesh, cp=4, dp=2))
    r = checkpoints.decide(root, other_mesh)
    assert r.step is None and r.refused.key == "run.resume_mesh_change"
    assert "mesh.cp 8 → 4, mesh.dp 1 → 2" in r.refused.why and "run.resume_mesh_change=true" in r.refused.fix
    assert "(mesh.cp=8)" in r.refused.fix and "hydra.run.dir=" in r.refused.fix
    assert r.lines()[0].startswith("resume: refused — global_step_2 was saved on another mesh")
    assert checkpoints.apply(r, root) is False and (root / TRACKER).read_text() == "2"
    r = checkpoints.decide(root, other_mesh, allow_mesh_change=True)
    assert r.step == 2 and r.refused is None
    assert r.lines()[1].startswith("resume: mesh change let through (run.resume_mesh_change=true): mesh.cp 8 → 4")
    assert "optimizer_rank_<rank>.pt as saved" in r.lines()[1]  # fsdp2: the optimizer's files are per rank
    placed = dataclasses.replace(plan, mesh=dataclasses.replace(plan.mesh, nnodes=2, gpus_per_node=4))
    assert checkpoints.decide(root, placed).lines()[1] == \
        "resume: mesh.nnodes 1 → 2, mesh.gpus_per_node 8 → 4: the same ranks on other machines"

    path.write_text(json.dumps({**stamp, "model": "glm5_1"}))
    r = checkpoints.decide(root, plan)
    assert r.refused.key == "model" and "saved by model glm5_1" in r.refused.why and "model=glm5_1" in r.refused.fix
    installed = plan.stack["verl"]["version"]  # whichever verl this leg runs
    path.write_text(json.dumps({**stamp, "stack": {**stamp["stack"], "verl": {"version": "0.0.1"}}}))
    r = checkpoints.decide(root, plan)
    assert r.refused.key == "stack" and f"verl 0.0.1 → {installed}" in r.refused.why
    path.write_text("{not json")
    assert "cannot be read" in checkpoints.decide(root, plan).refused.why
    os.remove(path)
    r = checkpoints.decide(root, plan)
    assert r.step == 2 and r.unstamped and "(no stamp: made outside vrun, judged by its files only)" in r.lines()[0]
    dist = dataclasses.replace(plan, optimizer="dist_opt")  # the files tell fsdp2's optimizer_rank_<rank>.pt
    r = checkpoints.decide(root, dist)
    assert r.refused.key == "optimizer" and "saved with optimizer=fsdp2" in r.refused.why


# ------------------------------------------------------------------------------------------------ hostile files
def test_hostile_files_never_hang_or_raise(plan, root, tmp_path):
    os.mkfifo(root / TRACKER)
    r = quick(checkpoints.decide, root, plan)
    assert (r.tracker_step, r.step, r.tracker) == (None, None, "is a FIFO")
    quick(checkpoints.apply, r, root)
    assert not os.path.lexists(root / TRACKER)  # moved aside: verl's open() would have blocked on it
    for p in root.glob(f"{TRACKER}.replaced-*"):
        os.remove(p)
    with open(root / TRACKER, "wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse
    r = quick(checkpoints.decide, root, plan)
    assert r.tracker == f"is {1 << 30} bytes, not a step number"
    os.remove(root / TRACKER)

    save(root, 3, 8)
    ckpt = root / "global_step_3" / "actor" / "step_3"
    os.remove(ckpt / "__3_0.distcp")
    os.mkfifo(ckpt / "__3_0.distcp")  # a FIFO named like a shard: not counted, never opened
    os.remove(root / "global_step_3" / "data.pt")
    os.mkfifo(root / "global_step_3" / "data.pt")
    r = quick(checkpoints.decide, root, plan)
    assert r.skipped == ((3, "7 of 8 ranks' shards (__<rank>_0.distcp) in actor/step_3/ (the save was cut short)"),)
    os.remove(ckpt / "__3_0.distcp")
    (ckpt / "__3_0.distcp").symlink_to(tmp_path / "elsewhere.distcp")  # a link out of the dir: not a shard
    (tmp_path / "elsewhere.distcp").write_bytes(b"x")
    assert quick(checkpoints.decide, root, plan).skipped[0][1].startswith("7 of 8 ranks' shards")

    outside = tmp_path / "outside"
    save(outside, 5, 8)
    (root / "global_step_5").symlink_to(outside / "global_step_5")  # a whole save, but not in this dir
    (root / TRACKER).write_text("5")
    r = quick(checkpoints.decide, root, plan)
    assert r.step is None and r.skipped[0] == (5, "global_step_5 is a symbolic link, not a save dir")
    os.remove(root / TRACKER)
    (root / TRACKER).symlink_to(outside / TRACKER)  # a tracker that is a link: verl would follow it out
    r = quick(checkpoints.decide, root, plan)
    assert r.tracker == "is a symbolic link" and r.step is None
    quick(checkpoints.apply, r, root)
    assert not os.path.lexists(root / TRACKER) and (outside / TRACKER).read_text() == "5"  # the target untouched
    (root / "global_step_7").mkdir()
    (root / "global_step_7" / checkpoints.STAMP).symlink_to(outside / TRACKER)
    assert quick(checkpoints.stamp, root, 7, plan) is False  # a link in the stamp's place is not written through
    assert (outside / TRACKER).read_text() == "5"
    junk = root / "global_step_8" / "actor"
    junk.mkdir(parents=True)
    (junk / "step_8").mkdir()
    (junk / "step_x").mkdir()
    assert quick(checkpoints.scan, root, plan)[0].why == "actor/step_x is there, which Megatron Lite's loader cannot " \
                                                         "order"


def test_thousands_of_steps_cut_short_are_said_in_bounded_lines(plan, root):
    """20,000 empty step dirs above the tracker (a filesystem left that way): the resume line names five and counts
    the rest, and the `resumed` event stays small (before: a 1.4 MB line, a 2.4 MB event)."""
    save(root, 2, 8, stamp_plan=plan)
    for s in range(3, 20_003):
        (root / f"global_step_{s}").mkdir()
    standin_ckpt.write_tracker(root, 20_002)
    r = quick(checkpoints.decide, root, plan, timeout=120)
    line = "; ".join(r.lines())
    assert r.step == 2 and len(r.skipped) >= 20_000
    assert len(line) < 2_000 and "more" in line, line[:300]
    assert len(json.dumps(checkpoints.resumed_fields(r))) < 4_000

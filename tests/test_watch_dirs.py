"""The watchdog's and resume's dirs are the run's own: a `stalls` link or file, a dump that fails, a `checkpoints/`
link the user made, a tracker rewritten to garbage mid-run — the stall is still recorded and acted on, nothing is
written outside the run dir or renamed through a link, and no tick raises. With the Ray job's side that needs no
cluster: where its records go, its submission id, verl's deadline from cluster.time_min, what `act` does where a
requeue cannot be done, and the plan's `watch` row per cluster (tests/test_ray_watch.py runs the real job)."""
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from vrun.launch import deadline, raywatch
from vrun.launch.watchdog import Watchdog, next_stall_dir
from vrun.planning import watch as watching
from vrun.rundir import checkpoints
from vrun.rundir.record import WatchRecord

pytestmark = pytest.mark.stack_free

STEP = "(TaskRunner pid=1) step:{n} - timing_s/step:2.5"
WATCH = WatchRecord(stall_after_s=10.0, first_step_s=100.0, on_stall="cancel", grace_s=5.0, basis="test")


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def dog(run: Path, collect=None, plan=None):
    """A watchdog on run/job.log with a clock the test moves; its events and actions in lists."""
    log = run / "job.log"
    log.write_text("")
    clock, events, acted = Clock(), [], []
    d = Watchdog(str(run), log, WATCH, record=lambda e, **f: events.append((e, f)),
                 collect=collect or (lambda n, out: (out / "h.json").write_text("{}")),
                 act=lambda *a: acted.append(a), plan=plan, clock=clock)
    with open(log, "a") as f:
        f.write(STEP.format(n=1) + "\n")
    d.tick()
    return d, clock, events, acted


def stall_and_act(d, clock, events, acted):
    clock.t += 11
    d.tick()
    clock.t += 6
    for _ in range(3):
        d.tick()
    stalled = [f for e, f in events if e == "stalled"]
    assert len(stalled) == 1 and len(acted) == 1, (events, acted)
    return stalled[0]


@pytest.mark.parametrize("kind", ["link", "file", "dangling"])
def test_a_stalls_link_or_file_is_one_line_and_the_stall_is_still_acted_on(tmp_path, kind):
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    if kind == "link":
        (run / "stalls").symlink_to(outside)
    elif kind == "dangling":
        (run / "stalls").symlink_to(tmp_path / "nowhere")
    else:
        (run / "stalls").write_text("x")
    d, clock, events, acted = dog(run)
    s = stall_and_act(d, clock, events, acted)
    assert s["dir"] is None and s["n"] == 1 and "\n" not in s["dump_error"]
    assert s["dump_error"].startswith("no dump: ") and s["summary"].endswith(s["dump_error"])
    assert ("a symbolic link" if kind != "file" else "not a directory") in s["dump_error"]
    assert list(outside.iterdir()) == [] and not (tmp_path / "nowhere").exists()
    assert acted[0][0] == "cancel"


def test_a_dump_that_fails_is_one_line_in_the_event(tmp_path):
    def collect(n, out):
        raise RuntimeError("the state API did not answer\nsecond line")

    run = tmp_path / "run"
    run.mkdir()
    s = stall_and_act(*dog(run, collect=collect))
    assert s["dump_error"] == "the dump failed: the state API did not answer" and s["dir"].endswith("stalls/1")


def test_stall_dirs_never_go_through_a_numbered_link(tmp_path):
    (tmp_path / "stalls").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "stalls" / "1").symlink_to(tmp_path / "out")
    n, d = next_stall_dir(str(tmp_path))
    assert n == 2 and d.is_dir() and not d.is_symlink() and list((tmp_path / "out").iterdir()) == []


def plan_like():
    mesh = SimpleNamespace(tp=1, cp=1, pp=1, dp=1, ep=1, etp=1, edp=1, nnodes=1, gpus_per_node=1, world=1)
    return SimpleNamespace(run_id="r1", model=SimpleNamespace(name="m"), optimizer="dist_opt", mesh=mesh, stack={})


@pytest.mark.parametrize("garbage", ["²", "٣", "12\x00", "-1", "1e3", "9" * 80])
def test_a_tracker_rewritten_to_garbage_mid_run_never_raises(tmp_path, garbage, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "global_step_2").mkdir(parents=True)
    tracker = run / "checkpoints" / checkpoints.TRACKER
    tracker.write_text("2")
    d, clock, events, _ = dog(run, plan=plan_like())
    assert d.stamped == {2}
    tracker.write_text(garbage)
    for _ in range(5):
        d.tick()  # raises nothing, says nothing
    assert "watchdog" not in capsys.readouterr().out
    (run / "checkpoints" / "global_step_3").mkdir()
    tracker.write_text("3")
    d.tick()
    assert json.loads((run / "checkpoints" / "global_step_3" / checkpoints.STAMP).read_text())["run_id"] == "r1"


def test_a_checkpoints_link_is_read_never_stamped_nor_renamed_through(tmp_path, capsys):
    run, elsewhere = tmp_path / "run", tmp_path / "big"
    run.mkdir()
    (elsewhere / "global_step_4").mkdir(parents=True)
    (elsewhere / checkpoints.TRACKER).write_text("4")
    (run / "checkpoints").symlink_to(elsewhere)
    d, clock, events, _ = dog(run, plan=plan_like())
    assert d.stamped == {4}  # read through the link
    (elsewhere / "global_step_5").mkdir()
    (elsewhere / checkpoints.TRACKER).write_text("5")
    for _ in range(3):
        d.tick()
    out = capsys.readouterr().out
    assert out.count("is a link (to ") == 1 and not (elsewhere / "global_step_5" / checkpoints.STAMP).exists()
    # the resume check: a garbled tracker in the link's target is said, never renamed nor rewritten through it
    (elsewhere / checkpoints.TRACKER).write_text("²")
    said = []
    plan = SimpleNamespace(**vars(plan_like()), resume_mesh_change=False, launcher="ppo")
    decision = checkpoints.check(run / "checkpoints", plan, said.append)
    assert (elsewhere / checkpoints.TRACKER).read_text() == "²"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["global_step_4", "global_step_5", checkpoints.TRACKER]
    assert decision.refused is None and any("is a link to" in s and "never rewritten" in s for s in said), said
    assert not checkpoints.apply(decision, run / "checkpoints")


# ---------------------------------------------------------------------------------------------- the Ray job's side
def test_records_go_to_the_run_dir_only_when_it_is_this_run(tmp_path):
    here, there = tmp_path / "copy", tmp_path / "run"
    here.mkdir()
    record = SimpleNamespace(run_dir=str(there), run_id="abc")
    p = raywatch.place(str(here), record)
    assert not p.same_run and p.dir == str(here) and "is not on this node" in p.why
    assert raywatch.place(str(there), record).same_run


@pytest.mark.parametrize("value,expect", [
    (json.dumps({"metadata": {"job_submission_id": "raysubmit_AbC123"}}), "raysubmit_AbC123"),
    (json.dumps({"metadata": {"job_submission_id": "../../x"}}), None),
    (json.dumps({"metadata": {"job_submission_id": "\x1b]52;c;x\x07"}}), None),
    (json.dumps({"metadata": ["x"]}), None), ("{", None), ("[]", None), ("", None)])
def test_the_submission_id_is_read_by_its_grammar(monkeypatch, value, expect):
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", value)
    assert raywatch.submission_id() == expect


@pytest.mark.parametrize("time_min", [0, -5, True, float("nan"), float("inf"), 10 ** 12, "240", None])
def test_no_deadline_from_a_time_min_that_is_none(time_min):
    env, end, line = deadline.ray_env("ray", time_min, 120, now=1.8e9)
    assert env == {} and end is None and line.startswith("deadline: cluster.time_min=")


def test_the_deadline_from_the_entry_or_the_head_pod(tmp_path):
    env, end, line = deadline.ray_env("ray", 240, 120, now=1.8e9)
    assert end == 1.8e9 + 14400 and env == {deadline.ESI_VAR: str(int(1.8e9 + 14400 - 180))}
    assert "from the job entry's start" in line
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    ticks = os.sysconf("SC_CLK_TCK")
    (proc / "1" / "stat").write_text("1 (sh) S " + " ".join(["0"] * 18) + f" {300 * ticks} 0 0\n")
    (proc / "stat").write_text(f"cpu 1 2 3\nbtime {int(1.8e9) - 1000}\n")
    assert deadline.container_start(str(proc)) == 1.8e9 - 700
    env, end, line = deadline.ray_env("kuberay", 10, 0, now=1.8e9, proc=str(proc),
                                      environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert end == 1.8e9 - 700 + 600 and "the head pod's start" in line
    _, end, _ = deadline.ray_env("kuberay", 10, 0, now=1.8e9, proc=str(proc), environ={})
    assert end == 1.8e9 + 600  # not under Kubernetes: process 1 is the machine's


class Ended(Exception):
    pass


def job(tmp_path, cluster, same_run=True, max_requeues=3):
    plan = SimpleNamespace(cluster=cluster, cluster_group={"name": cluster, "max_requeues": max_requeues})
    j = raywatch.Job(plan, raywatch.Place(str(tmp_path), same_run, "" if same_run else "not here"), "raysubmit_x")

    def end(code, line):
        raise Ended(code, line)

    j.end = end
    return j


def events(tmp_path):
    return [json.loads(x) for x in (tmp_path / "progress.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("cluster,same_run,words", [
    ("kuberay", True, "a pod cannot apply a RayJob"), ("ray", False, "not here, so the job cannot be submitted")])
def test_requeue_acts_as_cancel_where_it_cannot_be_done(tmp_path, cluster, same_run, words, capsys):
    with pytest.raises(Ended) as e:
        job(tmp_path, cluster, same_run).act("requeue", "stalled at step 3", [])
    assert e.value.args[0] == raywatch.STALLED_EXIT
    (act,) = [x for x in events(tmp_path) if x["event"] == "stall_action"]
    assert act["action"] == "cancelled" and words in act["why"] and act["ray_job"] == "raysubmit_x"
    assert ("vrun: event {" in capsys.readouterr().out) == (not same_run)  # the job's log holds it too


def test_requeue_stops_at_max_requeues(tmp_path):
    from vrun.rundir import records

    for _ in range(2):
        records.record(str(tmp_path), "stalled", attempt=0, step=3)
        records.record(str(tmp_path), "stall_action", attempt=0, action="requeued")
    records.record(str(tmp_path), "stalled", attempt=0, step=3)
    with pytest.raises(Ended):
        job(tmp_path, "ray", max_requeues=2).act("requeue", "s", [])
    act = events(tmp_path)[-1]
    assert act["action"] == "cancelled" and "(cluster.max_requeues=2): not submitted again" in act["why"]


def test_the_watch_row_says_what_each_cluster_gets():
    run = SimpleNamespace(stall_after_s=60, stall_grace_s=30, on_stall="requeue")
    rows = {c: watching.line(watching.policy(run, None, None, 2, "stacks by py-spy, live", c))
            for c in ("slurm", "ray", "kuberay")}
    assert "without the odd rank's node" in rows["slurm"] and "py-spy, live" in rows["slurm"]
    assert "submitted again to the same cluster" in rows["ray"] and "cannot leave the odd node out" in rows["ray"]
    assert "requeue acts as cancel on KubeRay" in rows["kuberay"] and "odd rank's node" not in rows["kuberay"]
    for c in ("ray", "kuberay"):
        assert "task pinned to the node" in rows[c] and "SIGURG" not in rows[c] and "`vrun: event`" in rows[c]


def test_the_time_limit_ends_a_ray_job_once(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("")
    clock, ended = Clock(), []
    d = raywatch.RayWatchdog(str(tmp_path), log, WATCH, record=lambda *a, **f: None, collect=None, act=None,
                             clock=clock, end_at=clock.t + 50, on_end=lambda: ended.append(clock.t))
    for _ in range(3):
        clock.t += 20
        d.tick()
    assert ended == [1060.0]


def test_a_driver_whose_stdout_is_no_file_tees_it(tmp_path):
    """Run by hand (stdout a pipe): the step lines still reach a file the watchdog tails, and the pipe."""
    import subprocess
    import sys

    code = ("import sys, time\nfrom vrun.launch import raywatch\n"
            "assert raywatch.stdout_file() is None\np = raywatch.tee_stdout()\n"
            "print('step:1 - timing_s/step:1.0', flush=True)\ntime.sleep(0.5)\n"
            "sys.stderr.write(open(p).read())\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "step:1 - timing_s/step:1.0\n" and p.stderr == p.stdout
    with open(tmp_path / "out.log", "w") as f:  # stdout a regular file (Ray's job supervisor): tailed as it is
        p = subprocess.run([sys.executable, "-c", "from vrun.launch import raywatch\n"
                            "import sys; sys.stderr.write(str(raywatch.stdout_file()))"], stdout=f,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.stderr.startswith("/proc/") and p.stderr.endswith("/fd/1")


def test_a_kuberay_plan_says_what_it_gets_and_a_copy_is_not_the_run(tmp_path):
    """mode=plan on cluster=kuberay and cluster=ray: the watch and deadline rows; requeue warned on KubeRay only.
    A run dir at the plan's path holding another run is not this run's: records go to the job's copy."""
    import shutil

    from conftest import runner
    from vrun.rundir.record import PlanRecord

    out = {}
    for c in ("kuberay", "ray"):
        p = runner("model=qwen3_5_35b", "mesh=8gpu", f"cluster={c}", "mode=plan", "run.on_stall=requeue",
                   f"hydra.run.dir={tmp_path / c}", timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        out[c] = p.stdout + p.stderr
    assert "requeue acts as cancel on KubeRay" in out["kuberay"] and "a KubeRay pod cannot apply a RayJob" in \
        out["kuberay"] and "activeDeadlineSeconds = cluster.time_min × 60" in out["kuberay"]
    assert "submitted again to the same cluster" in out["ray"] and "run.on_stall=requeue" not in out["ray"] and \
        "the job ends cluster.time_min after its entry starts" in out["ray"]
    run, copy = tmp_path / "ray", tmp_path / "copy"
    shutil.copytree(run, copy)
    record = PlanRecord.load(copy)
    assert raywatch.place(str(copy), record).same_run
    plan = json.loads((run / "plan.json").read_text())
    plan["run_id"] = "another-run"
    (run / "plan.json").write_text(json.dumps(plan))
    p = raywatch.place(str(copy), record)
    assert not p.same_run and p.dir == str(copy) and "holds another run (another-run, not " in p.why, p

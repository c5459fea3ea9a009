"""`python -m vrun <verb>` on runs of this machine: plan-only runs and sweeps, and a real local Ray hand-off
(verl's run_ppo with a task runner that holds) that is listed, inspected and cancelled. The SLURM side is in
tests/test_runs_slurm.py."""
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import PY, ROOT, runner, without_mlite
from test_handoff import grpo_env


def vrun(*args, env=None, timeout=120, stdin=None):
    e = dict(os.environ if env is None else env)
    return subprocess.run([PY, "-m", "vrun", *args], cwd=ROOT, env=e, capture_output=True, text=True,
                          timeout=timeout, stdin=stdin)


def one_error_line(proc, *needles):
    """Bad input: exit 2, a single `error: ...; fix: ...` line, no traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "; fix: " in lines[0], proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def state_dir(own_state_dir):
    return own_state_dir


def test_runs_lists_an_indexed_plan_sweep(tmp_path, state_dir):
    """A plan-only sweep lands in the index; `runs` lists every point with model, GPUs, mode, state and last
    checkpoint step, and filters by state and model."""
    # GLM-5.1's dist_opt estimate is over 80 GiB: planned with run.allow_memory_overrun
    proc = runner("-m", "model=glm5_1,qwen3_5_35b", "optimizer=fsdp2,dist_opt", "mode=plan",
                  "run.allow_memory_overrun=true", f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0, proc.stderr
    assert (state_dir / "runs.jsonl").is_file()
    listed = vrun("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert sorted(Path(r["run_dir"]).name for r in rows) == sorted(p.name for p in (tmp_path / "s").iterdir())
    by = {Path(r["run_dir"]).name: r for r in rows}
    assert by["0_glm5_1_grpo_fsdp2"]["gpus"] == 256 and by["2_qwen3_5_35b_grpo_fsdp2"]["gpus"] == 8
    assert {r["state"] for r in rows} == {"planned"} and {r["mode"] for r in rows} == {"plan"}
    table = vrun("runs", "--model", "qwen3_5_35b").stdout.splitlines()
    assert table[0].split()[:6] == ["WHEN", "MODEL", "ALGO", "GPUS", "MODE", "STATE"] and len(table) == 3
    assert all("qwen3_5_35b" in line and "planned" in line for line in table[1:])
    assert vrun("runs", "--state", "running").stdout.strip() == "no runs match"
    # verl's checkpoint layout under the run dir (trainer.default_local_dir): the last step is listed
    for step in (10, 20):
        (tmp_path / "s" / "0_glm5_1_grpo_fsdp2" / "checkpoints" / f"global_step_{step}").mkdir(parents=True)
    rows = json.loads(vrun("runs", str(tmp_path / "s" / "0_glm5_1_grpo_fsdp2"), "--json").stdout)
    assert rows[0]["checkpoint_step"] == 20
    # a point deleted since: said plainly, the rest still listed
    import shutil

    shutil.rmtree(tmp_path / "s" / "3_qwen3_5_35b_grpo_dist_opt")
    again = vrun("runs")
    assert "1 run dir(s) in" in again.stderr and len(again.stdout.splitlines()) == 4


def test_runs_of_a_sweep_dir_and_an_empty_index(tmp_path, state_dir):
    """`runs DIR` reads a sweep dir itself; with nothing indexed `runs` says where it looked and what to do."""
    empty = vrun("runs")
    one_error_line(empty, str(state_dir / "runs.jsonl"), "no runs recorded")
    proc = runner("-m", "model=glm5_1", "verl.trainer.save_freq=5,10", "mode=plan", f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(vrun("runs", str(tmp_path / "s"), "--json").stdout)
    assert [Path(r["run_dir"]).name for r in rows] != [] and len(rows) == 2


def test_status_diff_and_export_of_two_plans(tmp_path):
    """status prints the plan and state; diff shows the overrides, verl leaves, mesh and batch that differ;
    export writes a script whose verl command loads the saved config (verl's own CLI, --cfg job) and names
    secrets without their values."""
    env = dict(os.environ, WANDB_API_KEY="sekrit-export-1")
    a, b = tmp_path / "a", tmp_path / "b"
    for d, extra in ((a, []), (b, ["mesh=auto", "mesh.nnodes=16", "verl.trainer.save_freq=10", "optimizer=dist_opt"])):
        proc = runner("model=glm5_1", "mode=plan", *extra, f"hydra.run.dir={d}", env=env)
        assert proc.returncode == 0, proc.stderr
    st = vrun("status", str(a))
    assert st.returncode == 0 and "state    planned" in st.stdout and "256 GPUs = 32×8" in st.stdout
    d = vrun("diff", str(a), str(b))
    assert d.returncode == 0, d.stderr
    out = d.stdout
    assert "  trainer.save_freq: -1 → 10" in out and "  optimizer: fsdp2 → dist_opt" in out
    assert "  actor_rollout_ref.actor.engine.impl_cfg.optimizer: fsdp2 → dist_opt" in out
    assert "  trainer.nnodes: 32 → 16" in out and "  world: 256 → 128" in out and "  mesh: (absent) → auto" in out
    assert "batch: " in out and "versions: same" in out and "default_local_dir" not in out  # <run dir> compared
    same = vrun("diff", str(a), str(a))
    assert "the two runs planned the same thing" in same.stdout
    script = tmp_path / "repro.sh"
    ex = vrun("export", str(a), "-o", str(script))
    assert ex.returncode == 0, ex.stderr
    text = script.read_text()
    assert "sekrit" not in text and "WANDB_API_KEY" in text and "vrun.launch.entry" in text  # named, and said so
    assert "#   mesh: 256 GPUs = 32 node(s) × 8; dense TP1 · CP8 · PP8 · DP4" in text
    pythonpath = [line.split("=", 1)[1].strip("'\"").split(":") for line in text.splitlines()
                  if line.startswith("export PYTHONPATH=")]
    assert all(str(ROOT) not in entries for entries in pythonpath) and "python3 -m verl.trainer.main_ppo" in text
    # the exported command, without this project on the path, loads the saved config unchanged
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WANDB_API_KEY")}
    clean["PATH"] = f"{Path(PY).parent}:{clean['PATH']}"
    run = subprocess.run(["bash", str(script), "--cfg", "job"], cwd=tmp_path, env=clean, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    saved = yaml.safe_load((a / "verl_config.yaml").read_text())
    lines = run.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{next(iter(saved))}:"))
    assert yaml.safe_load("\n".join(lines[start:])) == saved


def test_bad_input_is_one_line(tmp_path):
    """Unknown dir, a dir that is not a run, a plan that was never started, plan.json of another format."""
    one_error_line(vrun("status", str(tmp_path / "nope")), "no such directory")
    (tmp_path / "empty").mkdir()
    one_error_line(vrun("logs", str(tmp_path / "empty")), "not a run dir")
    proc = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 0, proc.stderr
    one_error_line(vrun("cancel", str(tmp_path / "r")), "never started", "nothing to cancel")
    one_error_line(vrun("resubmit", str(tmp_path / "r")), "never submitted to SLURM")
    one_error_line(vrun("logs", str(tmp_path / "r")), "planned, not run (mode=plan, cluster=local)", "mode=train")
    assert "measured nothing: planned, not run (mode=plan)" in vrun("status", str(tmp_path / "r")).stdout
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    from vrun.rundir.record import FORMAT

    assert plan["format"] == FORMAT
    for fmt, word in ((None, "older"), (99, "newer")):
        p = dict(plan)
        if fmt is None:
            p.pop("format")
        else:
            p["format"] = fmt
        (tmp_path / "r" / "plan.json").write_text(json.dumps(p))
        for verb in (["status"], ["export"], ["diff", str(tmp_path / "r")]):
            one_error_line(vrun(*verb, str(tmp_path / "r")), f"written by an {word} vrun")
        listed = vrun("runs", str(tmp_path / "r"))
        assert listed.returncode == 0 and f"written by an {word} vrun" in listed.stderr
        assert "Traceback" not in listed.stderr


def test_local_preflight_failure_is_the_runs_state(tmp_path):
    """A preflight on this machine that fails leaves the run failed, with the first error it printed."""
    proc = runner("model=qwen3_5_35b", "mode=preflight", f"hydra.run.dir={tmp_path}/r",
                  env=without_mlite(grpo_env(tmp_path)))
    assert proc.returncode == 2 and "error: MLITE_ROOT=" in proc.stderr
    first = next(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    s = json.loads(vrun("status", str(tmp_path / "r"), "--json").stdout)
    assert s["state"] == "failed" and s["failure"]["error"] == first
    assert s["failure"]["node"] == socket.gethostname()


def test_help_for_every_verb():
    """Each verb answers --help, and make help and the README list every verb the parser has."""
    from vrun.runs.cli import parser

    verbs = sorted(parser()._subparsers._group_actions[0].choices)
    assert verbs == sorted(["runs", "status", "show", "logs", "cancel", "diff", "export", "resubmit"])
    make = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True).stdout
    readme = (ROOT / "README.md").read_text()
    for verb in verbs:
        proc = vrun(verb, "--help")
        assert proc.returncode == 0 and f"usage: python -m vrun {verb}" in proc.stdout
        assert f"python -m vrun {verb} " in make and f"python -m vrun {verb} " in readme, verb


def descendants(pid: int) -> set:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = subprocess.run(["pgrep", "-P", str(p)], capture_output=True, text=True).stdout.split()
        for k in map(int, kids):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


@pytest.mark.ray
def test_local_ray_run_listed_inspected_and_cancelled(tmp_path, state_dir):
    """mode=train on this machine: a real local Ray instance and verl's run_ppo with a task runner that holds.
    While it holds: runs/status say training started; cancel stops the driver and every process it started
    (Ray included) and marks the run cancelled; a second cancel is refused naming that state."""
    env = dict(grpo_env(tmp_path), VRUN_STATE_DIR=str(state_dir))
    run = tmp_path / "run"
    proc = subprocess.Popen([PY, str(ROOT / "runner.py"), "model=qwen3_5_35b", "mesh=8gpu", "mode=train",
                             "cluster=local", "cluster.ray.num_gpus=8", "cluster.ray.num_cpus=2",
                             "run.task_runner=vrun_hold.HoldTaskRunner", f"hydra.run.dir={run}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (run / "hold.json").exists():
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the task runner never started"
            time.sleep(1)
        st = vrun("status", str(run), env=env)
        assert st.returncode == 0 and "state    running: training started" in st.stdout, st.stdout + st.stderr
        rows = json.loads(vrun("runs", "--json", env=env).stdout)
        assert [(r["state"], r["mode"], r["gpus"]) for r in rows] == [("running", "train", 8)]
        driver = json.loads(next(line for line in (run / "progress.jsonl").read_text().splitlines()
                                 if '"entrypoint_started"' in line))["pid"]
        started = descendants(driver) | {driver}
        assert len(started) > 2  # the driver, Ray's GCS and raylet, the worker holding
        c = vrun("cancel", str(run), env=env, timeout=200)
        assert c.returncode == 0 and "cancelled process" in c.stdout and "stopped:" in c.stdout, c.stdout + c.stderr
        proc.wait(timeout=120)
        deadline = time.monotonic() + 60
        while [p for p in started if Path(f"/proc/{p}").exists() and "(Z)" not in
               (Path(f"/proc/{p}/stat").read_text() if Path(f"/proc/{p}/stat").exists() else "(Z)")]:
            assert time.monotonic() < deadline, "processes of the cancelled run still alive"
            time.sleep(1)
        st = vrun("status", str(run), "--json", env=env)
        assert json.loads(st.stdout)["state"] == "cancelled"
        one_error_line(vrun("cancel", str(run), env=env), "has ended: cancelled")
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)


@pytest.mark.parametrize("recorded", ["0", "00", "-3", "7+0", "7;id", "７", "12_[0-3]"])
def test_cancel_refuses_what_is_not_a_job_id(tmp_path, recorded):
    """A run dir whose record names a job id SLURM never prints (job 0, a het component, an option, a range):
    one line, nothing cancelled (no squeue or scancel on PATH here: nothing could have been run)."""
    d = tmp_path / "r"
    proc = runner("model=glm5_1", "mode=plan", "cluster=slurm", f"hydra.run.dir={d}")
    assert proc.returncode == 0, proc.stderr
    (d / "slurm_job.json").write_text(json.dumps({"job_id": recorded, "folder": str(tmp_path / "sub")}))
    env = {**os.environ, "PATH": os.path.dirname(PY)}
    line = one_error_line(vrun("cancel", str(d), env=env), str(d / "slurm_job.json"), "not a SLURM job id")
    assert recorded not in line.replace(str(d), "")
    (d / "slurm_job.json").write_text(json.dumps({"job_id": "7", "folder": str(tmp_path / "sub")}))
    (d / "progress.jsonl").write_text(json.dumps({"event": "submitted", "t": time.time(), "job_id": recorded,
                                                  "work_dir": str(ROOT)}) + "\n")
    one_error_line(vrun("cancel", str(d), env=env), f"run={d}: squeue cannot be run here", "nothing cancelled")

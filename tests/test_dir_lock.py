"""One writer per run or sweep dir (vrun.rundir.lock): the real runner, racing itself or meeting a process that holds
the dir's lock, through each door that writes a dir (a run's hydra.run.dir, a sweep's hydra.sweep.dir)."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import PY, ROOT
from test_runs import one_error_line

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

DOORS = {  # what plans into dir d: (runner arguments, the key the refusal names, the run dirs it writes)
    "run": (lambda d, tag: ["model=glm5_1", "mode=plan", f"verl.trainer.save_freq={tag}", f"hydra.run.dir={d}"],
            "hydra.run.dir", lambda d, tag: [d]),
    "sweep": (lambda d, tag: ["-m", "model=glm5_1", "mode=plan", "verl.trainer.save_freq=5,10",
                              f"hydra.sweep.subdir=p{tag}_${{hydra.job.num}}", f"hydra.sweep.dir={d}"],
              "hydra.sweep.dir", lambda d, tag: [d / f"p{tag}_0", d / f"p{tag}_1"]),
}


def start(*args, env=None):
    return subprocess.Popen([PY, str(ROOT / "runner.py"), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def holder(d):
    """Another process holding d's lock (the runner's own code), until killed; its pid once it holds it."""
    p = subprocess.Popen([PY, "-c", "import sys, time\nfrom vrun.rundir import lock\n"
                          f"print(lock.take({str(d)!r}, 'x'), flush=True)\ntime.sleep(300)"], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "None"
    return p


@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_held_dir_is_refused_in_one_line(tmp_path, door):
    """While another process holds the dir: one line naming the dir and the holder's pid, exit 2, nothing written;
    once the holder is gone (killed: its lock file left behind), the same command plans."""
    args, key, dirs = DOORS[door]
    d = tmp_path / "d"
    h = holder(d)
    try:
        p = start(*args(d, 5))
        out, err = p.communicate(timeout=300)
        line = one_error_line(subprocess.CompletedProcess(p.args, p.returncode, out, err), f"{key}={d}: ",
                              f"pid {h.pid}", f"wait for pid {h.pid} to end")
        assert sorted(os.listdir(d)) == [".vrun.lock"], (line, os.listdir(d))
    finally:
        h.send_signal(signal.SIGKILL)
        h.wait()
    p = start(*args(d, 5))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert all((r / "plan.json").is_file() for r in dirs(d, 5)) and not (d / ".vrun.lock").exists()


@pytest.mark.parametrize("door", sorted(DOORS))
def test_writers_racing_into_one_dir_leave_one_plan(tmp_path, door):
    """Three runners started together, each with its own plan for the same dir: exactly one writes; the others are
    refused in one line (the lock, or the winner's files found under it — as many of its points as it had written
    when the loser's first look, before the lock, saw them); the dir holds the winner's plan only."""
    args, key, dirs = DOORS[door]
    d = tmp_path / "d"
    tags = (5, 10, 20)
    procs = {t: start(*args(d, t)) for t in tags}
    done = {t: p.communicate(timeout=600) + (p.returncode,) for t, p in procs.items()}
    won = [t for t in tags if done[t][2] == 0]
    assert len(won) == 1, {t: done[t][1][-500:] for t in tags}
    for t in set(tags) - set(won):
        _, err, rc = done[t]
        lines = [line for line in err.strip().splitlines() if not line.startswith("warning: ")]
        assert rc == 2 and "Traceback" not in err and all(x.startswith(("error: ", "sweep: ")) for x in lines), err
        assert ("another process (pid " in err and f"{key}={d}: " in err) or "holds another run's files" in err \
            or any(f"holds {k} point(s) of an earlier sweep" in err for k in (1, 2)), err
    runs = sorted(p.parent for p in d.rglob("plan.json"))
    assert runs == sorted(dirs(d, won[0])), runs
    for r in runs:
        cfg = json.loads((r / "manifest.json").read_text())
        assert f"verl.trainer.save_freq={won[0]}" in json.dumps(cfg) or door == "sweep", cfg


def test_a_linked_lock_file_is_refused(tmp_path):
    """A .vrun.lock planted as a symbolic link: refused in one line, the link's target untouched."""
    d, target = tmp_path / "d", tmp_path / "elsewhere"
    d.mkdir()
    target.write_text("keep\n")
    (d / ".vrun.lock").symlink_to(target)
    p = start("model=glm5_1", "mode=plan", f"hydra.run.dir={d}")
    out, err = p.communicate(timeout=300)
    one_error_line(subprocess.CompletedProcess(p.args, p.returncode, out, err), f"hydra.run.dir={d}: ",
                   ".vrun.lock is a symbolic link")
    assert target.read_text() == "keep\n" and sorted(os.listdir(d)) == [".vrun.lock"]


def test_resubmit_waits_for_no_one(tmp_path):
    """resubmit into a run dir another process holds: one line naming the holder; nothing submitted."""
    d = tmp_path / "r"
    p = start("model=glm5_1", "mode=plan", "cluster=slurm", f"hydra.run.dir={d}")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    (d / "slurm_job.json").write_text(json.dumps({"job_id": "7", "folder": str(tmp_path / "sub"), "stdout": "x",
                                                  "stderr": "y"}))
    from vrun.rundir import records

    records.record(str(d), "submitted", job_id="7", restart=0, attempt=0, work_dir=str(ROOT))
    records.record(str(d), "failed", job_id="7", restart=0, attempt=0, node="sbatch", error="not submitted: test")
    h = holder(d)
    try:
        r = subprocess.run([PY, "-m", "vrun", "resubmit", str(d)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PATH": os.path.dirname(sys.executable)})  # no sbatch
        one_error_line(r, f"run={d}: ", f"pid {h.pid}")
    finally:
        h.send_signal(signal.SIGKILL)
        h.wait()
    assert [e["event"] for e in records.events(str(d))] == ["submitted", "failed"]

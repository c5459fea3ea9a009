"""The read verbs write nothing: `python -m vrun status`, `runs` and `logs` leave a run dir's files as they found them
(every name, size and mtime, the dirs' own included). Here a SLURM run dir and a local one, written as their jobs
write them (progress lines, submitit's logs, job.log); a cluster=ray run dir, its job's entry recording its own start,
end and log, is held to the same on a real Ray cluster in tests/test_rayjobs.py (`unchanged_by_the_read_verbs`)."""
import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import PY, ROOT, record_json
from vrun.rundir import records

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

STEPS = "".join(f"(TaskRunner pid=1) step:{i} - timing_s/step:{40 + i}.5 - timing_s/gen:{20 + i}.0\n" for i in range(1, 6))


def snapshot(d: Path) -> dict:
    """Every path under d (and d itself): its kind, size and mtime in nanoseconds, links not followed."""
    out = {}
    for p in [d, *sorted(d.rglob("*"))]:
        st = p.lstat()
        out[str(p.relative_to(d))] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return out


def read_verbs(run: Path) -> list:
    """The argument lists of every read verb on one run dir."""
    return [["status", str(run)], ["status", str(run), "--json"], ["runs", str(run)], ["runs", str(run), "--json"],
            ["logs", str(run)]]


def unchanged_by_the_read_verbs(run: Path, vr) -> dict:
    """Runs every read verb through vr(*args) (a CompletedProcess back) and asserts the run dir is as it was; returns
    {verb's arguments joined: its CompletedProcess} for the caller's own checks of what they printed."""
    before = snapshot(run)
    done = {" ".join(a[:1] + a[2:]): vr(*a) for a in read_verbs(run)}
    after = snapshot(run)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"the read verbs changed {changed} in {run}"
    return done


def vrun(*args, env=None):
    return subprocess.run([PY, "-m", "vrun", *args], cwd=ROOT, env=env or dict(os.environ), capture_output=True,
                          text=True, timeout=120)


def test_the_snapshot_sees_a_written_file(tmp_path):
    """The check itself: a file added, grown or touched is seen (a check that cannot fail is no check)."""
    (tmp_path / "a").write_text("x")
    before = snapshot(tmp_path)
    os.utime(tmp_path / "a", ns=(1, 1))
    assert snapshot(tmp_path) != before
    before = snapshot(tmp_path)
    (tmp_path / "b").write_text("")
    assert set(snapshot(tmp_path)) - set(before) == {"b"}


def test_the_read_verbs_write_nothing_in_a_slurm_run_dir(tmp_path):
    """A SLURM run that ran two nodes and exited 0: its progress lines, slurm_job.json and submitit's logs (its step
    lines) read by every verb, SLURM's queue asked where it answers; nothing in the run dir changes."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps(record_json(run, mode="train", cluster="slurm")))
    folder = tmp_path / "sub" / "%j"
    (run / "slurm_job.json").write_text(json.dumps({"job_id": "7", "folder": str(folder), "stdout": "x", "stderr": "y"}))
    for event, fields in (("submitted", {"job_id": "7"}), ("started", {"job_id": "7", "restart": 0, "hosts": ["n0", "n1"]}),
                          ("entrypoint_started", {"job_id": "7", "restart": 0, "node": 0}),
                          ("exited", {"job_id": "7", "restart": 0, "node": 0, "rc": 0})):
        records.record(str(run), event, **fields)
    logs = tmp_path / "sub" / "7"
    logs.mkdir(parents=True)
    (logs / "7_0_log.out").write_text(STEPS)
    (logs / "7_0_log.err").write_text("")
    done = unchanged_by_the_read_verbs(run, vrun)
    assert all(p.returncode == 0 for p in done.values()), {k: p.stderr[-500:] for k, p in done.items()}
    s = json.loads(done["status --json"].stdout)
    assert s["state"] == "completed" and s["measured"]["steps"] == 5, s
    assert "step:5" in done["logs"].stdout


def test_the_read_verbs_write_nothing_in_a_local_run_dir(tmp_path):
    """A run on this machine that exited 0, its output teed into job.log: every verb reads it; nothing changes."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps(record_json(run, mode="train", cluster="local")))
    records.record(str(run), "started", attempt=0, pid=os.getpid(), host=socket.gethostname())
    records.record(str(run), "exited", attempt=0, rc=0)
    (run / "job.log").write_text(STEPS)
    done = unchanged_by_the_read_verbs(run, vrun)
    assert all(p.returncode == 0 for p in done.values()), {k: p.stderr[-500:] for k, p in done.items()}
    s = json.loads(done["status --json"].stdout)
    assert s["state"] == "completed" and s["measured"]["steps"] == 5, s["measured"]
    assert "step:5" in done["logs"].stdout

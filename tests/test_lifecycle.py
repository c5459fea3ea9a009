"""A run's state across its attempts, from its own progress lines, SLURM's record of its jobs (squeue --states=all as
the CI harness's Slurm 22.05 prints it; sacct where accounting works) and, for a job SLURM has forgotten, its log.
No SLURM needed: the records are SLURM's printed lines, the run dirs real ones (tests/test_slurm_lifecycle.py holds
the same endings to a real cluster)."""
import json
import time

import pytest

from conftest import record_json
from vrun.rundir import jobs, records, state
from vrun.rundir.cause import ending, marker, since

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    data = record_json(d, mode="train", cluster="slurm")
    (d / "plan.json").write_text(json.dumps(data))
    folder = tmp_path / "sub" / "%j"
    (d / "slurm_job.json").write_text(json.dumps({"job_id": "7", "folder": str(folder), "stdout": "x", "stderr": "y"}))
    return d


def ev(d, event, **f):
    records.record(str(d), event, **f)


def started(d, job="7", restart=0, hosts=("n0", "n1")):
    ev(d, "started", job_id=job, restart=restart, hosts=list(hosts))
    ev(d, "entrypoint_started", job_id=job, restart=restart, node=0)


def squeue_line(job="7", st="RUNNING", reason="None", restarts=0, nodes="n[0-1]", end="2026-12-05T01:02:21"):
    return f"{job}|{st}|{reason}|{restarts}|{nodes}|{end}|wrap|"


def state_of(d, *lines, sacct_text=None):
    r = state.load(d)
    known = jobs.parse_squeue("\n".join(lines))
    if sacct_text is not None:
        known = {**jobs.parse_sacct(sacct_text), **known}
    state.follow(r, known)
    return r


def log(d, job, text, node=0, stream="err"):
    folder = d.parent / "sub" / job
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{job}_{node}_log.{stream}", "a") as f:
        f.write(text)


def test_squeue_and_sacct_lines_parse():
    """squeue's `-O Field:|` lines and sacct's -P lines as Slurm 22.05 prints them; junk is skipped, never raised."""
    got = jobs.parse_squeue("1|CANCELLED|None|0|n0|2026-12-05T00:49:47|wrap|\n4|PENDING|BeginTime|1||2026-12-05T01:02:06|"
                            "wrap|\n|||\nnot a line\n3|TIMEOUT|TimeLimit|0|n0|Unknown|wrap|")
    assert got["1"].state == "CANCELLED" and got["1"].reason == "" and not got["1"].active
    assert got["4"].restarts == 1 and got["4"].active and got["4"].reason == "BeginTime"
    assert got["3"].end is None and got["3"].state == "TIMEOUT" and set(got) == {"1", "3", "4"}
    acct = jobs.parse_sacct("9|NODE_FAIL|0:0|n1|2026-12-05T01:00:00|None\n9|CANCELLED by 0|0:15|n0|Unknown|None\n")
    assert acct["9"].state == "CANCELLED" and acct["9"].restarts == 1 and acct["9"].source == "sacct"


def test_debian_slurmstepd_endings_are_read():
    """Debian's slurmstepd names itself with the node: its cancel, time-limit and node-failure lines are endings."""
    assert ending(["slurmstepd-n0: error: *** JOB 3 ON n0 CANCELLED AT 2026-12-05T00:51:21 DUE TO TIME LIMIT ***"])[0] \
        == "timeout"
    assert ending(["slurmstepd-n0: error: *** JOB 1 ON n0 CANCELLED AT 2026-12-05T00:49:47 ***"])[0] == "cancelled"
    assert ending(["slurmstepd: error: *** JOB 1 ON gpu-a12 CANCELLED AT 2026-12-05T00:49:47 ***"])[0] == "cancelled"
    assert ending(["srun: error: Node failure on n1"])[0] == "node_fail"
    assert ending(["RuntimeError: boom"]) is None


def test_an_attempt_is_read_from_its_marker_on():
    """A log appended across attempts: the earlier attempt's lines are not the later one's cause."""
    lines = [marker("7", 0, "n0"), "srun: error: Node failure on n1", marker("7", 1, "n0"), "ok"]
    assert since(lines, "7.1") == ["ok"] and since(lines, "7.0")[0].startswith("srun") is False or True
    assert since(lines, "7.0") == lines[1:] and since(lines, "8.0") == lines


def test_node_failure_requeued_by_slurm_is_not_a_failure(run_dir):
    """SLURM requeued the job after a node failure (restart count 1, pending): node 0's failure line is the old
    attempt's, the run is `requeued` and active (so cancel works and resubmit refuses)."""
    started(run_dir)
    ev(run_dir, "failed", job_id="7", restart=0, node=0, error="the driver was stopped by signal 15")
    log(run_dir, "7", f"{marker('7', 0, 'n0')}\nsrun: error: Node failure on n1\n")
    r = state_of(run_dir, squeue_line(st="PENDING", reason="BeginTime", restarts=1, nodes=""))
    assert r.state == "requeued" and r.active and r.attempt == 1 and r.restarts == 1
    assert r.attempts[0].state == "requeued" and "node failure" in r.attempts[0].end
    assert r.attempts[0].end == "requeued after node failure on n1"
    text = state.describe(r)
    assert text.startswith("requeued after node failure") and "BeginTime" in text, text
    # the new attempt starts: running, its earlier attempt named
    started(run_dir, restart=1)
    r = state_of(run_dir, squeue_line(restarts=1))
    assert r.state == "running" and r.attempt == 1 and "after requeued after node failure" in state.describe(r)
    assert r.failure is None


def test_cancelled_outside_while_running_and_while_pending(run_dir, tmp_path):
    """An scancel from outside: while running it is `cancelled outside vrun (scancel) while running`, not a failure
    by signal; while pending, `... while pending (never started)`, never blamed on storage."""
    started(run_dir)
    ev(run_dir, "failed", job_id="7", restart=0, node=0, error="the driver was stopped by signal 15")
    r = state_of(run_dir, squeue_line(st="CANCELLED", nodes="n[0-1]"))
    assert r.state == "cancelled" and r.phase == "cancelled outside vrun (scancel) while running", r.phase
    other = tmp_path / "pending"
    other.mkdir()
    (other / "plan.json").write_text(json.dumps(record_json(other, mode="train", cluster="slurm")))
    (other / "slurm_job.json").write_text(json.dumps({"job_id": "8", "folder": str(tmp_path / "f" / "%j"),
                                                        "stdout": str(tmp_path / "f/8/8_0_log.out")}))
    ev(other, "submitted", job_id="8", restart=0, attempt=0)
    r = state_of(other, squeue_line(job="8", st="CANCELLED", reason="BeginTime", nodes=""))
    assert r.state == "cancelled" and r.phase == "cancelled outside vrun while pending (never started)"
    # forgotten by SLURM, no accounting: gone before it started, said so without blaming storage
    r = state_of(other)
    assert r.state == "lost" and "before it started" in r.phase and "cancelled outside vrun" in r.phase


def test_cancelled_by_vrun_is_named(run_dir):
    started(run_dir)
    ev(run_dir, "cancelled", job_id="7", restart=0, job_ids=["7"])
    r = state_of(run_dir, squeue_line(st="CANCELLED"))
    assert r.state == "cancelled" and not r.active


def test_time_limit_with_and_without_requeue(run_dir):
    """The job's own requeue at its time limit is a new attempt once SLURM restarted it (never before); with no
    requeue left the attempt ends `timeout` with the step it saved, not `failed`."""
    started(run_dir)
    ev(run_dir, "signalled", job_id="7", restart=0, why="the time limit (step 40 saved)", step=40)
    r = state_of(run_dir, squeue_line(restarts=0))
    assert r.state == "running" and r.attempt == 0  # signalled, but no requeue has happened yet
    r = state_of(run_dir, squeue_line(st="PENDING", reason="BeginTime", restarts=1, nodes=""))
    assert r.state == "requeued" and r.attempts[0].end == "requeued after the time limit (step 40 saved)"
    started(run_dir, restart=1)
    ev(run_dir, "time_limit", job_id="7", restart=1, requeued=False, step=60,
       why="no requeue left (cluster.max_requeues=1)")
    ev(run_dir, "failed", job_id="7", restart=1, node=0, error="UncompletedJobError")
    r = state_of(run_dir, squeue_line(st="FAILED", restarts=1))
    assert r.state == "timeout" and r.phase == "time limit: step 60 saved; no requeue left (cluster.max_requeues=1)"
    # SLURM's own TIMEOUT (the job killed at the limit) reads the same, the step from the checkpoint dir
    ck = run_dir / "checkpoints"
    ck.mkdir()
    (ck / "latest_checkpointed_iteration.txt").write_text("80")
    started(run_dir, job="9", restart=0)
    r = state_of(run_dir, squeue_line(job="9", st="TIMEOUT", reason="TimeLimit"))
    assert r.state == "timeout" and r.phase == "time limit: step 80 saved" and r.job_id == "9"


def test_forgotten_job_read_from_its_log(run_dir):
    """Past MinJobAge, without accounting: the attempt's own log segment says how it ended."""
    started(run_dir)
    log(run_dir, "7", "slurmstepd-n0: error: *** JOB 7 ON n0 CANCELLED AT x DUE TO TIME LIMIT ***\n"
        f"{marker('7', 0, 'n0')}\nslurmstepd-n0: error: *** JOB 7 ON n0 CANCELLED AT 2026-12-05T00:49:47 ***\n")
    r = state_of(run_dir)
    assert r.state == "cancelled" and "outside vrun" in r.phase  # the earlier attempt's time limit is not this one's


def test_stall_shows_in_the_state_until_a_step_comes(run_dir):
    started(run_dir)
    ev(run_dir, "stalled", job_id="7", restart=0, n=1, step=12, summary="stalled at step 12 for 1m02s: 7 ranks in "
       "all_reduce, rank 5 on n1 in data loading → stalls/1/", dir=str(run_dir / "stalls/1"))
    r = state_of(run_dir, squeue_line())
    assert r.state == "running" and "rank 5 on n1 in data loading" in state.describe(r) and r.stall["n"] == 1
    time.sleep(0.01)
    ev(run_dir, "unstalled", job_id="7", restart=0, n=1, step=13)
    r = state_of(run_dir, squeue_line())
    assert r.stall is None and "stalled" not in state.describe(r)


def test_terminal_gets_text():
    """OSC 52 (a clipboard write), a screen clear, a cursor move and C1 controls print as their characters; colours
    stay on a terminal only; tabs stay."""
    from vrun.core.text import visible

    evil = "a\x1b]52;c;ZXZpbA==\x07b\x1b[2J\x1b[1;1H\x9b31m\tc\x1b[31mred\x1b[0m\r"
    shown = visible(evil)
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown and "\r" not in shown
    assert shown.startswith("a\\x1b]52;c;ZXZpbA==\\x07b") and "\tc" in shown and "red" in shown
    kept = visible(evil, colours=True)
    assert "\x1b[31m" in kept and "\x1b[0m" in kept and "\x1b]" not in kept and "\x1b[2J" not in kept


def test_status_shows_a_stall_and_earlier_attempts_without_controls(run_dir, monkeypatch, capsys):
    """status: the stall's summary and stacks dir, each earlier attempt and how it ended, the checkpoint resumed
    from; a job's output carrying escape sequences prints as text."""
    from vrun.runs import cli

    monkeypatch.setattr(jobs, "squeue", lambda run=None: jobs.parse_squeue(squeue_line(restarts=1)))
    started(run_dir)
    log(run_dir, "7", f"{marker('7', 0, 'n0')}\nsrun: error: Node failure on n1\n\x1b]52;c;ZXZpbA==\x07\n")
    ev(run_dir, "failed", job_id="7", restart=0, node=0, error="boom \x1b]52;c;ZXZpbA==\x07")
    started(run_dir, restart=1)
    ev(run_dir, "resumed", job_id="7", restart=1, step=30, line="resume: global_step_30 — global_step_40 skipped: "
       "no .metadata (the save was cut short)")
    ev(run_dir, "stalled", job_id="7", restart=1, n=1, step=31, summary="stalled at step 31 for 20 s: 7 ranks in "
       "all_reduce, rank 5 on n1 in data loading → stalls/1/", dir=str(run_dir / "stalls/1"))
    assert cli.main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "stall    stalled at step 31 for 20 s: 7 ranks in all_reduce, rank 5 on n1 in data loading" in out
    assert "  attempt 0: job 7 on n0,n1: requeued after node failure on n1" in out
    assert "restarts 1" in out and "resumed  resume: global_step_30 — global_step_40 skipped" in out
    assert "\x1b" not in out and "\\x1b]52" in out
    assert cli.main(["runs", str(run_dir)]) == 0
    table = capsys.readouterr().out
    assert "↳ running: stalled at step 31" in table and "1 restart(s)" in table


@pytest.mark.parametrize("j", ["1", "7", "123456", "12_0", "12_31", 9])
def test_job_ids_as_sbatch_prints_them(j):
    assert records.job_id_ok(j)


@pytest.mark.parametrize("j", ["0", 0, "00", "007", "-1", -5, "1+0", "12+1", "12_", "_3", "12_01", "1 2", "1;rm -rf",
                               "", " 1", "1\n", "1e3", "１", "12_[0-3]", True, None, 1.0, "1" * 21])
def test_what_is_not_a_job_id(j):
    """Job 0, a het job's component, an array range, spaces, signs, non-ASCII digits: never a job to act on."""
    assert not records.job_id_ok(j)


@pytest.mark.parametrize("name,work_dir,why", [
    ("qwen_grpo", "/w/a", ""), ("qwen_grpo", "/w/a/", ""), ("qwen_grpo", "/w/./a", ""),
    ("other", "/w/a", "is named 'other' in squeue, not 'qwen_grpo'"),
    ("qwen_grpo_", "/w/a", "is named 'qwen_grpo_' in squeue"), ("QWEN_GRPO", "/w/a", "is named 'QWEN_GRPO'"),
    ("qwen_grpo", "/w/b", "runs in /w/b in squeue, not /w/a"), ("qwen_grpo", "/w/a/b", "runs in /w/a/b"),
    ("qwen_grpo", "", "runs in (no dir) in squeue")])
def test_squeue_confirms_a_job_by_name_and_work_dir(name, work_dir, why):
    """squeue's Name and WorkDir (its `-O ...:|` line, WorkDir last) against the plan's job name and the dir the
    submission ran sbatch in."""
    job = jobs.parse_squeue(f"41|RUNNING|None|0|n0|2026-12-05T01:02:21|{name}|{work_dir}|")["41"]
    got = jobs.not_this_runs(job, "qwen_grpo", "/w/a")
    assert (got == "") if not why else got.startswith(why), got
    assert jobs.not_this_runs(job, None, "/w/a").startswith("cannot be matched")
    assert jobs.not_this_runs(job, "qwen_grpo", None).startswith("cannot be matched")


def test_a_work_dir_with_the_separator_in_it_is_read_whole():
    assert jobs.parse_squeue("5|PENDING|Priority|0||Unknown|n|/w/a|b|\n")["5"].work_dir == "/w/a|b"


def test_a_resubmission_shows_only_its_own_steps(run_dir):
    """A waiting resubmission (cluster.detach=false, `resubmit` without --detach) prints the new job's steps once
    each, never the earlier attempt's lines again (before: every recorded line from the run's first, under the
    new job's poll)."""
    import io
    from types import SimpleNamespace

    from vrun.launch.slurm import watch

    started(run_dir, job="7")
    ev(run_dir, "failed", job_id="7", restart=0, node=0, error="the driver exited 1: ValueError: old attempt")
    ev(run_dir, "submitted", job_id="8", restart=0, attempt=1)
    started(run_dir, job="8", hosts=("n1", "n2"))
    ev(run_dir, "exited", job_id="8", restart=0, node=0, rc=0)
    out = io.StringIO()
    watch.until_done([(SimpleNamespace(job_id="8"), str(run_dir))], out, poll_s=0.01)
    lines = out.getvalue().splitlines()
    # each line the new job's state (naming what came before it, as status does), none an earlier attempt's own
    assert lines and all(line.startswith("job 8 ") for line in lines), lines
    assert not any("started on n0,n1" in line or line.startswith("job 8 run: failed") for line in lines), lines
    assert any("running: started on n1,n2" in line for line in lines) and "completed" in lines[-1], lines

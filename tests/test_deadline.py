"""verl's pre-deadline save fed by the node (vrun/launch/deadline.py) and judged by the plan
(vrun/estimate/timelimit.py): the installed verl's own should_save_ckpt_esi under the environment the node sets, the
same function as the a6ef5009 and 1dda039b wheels hold it, SLURM's end time as Slurm 22.05.8 (Debian, the CI
harness) prints it, and the plan's arithmetic."""
import glob
import os
import time
import zipfile
from types import SimpleNamespace

import pytest

from vrun.estimate import timelimit as tl
from vrun.launch import deadline

VAR = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
STACK = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "stack")
# the three verls in use; for each, whether its trainers call should_save_ckpt_esi and trainer.use_v1's default
VERLS = {
    "0.9.1": {"legacy": True, "v1": False, "sft": False, "use_v1": True},
    "a6ef5009": {"legacy": True, "v1": False, "sft": False, "use_v1": False},
    "1dda039b": {"legacy": True, "v1": False, "sft": False, "use_v1": True},
}
INSTALLED_AS = {"0.9.1": "0.9.1", "0.9.0.dev0": "a6ef5009", "0.10.0.dev0": "1dda039b"}
TAGS = ["installed", "a6ef5009", "1dda039b"]

# Slurm 22.05.8 (Debian 12's slurm-client 22.05.8-4+deb12u3), seen on the CI harness with TZ=UTC0
SQUEUE_RUNNING = "2026-12-05T02:28:25\n"              # squeue -h -j 33 -o %e
SQUEUE_O_PADDED = "2026-12-05T02:36:29 \n"            # squeue -h -j 28 -O EndTime (padded to 20)
SQUEUE_UNLIMITED = "NONE\n"                           # -t 0 (TimeLimit=UNLIMITED)
SQUEUE_PENDING = "N/A\n"                              # held
SCONTROL_RUNNING = (
    "JobId=33 JobName=vrun-deadline-probe UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901728 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=0:0 RunTime=00:00:04 TimeLimit=00:03:00 TimeMin=N/A SubmitTime=2026-12-05T02:25:25 "
    "EligibleTime=2026-12-05T02:25:25 AccrueTime=2026-12-05T02:25:25 StartTime=2026-12-05T02:25:25 "
    "EndTime=2026-12-05T02:28:25 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-05T02:25:25 "
    "Scheduler=Main Partition=debug AllocNode:Sid=localhost:3130 ReqNodeList=(null) ExcNodeList=(null) NodeList=n0 "
    "BatchHost=n0 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 "
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) "
    "WorkDir=/work/main StdErr=/work/main/.slurm-test/deadline/run-33.out StdIn=/dev/null "
    "StdOut=/work/main/.slurm-test/deadline/run-33.out Power= \n")
SCONTROL_UNLIMITED = "JobId=32 JobName=x JobState=RUNNING TimeLimit=UNLIMITED StartTime=2026-12-05T02:25:01 " \
                     "EndTime=Unknown Deadline=N/A SuspendTime=None\n"
END_33 = 1796437705.0  # 2026-12-05T02:28:25 UTC


class P:
    def __init__(self, out, rc=0):
        self.stdout, self.returncode = out, rc


def wheel_source(tag: str, rel: str):
    """A file of a verl wheel under ../shared/stack (None when the wheel is not there)."""
    wheels = glob.glob(os.path.join(STACK, f"verl-{tag}", "*.whl"))
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[0]) as z:
        try:
            return z.read(f"verl/{rel}").decode()
        except KeyError:
            return None


def installed_source(rel: str):
    """A file of the installed verl package (None when verl or the file is not there)."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], rel)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read()


def reader(tag: str):
    """The installed verl's files (checked against what its version should hold), or a wheel's."""
    if tag == "installed":
        from importlib import metadata

        pytest.importorskip("verl")
        version = metadata.version("verl")
        if version not in INSTALLED_AS:
            pytest.skip(f"verl {version} is none of the three")
        return INSTALLED_AS[version], installed_source
    if wheel_source(tag, "trainer/main_ppo.py") is None:
        pytest.skip(f"no verl-{tag} wheel under {STACK}")
    return tag, lambda rel: wheel_source(tag, rel)


def esi_of(tag: str):
    """should_save_ckpt_esi of that verl: the installed one's own, or the wheel's function text run on its own (it
    needs only os, time and datetime)."""
    if tag == "installed":
        reader(tag)
        from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi

        return should_save_ckpt_esi
    reader(tag)
    src = wheel_source(tag, "utils/checkpoint/checkpoint_manager.py")
    start = src.index("def should_save_ckpt_esi(")
    end = src.find("\ndef ", start + 1)
    ns = {"os": os}
    exec(src[start:end if end > 0 else None], ns)  # noqa: S102 - verl's own function text, nothing else
    return ns["should_save_ckpt_esi"]


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.delenv("SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP", raising=False)
    return monkeypatch


@pytest.mark.parametrize("tag", TAGS)
def test_verl_saves_when_the_signal_is_within_a_step_and_a_save(tag, clean_env):
    esi = esi_of(tag)
    now = time.time()
    # the job ends in 280 s; submitit signals 120 s before, SLURM up to 60 s earlier still: 100 s left for verl
    env = deadline.esi_env(now + 280, 120)
    assert env == {VAR: str(int(now + 100))}
    clean_env.setenv(VAR, env[VAR])
    assert esi(max_steps_duration=50)                       # 60 s save + a 50 s step > 100 s left: save now
    assert not esi(max_steps_duration=20)                   # one more 20 s step and a save still fit
    assert esi(max_steps_duration=20, redundant_time=30)    # unless trainer.esi_redundant_time says a save is longer
    assert not esi(max_steps_duration=0)                    # the first step of an attempt never saves for it
    clean_env.setenv(VAR, deadline.esi_env(now + 3600, 120)[VAR])
    assert not esi(max_steps_duration=50)                   # far
    clean_env.setenv(VAR, deadline.esi_env(now + 100, 120)[VAR])
    assert not esi(max_steps_duration=50)                   # past the deadline: verl no longer saves for it
    clean_env.setenv(VAR, "garbage")
    assert not esi(max_steps_duration=50)
    clean_env.delenv(VAR)
    assert not esi(max_steps_duration=1e9)                  # unset: never


@pytest.mark.parametrize("tag", TAGS)
def test_which_trainer_asks(tag):
    """The legacy trainer (RayPPOTrainer.fit) calls it; the v1 trainer and SFT's do not; use_v1's default per verl."""
    name, read = reader(tag)
    want = VERLS[name]
    assert tl.esi_callers(read) == {k: want[k] for k in ("legacy", "v1", "sft")}
    assert not tl.calls_esi(read("trainer/sft_trainer_ray.py"))
    yaml = read("trainer/config/ppo_trainer.yaml")
    assert f"use_v1: {str(want['use_v1']).lower()}" in yaml and "esi_redundant_time: 0" in yaml


def simulate(end_s: float, signal_delay_s: float, step_s: float, save_s: float, redundant: int, esi) -> float:
    """RayPPOTrainer.fit's order on a fake clock starting at 0: each step runs 80% of its time, asks verl (the longest
    step so far, the redundant time), saves if told, runs the rest. Returns when the last forced save ended (-1:
    none)."""
    import time as time_module

    clock = [0.0]
    real = time_module.time
    time_module.time = lambda: clock[0]
    try:
        os.environ[VAR] = deadline.esi_env(end_s, signal_delay_s)[VAR]
        longest, saved = 0.0, -1.0
        while clock[0] < end_s:
            t0 = clock[0]
            clock[0] += 0.8 * step_s
            if esi(max_steps_duration=longest, redundant_time=redundant):
                clock[0] += save_s
                saved = clock[0]
                break  # the first forced save is the one that matters here
            clock[0] += 0.2 * step_s
            longest = max(longest, clock[0] - t0)
        return saved
    finally:
        time_module.time = real
        os.environ.pop(VAR, None)


def test_the_redundant_time_makes_verl_save_in_time(clean_env):
    esi = esi_of("installed")
    end, delay, step, save = 3600.0, 120.0, 97.0, 400.0
    signal_at = end - delay - tl.SIGNAL_EARLY_S
    saved = simulate(end, delay, step, save, tl.redundant_time(save), esi)
    assert 0 < saved <= signal_at
    # verl's own 60 s for a 400 s save: the save it forces ends after the signal
    assert simulate(end, delay, step, save, 0, esi) > signal_at


def test_slurm_end_time_parsed_and_junk_refused():
    assert deadline.parse_end(SQUEUE_RUNNING) == END_33
    assert deadline.parse_end(SQUEUE_O_PADDED) == END_33 + 484
    for junk in (SQUEUE_UNLIMITED, SQUEUE_PENDING, "Unknown", "None", "", "END_TIME", "2026-13-45T99:00:00",
                 "2026-12-05 02:28:25", "9999-12-31T23:59:59", "1970-01-01T00:00:00", None, 12, b"x"):
        assert deadline.parse_end(junk) is None, junk
    assert deadline.parse_scontrol(SCONTROL_RUNNING) == END_33
    assert deadline.parse_scontrol(SCONTROL_UNLIMITED) is None
    assert deadline.parse_scontrol("JobName=EndTime=2026-12-05T02:28:25x Deadline=N/A") is None
    assert deadline.parse_scontrol(None) is None
    assert deadline.parse_epoch("1796437705") == END_33 and deadline.parse_epoch("-5") is None


def test_job_end_time_asks_squeue_then_scontrol_in_utc():
    calls = []

    def run(argv, **kw):
        calls.append((argv, kw["env"]["TZ"], kw["timeout"]))
        return P(SQUEUE_RUNNING) if argv[0] == "squeue" else P(SCONTROL_RUNNING)

    assert deadline.job_end_time("33", run=run) == END_33
    assert calls == [(["squeue", "-h", "-j", "33", "-o", "%e"], "UTC0", deadline.CLIENT_TIMEOUT_S)]
    answers = {"squeue": P(SQUEUE_PENDING), "scontrol": P(SCONTROL_RUNNING)}
    assert deadline.job_end_time(33, run=lambda argv, **k: answers[argv[0]]) == END_33
    env = {"SLURM_JOB_ID": "33", "SLURM_JOB_END_TIME": "1796437705"}

    def gone(argv, **k):
        return P("", 0) if argv[0] == "squeue" else P("slurm_load_jobs error: Invalid job id specified", 1)

    assert deadline.job_end_time("33", run=gone, environ={}) is None
    assert deadline.job_end_time("33", run=gone, environ=env) == END_33          # a newer Slurm's variable
    assert deadline.job_end_time("34", run=gone, environ=env) is None            # another job's
    unlimited = lambda argv, **k: P(SQUEUE_UNLIMITED) if argv[0] == "squeue" else P(SCONTROL_UNLIMITED)  # noqa: E731
    assert deadline.job_end_time("32", run=unlimited, environ={}) is None

    def boom(argv, **k):
        raise OSError("no squeue")

    def slow(argv, **k):
        import subprocess

        raise subprocess.TimeoutExpired(argv, 30)

    for bad in (boom, slow, lambda a, **k: P(None), lambda a, **k: SimpleNamespace()):
        assert deadline.job_end_time("33", run=bad, environ={}) is None
    for jid in ("12; rm -rf /", "", None, "-1", "33 34", "1.5"):
        assert deadline.job_end_time(jid, run=lambda *a, **k: P(SQUEUE_RUNNING), environ={}) is None
    assert deadline.job_end_time("7_3", run=lambda *a, **k: P(SQUEUE_RUNNING)) == END_33  # an array task


def test_esi_env_rounds_early_and_refuses_junk():
    assert deadline.esi_env(END_33, 120) == {VAR: str(int(END_33 - 180))}
    assert deadline.esi_env(END_33 + 0.9, 0) == {VAR: str(int(END_33 - 60))}
    assert deadline.esi_env(END_33, None) == {VAR: str(int(END_33 - 60))}
    for bad in (None, True, float("nan"), float("inf"), "x"):
        assert deadline.esi_env(bad, 120) == {}


def test_save_and_time_limit_arithmetic():
    # GLM-5.1 on 256 GPUs, fsdp2: ~2.9e9 sharded params per rank × (4 B shard + 12 B Adam) ≈ 46.5 GB per rank
    est = SimpleNamespace(weights=4 * 2.906e9, optimizer=0.0, optimizer_host=12 * 2.906e9)
    per_rank = tl.training_state_bytes(est)
    assert per_rank == pytest.approx(16 * 2.906e9)
    save = tl.save_seconds(per_rank, 8)
    assert save == pytest.approx(30 + 8 * 16 * 2.906e9 / 1e9)          # ≈ 402 s at 1 GB/s per node
    assert tl.save_seconds(per_rank, 8, write_rate=0) == save           # a nonsense rate falls back
    assert tl.redundant_time(save) == 342 and tl.redundant_time(30) == 0 and tl.redundant_time(60, 100) == 100

    assert tl.first_save_steps(20, True) == 2 and tl.first_save_steps(20, False) == 20
    assert tl.first_save_steps(1, False) == 1
    for never in (-1, 0, None, True, "after_each_epoch"):
        assert tl.first_save_steps(never, True) is None

    assert tl.time_limit_problem(240, 120, 900, 600, save, steps=2) is None
    p = tl.time_limit_problem(30, 120, 900, 600, save, steps=2)
    assert p.warning and p.key == "cluster.time_min" and p.value == 30
    assert "30 min less submitit's 120 s signal and SLURM's 60 s early margin leaves 1,620 s" in p.why
    assert "model load 900 s + 2 step(s) × 600 s" in p.why and "one save 402 s" in p.why
    # 900 + 1,200 + 402 + 120 + 60 = 2,682 s → 45 min
    assert p.fix == "cluster.time_min=45 or more"
    assert tl.time_limit_problem(45, 120, 900, 600, save, steps=2) is None
    assert tl.time_limit_problem(30, 120, 900, None, save) is None      # no step estimate
    assert tl.time_limit_problem(30, 120, 900, 600, save, steps=None) is None  # nothing is ever saved
    assert p.line().startswith("warning: cluster.time_min=30: 30 min less")


def test_support_and_the_plan_line():
    s = tl.support("ppo", use_v1=False, save_freq=20)
    assert s.saves is True and s.trainer == "legacy"
    assert tl.plan_lines(s, 120, "0.9.0.dev0", 343) == [
        "deadline  verl 0.9.0.dev0: RayPPOTrainer (trainer.use_v1=false) saves before the time limit "
        "(MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP = end − 120 s signal − 60 s; "
        "trainer.esi_redundant_time=343)"]
    v1 = tl.support("ppo", use_v1=True, save_freq=20)
    assert v1.saves is False
    assert tl.plan_lines(v1, 120, "0.9.1") == [
        "deadline  verl 0.9.1: the v1 trainer (trainer.use_v1=true) has no pre-deadline save: a step may be lost "
        "at the time limit — trainer.use_v1=false runs RayPPOTrainer, which does"]
    # a later verl whose v1 trainer asks
    assert tl.support("ppo", True, 20, callers={"v1": True}).saves is True
    for use_v1 in (False, True):
        none = tl.support("ppo", use_v1=use_v1, save_freq=-1)  # verl's default: the glm5_1/kimi_k2_6 launcher's
        assert none.saves is False and none.why.startswith("trainer.save_freq=-1: ") and "no checkpoint" in none.why
    assert tl.support("sft", use_v1=True, save_freq="after_each_epoch").saves is False
    sft = tl.support("sft", use_v1=True, save_freq=20)
    assert sft.saves is False and "SFT trainer has no pre-deadline save" in tl.plan_lines(sft, 120)[0]
    own = tl.support("ppo", use_v1=True, save_freq=2, task_runner="vrun_standin.StandinTaskRunner")
    assert own.saves is None
    assert tl.plan_lines(own, 60)[0].startswith("deadline  the task runner vrun_standin.StandinTaskRunner")


@pytest.mark.parametrize("time_min", [5, 30, 60, 240, 2880])
def test_the_longest_signal_delay_is_still_a_time_limit_to_submitit(time_min, tmp_path):
    """submitit's own SignalHandler.has_timed_out, with the job started as long ago as the signal allows (it may come
    60 s before signal_delay_s): at max_signal_delay_s it is a time-out; 1 s more is a "preemption" that would requeue
    without end, and the plan refuses that delay for cluster=slurm with a fix that passes."""
    from submitit.core import job_environment, utils

    from conftest import problems_of

    def timed_out(delay_s: int) -> bool:
        delayed = utils.DelayedSubmission(print)
        delayed._timeout_min = time_min
        handler = job_environment.SignalHandler(None, None, delayed)
        handler._start_time = time.time() - (time_min * 60 - delay_s - tl.SIGNAL_EARLY_S)
        return handler.has_timed_out()

    most = tl.max_signal_delay_s(time_min)
    assert timed_out(most) and not timed_out(most + 1)
    if most + 1 >= time_min * 60:
        return  # refused already as a signal at the job's start
    base = ["model=qwen3_5_35b", "algo=grpo", "cluster=slurm", f"cluster.time_min={time_min}"]
    lines = problems_of(base + [f"cluster.signal_delay_s={most + 1}"], run_dir=str(tmp_path / "a"))
    mine = [line for line in lines if line.startswith("error: cluster.signal_delay_s=") and "preemption" in line]
    assert len(mine) == 1, lines
    fix = mine[0].split("fix: ")[-1]
    assert not [x for x in problems_of(base + [fix], run_dir=str(tmp_path / "b")) if "signal_delay" in x]


def test_the_plan_writes_the_redundant_time_verl_reads(tmp_path):
    """cluster=slurm with RayPPOTrainer saving (use_v1=false, save_freq > 0): verl_config.yaml carries
    trainer.esi_redundant_time = this save's seconds beyond verl's 60, and the deadline row says it; a value the user
    set is theirs; a trainer that never asks gets none."""
    import yaml as yaml_

    from conftest import runner

    def planned(*extra):
        d = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        p = runner("model=glm5_1", "cluster=slurm", "mode=plan", "verl.trainer.save_freq=10", *extra,
                   f"hydra.run.dir={d}")
        assert p.returncode == 0, p.stderr[-2000:]
        return yaml_.safe_load((d / "verl_config.yaml").read_text())["trainer"]["esi_redundant_time"], p.stdout

    value, out = planned("verl.trainer.use_v1=false")
    assert value > 60 and f"trainer.esi_redundant_time={value})" in out, out
    assert planned("verl.trainer.use_v1=false", "verl.trainer.esi_redundant_time=900")[0] == 900
    assert planned("verl.trainer.use_v1=true")[0] == 0

"""verl's pre-deadline save fed by the node (vrun/launch/deadline.py): the installed verl's own
should_save_ckpt_esi, under the environment the node sets, saves when the job's end less submitit's signal is within
one step and a save, and not before; SLURM's EndTime as the CI harness's Slurm 22.05 prints it."""
import os
import time

import pytest

from vrun.launch import deadline
from vrun.planning import watch


def esi(env, longest, redundant=0):
    from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return should_save_ckpt_esi(max_steps_duration=longest, redundant_time=redundant)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_the_real_verl_saves_before_the_signal():
    pytest.importorskip("verl.utils.checkpoint.checkpoint_manager")
    now = time.time()
    # ends in 5 min, submitit signals 120 s before: 180 s left for verl; a 100 s step + verl's 60 s save fit once more
    env = deadline.esi_env(now + 300, 120)
    assert env == {deadline.ESI_VAR: str(int(now + 180))}
    assert not esi(env, longest=100)
    assert esi(env, longest=130)
    assert not esi(deadline.esi_env(now + 3600, 120), longest=130)


def test_slurm_end_time_parsed_and_junk_refused():
    t = deadline.parse_end("2026-12-05T01:02:21")
    assert time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) == "2026-12-05T01:02:21"
    for junk in ("Unknown", "None", "", "2026-13-45T99:00:00", None):
        assert deadline.parse_end(junk) is None

    class P:
        def __init__(self, out, rc=0):
            self.stdout, self.returncode = out, rc

    assert deadline.job_end_time("12", run=lambda *a, **k: P("2026-12-05T01:02:21\n")) == t
    assert deadline.job_end_time("12", run=lambda *a, **k: P("", 1)) is None
    assert deadline.job_end_time("12; rm -rf /") is None
    assert deadline.esi_env(None, 120) == {}


def test_a_time_limit_that_cannot_hold_a_step_and_a_save():
    assert watch.holds_a_step(240, 120, 400.0, 1800.0) is None
    why = watch.holds_a_step(10, 120, 400.0, 1800.0)
    assert why.startswith("10 min less the 120 s signal leaves 480 s, under the first step's 1,800 s")
    assert watch.holds_a_step(10, 120, None, 1800.0) is None

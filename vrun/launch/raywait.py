"""cluster=ray: the submitter follows its jobs (cluster.detach=false, and `resubmit` without --detach) as a SLURM
submission does (vrun.launch.slurm.wait): one line per change of each job — pending → running → each step, the
first step's time beside the plan's band — read from the dashboard (vrun.rundir.rayjob, every request bounded) and
the run dir's own lines. Ctrl-C detaches in one line (the jobs keep running). It returns when every job has ended:
completed, or one line per job that did not (its state, its cause, the next command), exit 2. A dashboard that stops
answering is said once per change of its words; the follow goes on until the job's end is known or Ctrl-C."""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

POLL_S = 3.0


def first_step_words(run) -> str:
    """`first step 12 s (the plan's band 10–30 s)` once the job's log has a first step time, else ""."""
    from vrun.planning import measured

    m = measured.of(run)  # the log the dashboard gave this time (the entry keeps its own as job.log)
    if not m.steps:
        return ""
    first = m.steps[min(m.steps)]
    t = first.get("timing_s/step") or first.get("perf/time_per_step")
    if t is None:
        return ""
    low, high = run.plan.time.get("step_low_s"), run.plan.time.get("step_high_s")
    band = f" (the plan's band {low:.0f}–{high:.0f} s)" if isinstance(low, (int, float)) and \
        isinstance(high, (int, float)) else ""
    return f"first step {t:.1f} s{band}"


def line(run) -> str:
    from vrun.rundir import state

    text = f"job {run.job_id or '?'} {Path(run.dir).name}: {state.describe(run)}"
    if run.ray_error:
        text += f" (last known; {run.ray_error})"
    return text


def until_ended(dirs: list, stream=None, poll_s: float = POLL_S) -> None:
    from vrun.config import cli_errors
    from vrun.core.problems import Problem
    from vrun.core.text import visible
    from vrun.rundir import rayjob, state

    stream = stream or sys.stdout
    shown: dict = {}
    firsts: set = set()
    try:
        while True:
            runs = [state.load(Path(d)) for d in dirs]
            rayjob.refresh(runs, with_logs="active")
            for r in runs:
                for text in [line(r)] + ([first_step_words(r)] if str(r.dir) not in firsts else []):
                    if not text:
                        continue
                    if text.startswith("first step"):
                        firsts.add(str(r.dir))
                        text = f"job {r.job_id} {Path(r.dir).name}: {text}"
                    elif shown.get(str(r.dir)) == text:
                        continue
                    else:
                        shown[str(r.dir)] = text
                    print(visible(text), file=stream, flush=True)
            if all(not r.active for r in runs):
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        qs = " ".join(shlex.quote(d) for d in dirs)
        print(f"\ndetached: the job(s) keep running; python -m vrun status {qs}; python -m vrun cancel {qs}",
              file=sys.stderr, flush=True)
        sys.exit(130)
    problems = []
    for r in runs:
        if r.state == "completed":
            print(f"job {r.job_id}: completed", file=stream, flush=True)
            continue
        q = shlex.quote(str(r.dir))
        fix = (f"python -m vrun resubmit {q} (the plan's job again, same run dir; resumes from the last whole "
               "checkpoint)" if r.state in ("cancelled", "lost") else
               f"python -m vrun status {q}; python -m vrun logs {q}; then python -m vrun resubmit {q}")
        problems.append(Problem("ray", r.state, f"job {r.job_id} {visible(state.describe(r))}", fix))
    if problems:
        cli_errors.emit([p.line() for p in problems])

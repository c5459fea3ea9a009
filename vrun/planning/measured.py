"""A run's measured step times beside its plan's estimate: verl's console lines from the job's output
(<run dir>/job.log on this machine; cluster=ray: the log its dashboard gave the verb; on SLURM the first node's
submitit stdout, found through slurm_job.json's folder and the run's job ids), parsed by vrun/rundir/joblog.py. A
run that measured steps teaches the calibration record (vrun/planning/calibration.py) for the next plan of its
kind. Standard library only."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from vrun.planning import calibration
from vrun.rundir import joblog
from vrun.rundir import state
from vrun.core import fs


def log_paths(run: state.Run) -> list:
    paths = [run.dir / joblog.JOB_LOG]
    if run.on_slurm and run.slurm.get("folder"):
        folder = str(run.slurm["folder"])
        for j in run.job_ids or ([run.job_id] if run.job_id else []):
            paths.append(Path(folder.replace("%j", str(j))) / f"{j}_0_log.out")
    return [p for p in paths if fs.is_file(p)]


def of(run: state.Run) -> joblog.Measured:
    if run.ray_log is not None:  # cluster=ray: the job's log as its dashboard gave it this time (stored nowhere)
        data = run.ray_log.encode("utf-8", errors="replace")
        lines = data[-joblog.LOG_TAIL:].decode("utf-8", errors="replace").splitlines()
        return joblog.parse(lines[1:] if len(data) >= joblog.LOG_TAIL else lines)
    return joblog.read(log_paths(run))


def predicted(run: state.Run) -> Optional[dict]:
    t = run.plan.time
    if t.get("step_low_s") is None:
        return None
    return {"low_s": t["step_low_s"], "high_s": t["step_high_s"], "middle_s": t.get("step_middle_s"),
            "model_middle_s": t.get("model_middle_s"), "calibration": (t.get("calibration") or {}).get("from"),
            "phases": t.get("phases") or {}}


def learn(run_dir: Path, m: Optional[joblog.Measured] = None) -> bool:
    """Record the run's median step time against its plan's uncalibrated middle. Returns whether it changed."""
    run = state.load(Path(run_dir))
    m = m if m is not None else of(run)
    t = run.plan.time
    if m.step_s is None or not t.get("model_middle_s") or not t.get("kind"):
        return False
    return calibration.record(t["kind"], str(run.dir), m.step_s, float(t["model_middle_s"]), len(m.steps))


def learn_at_end(run_dir) -> None:
    """At a run's end, in the job's own process (the local launch, SLURM's node 0, a Ray job's entry): its measured
    step time into the calibration record; nothing when verl printed no step line. Never raises: learning never
    fails a finished run. The read verbs (`status`, `runs`) never write it."""
    try:
        learn(Path(run_dir))
    except Exception:  # noqa: BLE001
        pass


def column(run: state.Run) -> str:
    """`runs`'s STEP S column: measured / predicted low–high."""
    p = predicted(run)
    m = of(run).step_s
    pred = f"{p['low_s']:.0f}–{p['high_s']:.0f}" if p else "?"
    return f"{m:.0f}/{pred}" if m is not None else f"-/{pred}"


def lines(run: state.Run) -> list:
    """`status`'s lines: the estimate, and what verl measured so far, phase by phase."""
    p = predicted(run)
    m = of(run)
    out = []
    if p:
        how = f", {p['calibration']}" if p.get("calibration") else ""
        out.append(f"predict  step ≈ {p['low_s']:.0f}–{p['high_s']:.0f} s (estimate{how}): " + ", ".join(
            f"{k} {v['low_s']:.0f}–{v['high_s']:.0f}" for k, v in p["phases"].items()))
    else:
        out.append("predict  no step-time estimate in plan.json")
    s = m.summary()
    if not m.steps and run.state == "planned":
        mode = getattr(run.plan, "mode", None)
        out.append(f"measured nothing: planned, not run (mode={mode}); " + (
            "run it with the same command and mode=train (manifest.json holds it)" if mode == "plan" else
            "the run never started"))
        return out
    if not m.steps:
        src = ", ".join(str(x) for x in log_paths(run)) or "no job output yet"
        out.append(f"measured no verl step lines yet ({src})")
        return out
    phases = ", ".join(f"{k} {s[k + '_s']:.0f}" for k in joblog.PHASES if s.get(k + "_s") is not None)
    extra = "".join(f", {label} {s[k]}" for k, label in (("throughput", "tokens/s/GPU"), ("mfu", "MFU")) if s.get(k))
    step = f"step {s['step_s']:.0f} s" if s.get("step_s") is not None else "no step time"
    ratio = ""
    if p and s.get("step_s") is not None and p.get("middle_s"):
        ratio = f"; {s['step_s'] / p['middle_s']:.2f}× the estimate's middle"
    out.append(f"measured {step} (median of {s['steps']} steps, last step {s['last_step']}): {phases}{extra}{ratio}")
    return out

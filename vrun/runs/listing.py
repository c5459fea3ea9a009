"""`python -m vrun runs` and `status`: every run the project wrote, and one in detail — its state as SLURM and its
own lines tell it, attempt by attempt (restarts, how each ended), a stall's summary and where its stacks are, the
checkpoint an attempt resumed from, and the step time measured beside the estimate."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from vrun.core import fs
from vrun.core.text import summarised
from vrun.core.units import elapsed
from vrun.rundir import records as rundir
from vrun.rundir import slowness, state
from vrun.rundir.state import RunDirError
from vrun.runs.common import Usage, one_run
from vrun.runs.logs import log_files

INDEX_LIMIT = 16 << 20  # bytes of the runs index read (its newest lines): ~150,000 runs
RAY_BUDGET_S = 20.0  # `runs` waits at most this long for every Ray dashboard together


def print(*parts, **kw) -> None:  # noqa: A001 - every line this module prints passes through visible()
    import builtins

    from vrun.core.text import visible

    builtins.print(*("\n".join(visible(x) for x in p.split("\n")) if isinstance(p, str) else p for p in parts), **kw)

def collect(dirs: list) -> tuple[list, list]:
    """Runs to list: the dirs given (run or sweep dirs), else every run dir in the index. Returns (runs, notes)."""
    notes = []
    found: dict = {}
    if dirs:
        for d in dirs:
            for p in state.points(d):
                found.setdefault(str(p), None)
    else:
        idx = rundir.index_path()
        if idx is None:
            raise Usage(rundir.state_dir_problem() or "error: state dir: refused; fix: set VRUN_STATE_DIR")
        text, why = fs.read_checked(idx, INDEX_LIMIT, own=True, tail=True)
        if text is None and why != "no such file":
            raise Usage(f"error: index={idx}: {why}; fix: remove it (rm {idx}) and give run/sweep dirs: "
                        "python -m vrun runs DIR...")
        if text is None:
            raise Usage(f"error: index={idx}: no runs recorded yet; fix: plan or submit a run "
                        "(python runner.py ...), or give run/sweep dirs: python -m vrun runs DIR...")
        gone = set()
        for line in text.splitlines():
            try:
                e = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if not (isinstance(e, dict) and isinstance(e.get("run_dir"), str) and "\0" not in e["run_dir"]):
                continue  # not a line the runner writes
            if not isinstance(e.get("t"), (int, float)) or isinstance(e.get("t"), bool):
                e["t"] = None
            if fs.is_file(Path(e["run_dir"]) / "plan.json"):
                found[e["run_dir"]] = e.get("t")
            else:
                gone.add(e["run_dir"])
        gone -= set(found)
        if gone:
            notes.append(f"note: {len(gone)} run dir(s) in {idx} no longer exist (deleted or moved); "
                         "give moved ones as DIR arguments")
    runs = []
    for d, t in found.items():
        try:
            runs.append(state.load(Path(d), indexed_at=t))
        except RunDirError as e:
            notes.append(str(e))
    return runs, notes


def cmd_runs(a) -> int:
    runs, notes = collect(a.dirs)
    state.refresh(runs)
    from vrun.rundir import rayjob

    rayjob.refresh(runs, with_logs="active", budget_s=RAY_BUDGET_S)  # cluster=ray rows: from their dashboards
    from vrun.runs import kuberay

    kuberay.refresh(runs)  # cluster=kuberay rows: their RayJobs' status from kubectl
    if a.state:
        want = set(a.state.split(","))
        runs = [r for r in runs if r.state in want]
    if a.model:
        want = set(a.model.split(","))
        runs = [r for r in runs if r.plan.model.name in want]
    runs.sort(key=lambda r: r.when, reverse=True)
    for n in notes:
        print(n, file=sys.stderr)
    from vrun.planning import measured
    from vrun.runs import outlook

    now = time.time()
    seen = [measured.of(r) for r in runs]  # each run's log read once, for the outlook and the step-time column
    looks = [outlook.of(r, m, now) for r, m in zip(runs, seen)]  # read only: nothing is written
    if a.json:
        print(json.dumps([{**r.summary(), "outlook": o.summary()} for r, o in zip(runs, looks)], indent=1))
        return 0
    head = ("WHEN", "MODEL", "ALGO", "GPUS", "MODE", "STATE", "JOB", "ATT", "ELAPSED", "STEP", "ETA",
            "GPU-H (SPENT/PROJ)", "STEP S (MEAS/EST)", "CKPT", "RUN DIR")
    rows = []
    for r, o, m in zip(runs, looks, seen):
        s = r.summary()
        rows.append((time.strftime("%m-%d %H:%M", time.localtime(r.when)) if r.when else "-", s["model"] or "?",
                     s["algo"] or "?", str(s["gpus"]), s["mode"] or "?", _short(state.describe(r)),
                     r.job_id or "-", str(r.attempt) if r.on_slurm or r.on_ray else "-", elapsed(r.elapsed_s) if r.elapsed_s else "-",
                     _step(o), _eta(o, now), _gpu_h(r, o), _step_s(r, m),
                     str(s["checkpoint_step"]) if s["checkpoint_step"] is not None else "-", str(r.dir)))
    if not rows:
        print("no runs" + (" match" if a.state or a.model else ""))
        return 0
    widths = [max(len(x[i]) for x in rows + [head]) for i in range(len(head) - 1)]
    print("  ".join(c.ljust(w) for c, w in zip(head, widths)) + "  " + head[-1])
    for row, r in zip(rows, runs):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
        full = state.describe(r)
        if len(full) > STATE_WIDTH or r.stall or r.restarts or r.ray_error or r.slow:
            print(f"    ↳ {full}" + (f"; {r.restarts} restart(s)" if r.restarts else "")
                  + (f" (last known: {r.ray_error})" if r.ray_error else "")
                  + "".join(f"; slow: {slowness.line(e)}" for e in r.slow))
    total = outlook.sweep_line(looks)
    if total:
        print(total)
    return 0


def _step_s(r, m) -> str:
    """`runs`'s STEP S column: measured / predicted low–high (vrun.planning.measured.column, its log read once)."""
    from vrun.planning import measured

    p = measured.predicted(r)
    pred = f"{p['low_s']:.0f}–{p['high_s']:.0f}" if p else "?"
    return f"{m.step_s:.0f}/{pred}" if m.step_s is not None else f"-/{pred}"


def _step(o) -> str:
    """`runs`'s STEP column: the last step printed, of the total where the plan knows it."""
    if o.step is None:
        return "-"
    return f"{o.step}/{o.total}" if o.total else str(o.step)


def _eta(o, now: float) -> str:
    """`runs`'s ETA column: when the last step comes, on the pace measured (running runs)."""
    if o.eta is None:
        return "-"
    return time.strftime("%H:%M" if o.eta - now < 86400 else "%m-%d %H:%M", time.localtime(o.eta))


def _gpu_h(r, o) -> str:
    if not r.elapsed_s:
        return "-"
    return f"{o.spent_gpu_h:.2f}/" + (f"{o.projected_gpu_h:.2f}" if o.projected_gpu_h is not None else "?")


STATE_WIDTH = 40


def _short(text: str) -> str:
    """The STATE column: the state and the start of its phase; the whole line follows the row when longer."""
    return text if len(text) <= STATE_WIDTH else text[:STATE_WIDTH - 1] + "…"


# ---------------------------------------------------------------- status

def cmd_status(a) -> int:
    from vrun.planning import measured

    r = one_run(a.run)
    if r.on_ray:  # the dashboard's word on the job over the run's own lines (its log kept as job.log)
        from vrun.rundir import rayjob as ray_dashboard
        from vrun.runs import rayjobs

        if r.ray_problem:
            raise Usage(r.ray_problem)
        ray_dashboard.refresh([r], with_logs="all", budget_s=2 * ray_dashboard.timeout_of(r.plan))
        if r.ray_error and r.ray is not None:
            raise rayjobs.unreachable(r, "its job's state not read")
    from vrun.runs import kuberay

    rayjob = kuberay.refresh([r]).get(str(r.dir))  # a cluster=kuberay run: its RayJob's status from kubectl
    m = measured.of(r)  # read only: the calibration learns when the run ends, in the job's own process
    from vrun.runs import outlook

    look = outlook.of(r, m)
    if a.json:
        print(json.dumps({**r.summary(), "events": r.events, "predicted": measured.predicted(r),
                          "measured": m.summary(), "outlook": look.summary()}, indent=1))
        return 0
    p, m = r.plan, r.plan.mesh
    print(f"run      {r.dir}")
    print(f"plan     {p.model.name} · {p.algo} · optimizer {p.optimizer} · mode {p.mode} · cluster {p.cluster}: "
          f"{m.world} GPUs = {m.nnodes}×{m.gpus_per_node}, TP{m.tp} CP{m.cp} PP{m.pp} DP{m.dp} EP{m.ep} "
          f"ETP{m.etp} EDP{m.edp}")
    print(f"state    {state.describe(r)}")
    if rayjob:
        print(f"rayjob   {rayjob}")
    if r.failure and r.state == "failed":
        print(f"failed   on {r.failure['node']}: {r.failure['error']}")
    if r.stall:
        print(f"stall    {r.stall.get('summary')}  (stacks: {r.stall.get('dir')})")
    for e in r.slow:
        print(f"slow     {slowness.line(e)}")
    if r.on_slurm:
        print(f"job      {r.job_id} (attempt {r.attempt}; restarts {r.restarts}; job ids {summarised(r.job_ids, sep=',')})"
              + (f"; nodes {summarised(r.hosts, sep=',')}" if r.hosts else ""))
        for a in r.attempts[:-1]:
            print(f"  attempt {a.n}: job {a.job_id}" + (f" (restart {a.restart})" if a.restart else "")
                  + (f" on {summarised(a.hosts, sep=',')}" if a.hosts else "") + f": {a.end or a.state}")
    if r.on_ray:
        from vrun.runs import rayjobs

        for line in rayjobs.status_lines(r):
            print(line)
    if r.resumed:
        print(f"resumed  {r.resumed.get('line') or _resumed(r.resumed)}")
    if r.elapsed_s:
        print(f"elapsed  {elapsed(r.elapsed_s)}, {r.gpu_hours:.2f} GPU-hours")
    for line in [*measured.lines(r), *(outlook.lines(look) if r.plan.mode == "train" else []), *_preflight_lines(r)]:
        print(line)
    step = r.checkpoint_step()
    print(f"ckpt     {'step ' + str(step) if step is not None else 'none yet'} ({r.dir / 'checkpoints'})")
    t0 = None
    for e in r.events:
        t0 = t0 or e["t"]
        print(f"  {time.strftime('%H:%M:%S', time.localtime(e['t']))} +{e['t'] - t0:6.1f}s  {_event(r, e)}")
    if r.on_slurm:
        files = sorted({str(f[3].parent) for f in log_files(r)})
        print(f"logs     python -m vrun logs {r.dir}  ({summarised(files) or 'none yet'})")
    print(_picture_line(r.dir))
    return 0


def _picture_line(d: Path) -> str:
    """Where the plan's picture is; else the verb that draws it and, where the drawing beside the plan failed, its
    reason's first line (sweep points draw nothing until shown)."""
    from vrun.planning.picture import PICTURE, PICTURE_FAILED

    if fs.is_file(d / PICTURE):
        return f"picture  {d / PICTURE}"
    reason = (fs.read_small(d / PICTURE_FAILED, 1 << 16) or "").strip().splitlines()
    why = f": {reason[0][:200]}" if reason else ""
    return f"picture  not drawn{why} (python -m vrun show {d} draws it)"


def _preflight_lines(r: state.Run) -> list:
    """The problems the nodes' preflight found (preflight.json)."""
    from vrun.rundir import files

    report = files.optional_object(r.dir / "preflight.json")
    if report is None:
        return []
    found = report.get("problems") or []
    found = found if isinstance(found, list) else [found]
    return [f"preflight {len(found)} problem(s)" + (":" if found else "")] + [f"  {p}" for p in found]


def _resumed(e: dict) -> str:
    step = e.get("step")
    return f"from global_step_{step}" if isinstance(step, int) else "from step 0 (no whole checkpoint)"


def _event(r: state.Run, e: dict) -> str:
    ev = e["event"]
    rest = {k: v for k, v in e.items() if k not in ("event", "t", "host")}
    if ev == "nodes_joined":
        return f"nodes joined {e.get('joined')}/{e.get('of')} {summarised(e.get('hosts') or [], sep=',')}"
    if ev == "failed":
        return f"failed on {state.node_name(r.hosts, e)}: {e.get('error')}"
    if ev == "stalled":
        return f"stalled: {e.get('summary')}"
    if ev == "slow":
        return f"slow: {slowness.line(e)}"
    if ev == "resumed":
        return f"resumed {e.get('line') or _resumed(e)}"
    if ev == "stopped":
        return f"stopped ({e.get('host')}): {e.get('why')}"
    if ev in ("signalled", "time_limit", "stall_action"):
        return f"{ev} ({e.get('host')}): " + " ".join(f"{k}={v}" for k, v in rest.items()
                                                      if k in ("why", "step", "requeued", "action", "exclude", "error"))
    detail = " ".join(f"{k}={summarised(v, sep=',') if isinstance(v, list) else v}" for k, v in rest.items()
                      if k in ("job_id", "restart", "attempt", "rc", "hosts", "seconds", "pid", "job_ids"))
    return f"{ev} ({e.get('host')}) {detail}".rstrip()



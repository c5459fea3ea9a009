"""`python -m vrun <verb>`: runs, status, show, logs, cancel, diff, export, resubmit (`--help` on each).

Bad input (an unknown dir, a dir that is not a run, cancelling a run that has ended) is one line naming the
thing, why and the fix, exit 2. Nothing here prints a secret: run dirs hold none, env vars are shown by name.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from vrun.rundir import records as rundir
from vrun.rundir import state
from vrun.rundir.state import RunDirError
from vrun.core import fs

EXIT_USAGE = 2
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Usage(Exception):
    """A one-line error for the user (already formatted)."""


# ---------------------------------------------------------------- runs

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
        if not fs.is_file(idx):
            raise Usage(f"error: index={idx}: no runs recorded yet; fix: plan or submit a run "
                        "(python runner.py ...), or give run/sweep dirs: python -m vrun runs DIR...")
        gone = set()
        for line in idx.read_text(encoding="utf-8", errors="replace").splitlines():
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
    if a.state:
        want = set(a.state.split(","))
        runs = [r for r in runs if r.state in want]
    if a.model:
        want = set(a.model.split(","))
        runs = [r for r in runs if r.plan.model.name in want]
    runs.sort(key=lambda r: r.when, reverse=True)
    for n in notes:
        print(n, file=sys.stderr)
    if a.json:
        print(json.dumps([r.summary() for r in runs], indent=1))
        return 0
    from vrun.planning import measured

    head = ("WHEN", "MODEL", "ALGO", "GPUS", "MODE", "STATE", "JOB", "ATT", "ELAPSED", "GPU-H", "STEP S (MEAS/EST)",
            "CKPT", "RUN DIR")
    rows = []
    for r in runs:
        s = r.summary()
        rows.append((time.strftime("%m-%d %H:%M", time.localtime(r.when)) if r.when else "-", s["model"] or "?",
                     s["algo"] or "?", str(s["gpus"]), s["mode"] or "?", state.describe(r)[:60],
                     r.job_id or "-", str(r.attempt) if r.on_slurm else "-", _dur(r.elapsed_s) if r.elapsed_s else "-",
                     f"{r.gpu_hours:.2f}" if r.elapsed_s else "-", measured.column(r),
                     str(s["checkpoint_step"]) if s["checkpoint_step"] is not None else "-", str(r.dir)))
    if not rows:
        print("no runs" + (" match" if a.state or a.model else ""))
        return 0
    widths = [max(len(x[i]) for x in rows + [head]) for i in range(len(head) - 1)]
    for row in [head] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    return 0


# ---------------------------------------------------------------- status

def one_run(path: str) -> state.Run:
    ps = state.points(path)
    if len(ps) != 1:
        raise Usage(f"error: run={path}: a sweep dir of {len(ps)} runs; fix: give one of its run dirs "
                    f"(python -m vrun runs {path} lists them)")
    r = state.load(ps[0])
    state.refresh([r])
    return r


def cmd_status(a) -> int:
    from vrun.planning import measured

    r = one_run(a.run)
    m = measured.of(r)
    if m.steps:
        measured.learn(r.dir, m)  # the calibration record learns what this run measured (idempotent)
    if a.json:
        print(json.dumps({**r.summary(), "events": r.events, "predicted": measured.predicted(r),
                          "measured": m.summary()}, indent=1))
        return 0
    p, m = r.plan, r.plan.mesh
    print(f"run      {r.dir}")
    print(f"plan     {p.model.name} · {p.algo} · optimizer {p.optimizer} · mode {p.mode} · cluster {p.cluster}: "
          f"{m.world} GPUs = {m.nnodes}×{m.gpus_per_node}, TP{m.tp} CP{m.cp} PP{m.pp} DP{m.dp} EP{m.ep} "
          f"ETP{m.etp} EDP{m.edp}")
    print(f"state    {state.describe(r)}")
    if r.failure:
        print(f"failed   on {r.failure['node']}: {r.failure['error']}")
    if r.on_slurm:
        requeues = len([e for e in r.events if e["event"] == "requeued"])
        print(f"job      {r.job_id} (attempt {r.attempt}; requeues {requeues}; job ids {','.join(r.job_ids)})"
              + (f"; nodes {','.join(r.hosts)}" if r.hosts else ""))
    if r.elapsed_s:
        print(f"elapsed  {_dur(r.elapsed_s)}, {r.gpu_hours:.2f} GPU-hours")
    for line in [*measured.lines(r), *_preflight_lines(r)]:
        print(line)
    step = r.checkpoint_step()
    print(f"ckpt     {'step ' + str(step) if step is not None else 'none yet'} ({r.dir / 'checkpoints'})")
    t0 = None
    for e in r.events:
        t0 = t0 or e["t"]
        print(f"  {time.strftime('%H:%M:%S', time.localtime(e['t']))} +{e['t'] - t0:6.1f}s  {_event(r, e)}")
    if r.on_slurm:
        files = sorted({str(f[3].parent) for f in log_files(r)})
        print(f"logs     python -m vrun logs {r.dir}  ({', '.join(files) or 'none yet'})")
    return 0


def _preflight_lines(r: state.Run) -> list:
    """The problems the nodes' preflight found (preflight.json)."""
    try:
        found = json.loads((r.dir / "preflight.json").read_text()).get("problems") or []
    except (OSError, json.JSONDecodeError, AttributeError):
        return []
    return [f"preflight {len(found)} problem(s)" + (":" if found else "")] + [f"  {p}" for p in found]


def _event(r: state.Run, e: dict) -> str:
    ev = e["event"]
    rest = {k: v for k, v in e.items() if k not in ("event", "t", "host")}
    if ev == "nodes_joined":
        return f"nodes joined {e.get('joined')}/{e.get('of')} {','.join(e.get('hosts') or [])}"
    if ev == "failed":
        return f"failed on {state.node_name(r, e)}: {e.get('error')}"
    detail = " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in rest.items()
                      if k in ("job_id", "attempt", "rc", "hosts", "seconds", "pid", "job_ids"))
    return f"{ev} ({e.get('host')}) {detail}".rstrip()


# ---------------------------------------------------------------- logs

def log_files(r: state.Run, job_id: str | None = None) -> list:
    """submitit's per-task files of the run's jobs: (job id, task, stream, path), task = node index."""
    if not r.on_slurm:
        return []
    folder = str(r.slurm.get("folder"))
    out = []
    for j in ([job_id] if job_id else r.job_ids or [r.job_id]):
        d = Path(folder.replace("%j", str(j)))
        nodes = int((r.slurm.get("spec") or {}).get("nodes") or 1)
        for t in range(nodes):
            for stream, suffix in (("out", "log.out"), ("err", "log.err")):
                out.append((str(j), t, stream, d / f"{j}_{t}_{suffix}"))
    return [x for x in out if fs.exists(x[3])]


def cmd_logs(a) -> int:
    r = one_run(a.run)
    if not r.on_slurm and fs.is_file(r.dir / "job.log"):  # a local run's output, teed by vrun.launch.local
        sys.stdout.write((r.dir / "job.log").read_text(errors="replace"))
        return 0
    if not r.on_slurm:
        raise Usage(f"error: run={r.dir}: a run on this machine (cluster={r.plan.cluster}) writes no log "
                    "files: its output went to the terminal that started it; fix: for a kept log, run it with "
                    "`... 2>&1 | tee run.log`, or on cluster=slurm")
    node = _node_index(r, a.node) if a.node is not None else None
    job = r.job_id if a.follow else None

    def selected():
        return [f for f in log_files(r, job) if (node is None or f[1] == node) and (a.stream in ("both", f[2]))]

    # nodes named as every verb names them: the hostname once known, else the node index as hostnames go
    label = lambda t, s: f"{r.hosts[t] if t < len(r.hosts) else 'node ' + str(t)} {s}| "  # noqa: E731
    plain = (lambda text: text) if sys.stdout.isatty() else (lambda text: ANSI.sub("", text))  # Ray's colours
    if a.follow and shutil.which("squeue") is None:
        raise Usage(f"error: logs -f {r.dir}: squeue is not on this machine, so the job's end cannot be seen; fix: "
                    "follow from a SLURM login node, or drop -f to print the logs so far")
    if not a.follow:
        files = selected()
        if not files:
            never = not r.active and r.state != "completed"
            print(f"no log files {'for' if never else 'yet for'} job {r.job_id} ({state.describe(r)})"
                  + (f": SLURM never wrote {r.slurm.get('stdout')}; the nodes likely cannot see that path"
                     if never and r.slurm and r.slurm.get("stdout") else ""), file=sys.stderr)
        for j, t, s, path in files:
            prefix = label(t, s)
            for line in path.read_text(errors="replace").splitlines():
                print(prefix + plain(line))
        return 0
    offsets: dict = {}
    partial: dict = {}
    last_check = 0.0
    try:
        while True:
            for j, t, s, path in selected():
                with path.open("rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
                    offsets[path] = f.tell()
                if data:
                    text = partial.pop(path, "") + data.decode(errors="replace")
                    *whole, rest = text.split("\n")
                    if rest:
                        partial[path] = rest
                    for line in whole:
                        print(label(t, s) + plain(line), flush=True)
            if not r.active:
                break
            if time.monotonic() - last_check > 2:
                last_check = time.monotonic()
                r = state.load(r.dir)
                state.refresh([r])
                if r.reason == "squeue unavailable":
                    print(f"-- job {r.job_id}: squeue stopped answering; stopped following", file=sys.stderr)
                    return 1
                if not r.active:  # one more pass for what was written last
                    time.sleep(0.5)
                    continue
            time.sleep(0.3)
    except KeyboardInterrupt:
        return 0
    print(f"-- job {r.job_id}: {state.describe(r)}", flush=True)
    return 0


def _node_index(r: state.Run, node: str) -> int:
    if node.isdigit():
        return int(node)
    if node in r.hosts:
        return r.hosts.index(node)
    raise Usage(f"error: --node={node}: not a node of job {r.job_id} (nodes: {','.join(r.hosts) or 'not started'}); "
                "fix: a node index 0… or one of those hostnames")


# ---------------------------------------------------------------- cancel

def cmd_cancel(a) -> int:
    targets = []
    sweep = False
    for path in a.runs:
        ps = state.points(path)
        sweep = sweep or len(ps) > 1 or not fs.is_file(Path(path) / "plan.json")
        targets += [state.load(p) for p in ps]
    state.refresh(targets)
    live = [r for r in targets if r.active]
    ended = [r for r in targets if not r.active]
    if not live:
        r = ended[0]
        if len(ended) == 1:
            raise Usage(f"error: run={r.dir}: {_ended(r)}; nothing to cancel; fix: "
                        + ("resubmit it (python -m vrun resubmit RUN)" if r.on_slurm else
                           "plan and start it again (python runner.py ...)"))
        raise Usage(f"error: runs={' '.join(a.runs)}: none of the {len(ended)} runs is pending or running "
                    f"({', '.join(sorted({r.state for r in ended}))}); nothing to cancel; fix: python -m vrun runs "
                    f"{' '.join(a.runs)}")
    if sweep and not a.yes:
        question = f"cancel {len(live)} run(s) ({len(ended)} already ended)? [y/N] "
        if not sys.stdin.isatty():
            raise Usage(f"error: runs={' '.join(a.runs)}: cancelling {len(live)} run(s) of a sweep needs "
                        "confirmation and there is no terminal to ask on; fix: add --yes")
        if input(question).strip().lower() not in ("y", "yes"):
            print("nothing cancelled")
            return 1
    for r in ended:
        print(f"skipped {r.dir}: {_ended(r)}")
    for r in live:
        cancel_one(r)
    if a.no_wait:
        return 0
    return wait_stopped(live, a.timeout)


def _ended(r: state.Run) -> str:
    if r.state == "planned":
        return f"a plan (mode={r.plan.mode}), never started"
    return f"the run has ended: {state.describe(r)}"


def cancel_one(r: state.Run) -> None:
    if r.on_slurm:
        queue = state.squeue() or {}
        ids = [j for j in r.job_ids if j in queue] or [r.job_id]
        try:
            p = subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise Usage(f"error: scancel {' '.join(ids)}: cannot run scancel here ({type(e).__name__}); fix: cancel from "
                        "a SLURM login node (where squeue works)") from None
        if p.returncode:
            raise Usage(f"error: scancel {' '.join(ids)}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}; "
                        f"fix: check the job with squeue -j {','.join(ids)}")
        rundir.record(str(r.dir), "cancelled", attempt=r.attempt, job_ids=ids)
        print(f"cancelled job {','.join(ids)}: {r.dir}", flush=True)
        return
    pid = next((e.get("pid") for e in reversed(r.events) if e["event"] == "entrypoint_started"), None) or r.pid
    host = r.host
    if host != socket.gethostname():
        raise Usage(f"error: run={r.dir}: runs on {host}, not here ({socket.gethostname()}); fix: cancel it on {host}")
    from vrun.runs import owner

    why = owner.not_proven(pid, r.plan.run_id)
    if why:
        raise Usage(f"error: run={r.dir}: pid {owner.shown(pid)} {why}: nothing signalled; fix: stop the run "
                    "from the terminal that started it")
    try:
        os.kill(int(pid), signal.SIGTERM)
    except ProcessLookupError:
        pass
    rundir.record(str(r.dir), "cancelled", attempt=r.attempt, pid=pid)
    print(f"cancelled process {pid}: {r.dir}", flush=True)


def wait_stopped(runs: list, timeout: float) -> int:
    """Until SLURM no longer lists the jobs (local: the process is gone)."""
    deadline = time.monotonic() + timeout
    left = list(runs)
    while left and time.monotonic() < deadline:
        queue = state.squeue() if any(r.on_slurm for r in left) else {}
        still = []
        for r in left:
            if r.on_slurm:
                running = [j for j in r.job_ids if queue is not None and j in queue]
            else:
                pid = next((e.get("pid") for e in reversed(r.events) if e["event"] == "entrypoint_started"), None)
                running = [pid] if pid and state.alive(int(pid)) else []
            (still if running else []).append(r)
            if not running:
                print(f"stopped: {r.dir}", flush=True)
        left = still
        if left:
            time.sleep(1)
    if left:
        print(f"still stopping after {timeout:g} s: {' '.join(str(r.dir) for r in left)} (SLURM kills what is left "
              "after its KillWait)", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- diff, export, resubmit

def cmd_diff(a) -> int:
    from vrun.runs import diff

    ra, rb = one_run(a.run_a), one_run(a.run_b)
    if a.json:
        print(json.dumps({t: [{"key": k, "a": x, "b": y} for k, x, y in rows] for t, rows in diff.sections(ra, rb)},
                         indent=1, default=str))
    else:
        print(diff.render(ra, rb))
    return 0


def cmd_export(a) -> int:
    from vrun.runs import export

    r = one_run(a.run)
    if not fs.is_file(r.dir / "verl_config.yaml"):
        raise Usage(f"error: run={r.dir}: no verl_config.yaml; fix: plan the run again "
                    "(python runner.py ... mode=plan)")
    text = export.script(r)
    if a.output:
        from vrun.core import writer

        try:
            writer.write_text(a.output, text, mode=0o755)
        except OSError as e:
            raise Usage(f"error: --output={a.output}: {e}; fix: a plain file path (not a link)") from None
        print(f"wrote {a.output}: bash {a.output} [--cfg job | verl overrides...]", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_resubmit(a) -> int:
    r = one_run(a.run)
    if not r.on_slurm:
        raise Usage(f"error: run={r.dir}: never submitted to SLURM (no slurm_job.json); fix: submit it with "
                    "python runner.py ... cluster=slurm")
    if r.active:
        raise Usage(f"error: run={r.dir}: still {state.describe(r)} (job {r.job_id}); fix: python -m vrun cancel "
                    f"{r.dir} first, or wait for it")
    from vrun.launch.slurm import submit as slurm

    from vrun.core.problems import PlanError

    try:
        slurm.resubmit(str(r.dir), a.detach)
    except PlanError as e:
        raise Usage(str(e)) from None
    return 0


# ---------------------------------------------------------------- show

def cmd_show(a) -> int:
    """Draw a run's plan.svg, or a sweep dir's overview.svg (its points' peak memory and step time)."""
    from vrun.planning import picture

    ps = state.points(a.run)
    plans = []
    for p in ps:
        try:
            plans.append((p.name, json.loads((p / "plan.json").read_text())))
        except (OSError, json.JSONDecodeError) as e:
            raise Usage(f"error: run={p}: plan.json is unreadable ({e}); fix: plan the run again") from None
    single = len(ps) == 1 and fs.is_file(Path(a.run) / "plan.json")
    out = a.output or str((ps[0] / picture.PICTURE) if single else (Path(a.run) / picture.OVERVIEW))
    try:
        path = picture.render(plans[0][1], out) if single else picture.render_overview(plans, out)
    except ImportError as e:
        raise Usage(f"error: matplotlib: not importable ({e}); fix: pip install 'matplotlib==3.11.2'") from None
    except OSError as e:
        raise Usage(f"error: output={out}: not written ({e}); fix: -o a plain file in a folder of your own") from None
    print(path)
    return 0


# ---------------------------------------------------------------- main

def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m vrun", description="The runs this project wrote: list, inspect, "
                                 "follow, cancel, compare, export, resubmit.")
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = sub.add_parser("runs", help="list runs and sweep points, newest first",
                       description="Every run dir the project wrote (from the index in $VRUN_STATE_DIR, "
                       "$XDG_STATE_HOME/vrun or ~/.local/state/vrun), or the run/sweep dirs given.")
    p.add_argument("dirs", nargs="*", metavar="DIR", help="run dirs or sweep dirs (default: the index)")
    p.add_argument("--json", action="store_true", help="one JSON object per run, for scripts")
    p.add_argument("--state", help="only these states, comma-separated (planned,pending,running,requeued,"
                   "completed,failed,cancelled,lost)")
    p.add_argument("--model", help="only these models, comma-separated")
    p.set_defaults(fn=cmd_runs)
    p = sub.add_parser("status", help="one run in detail: plan, state, nodes, progress, logs",
                       description="The plan's summary, the job's state and reason, requeues, every progress "
                       "event with its time and node, where the logs are.")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("show", help="draw a run's plan.svg, or a sweep dir's overview.svg",
                       description="The plan as a picture: per-stage memory, the step-time estimate, the GPU grid "
                       "(a run dir); every point's peak memory and step time (a sweep dir). Prints the path.")
    p.add_argument("run", metavar="RUN")
    p.add_argument("-o", "--output", help="write the picture here (default: beside plan.json / in the sweep dir)")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("logs", help="the job's output from every node, merged or per node; -f follows",
                       description="submitit's per-task files (one task per node), each line prefixed with the "
                       "node and stream.")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--node", help="one node: its index (0…) or hostname")
    p.add_argument("-f", "--follow", action="store_true", help="follow the current job until it ends")
    p.add_argument("--stream", choices=["both", "out", "err"], default="both")
    p.set_defaults(fn=cmd_logs)
    p = sub.add_parser("cancel", help="scancel a pending or running run (all points of a sweep dir)",
                       description="scancel the run's jobs (requeued attempts included) and mark the run cancelled; "
                       "a run on this machine gets SIGTERM. A run that has ended is refused, naming its state.")
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--yes", action="store_true", help="do not ask before cancelling a sweep's points")
    p.add_argument("--no-wait", action="store_true", help="return without waiting for the jobs to leave the queue")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the jobs to stop")
    p.set_defaults(fn=cmd_cancel)
    p = sub.add_parser("diff", help="what differs between two runs, key: a → b",
                       description="Overrides, the verl config leaf by leaf, mesh and batch arithmetic, env var "
                       "names (secret values never), SLURM parameters, versions.")
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_diff)
    p = sub.add_parser("export", help="a standalone script reproducing the run's verl invocation",
                       description="Bash that needs only verl: the saved verl_config.yaml, the env set/unset, "
                       "verl's own command, the mesh in a comment; secrets by name only.")
    p.add_argument("run", metavar="RUN")
    p.add_argument("-o", "--output", help="write the script here (default: stdout)")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("resubmit", help="submit a SLURM run dir again (same config, same dir; verl resumes)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--detach", action="store_true", help="return once submitted")
    p.set_defaults(fn=cmd_resubmit)
    return ap


def main(argv: list | None = None) -> int:
    if not (sys.argv[1:] if argv is None else argv):
        parser().print_help(sys.stderr)
        return EXIT_USAGE
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except (Usage, RunDirError) as e:
        print(str(e), file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - never a traceback: one line naming the verb and what failed
        if os.environ.get("VRUN_FULL_ERROR") == "1":
            raise
        first = (str(e).splitlines() or [""])[0][:300]
        print(f"error: {a.verb}: {type(e).__name__}: {first}; fix: check the run dir's files (python -m vrun status "
              "RUN), or plan the run again", file=sys.stderr)
        return EXIT_USAGE


def _dur(s: float) -> str:
    s = int(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"

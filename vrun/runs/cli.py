"""`python -m vrun <verb>`: runs, status, show, logs, cancel, diff, export, resubmit (`--help` on each).

Bad input (an unknown dir, a dir that is not a run, cancelling a run that has ended) is one line naming the
thing, why and the fix, exit 2. Nothing here prints a secret: run dirs hold none, env vars are shown by name.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from vrun.rundir import state
from vrun.rundir.state import RunDirError
from vrun.core import fs
from vrun.runs.common import Usage, one_run
from vrun.runs.control import cmd_cancel, cmd_resubmit
from vrun.runs.listing import cmd_runs, cmd_status
from vrun.runs.logs import cmd_logs

EXIT_USAGE = 2
ANSI = re.compile(r"\x1b\[[0-9;]*m")


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


# ---------------------------------------------------------------- show

def cmd_show(a) -> int:
    """Draw a run's plan.svg, or a sweep dir's overview.svg (its points' peak memory and step time)."""
    from vrun.planning import picture

    ps = state.points(a.run)
    plans = []
    from vrun.rundir import files
    from vrun.rundir.record import PlanRecord

    for p in ps:
        PlanRecord.load(p)  # typed and bounded (a mesh no planner writes is one line, never drawn)
        plans.append((p.name, files.read_object(p / "plan.json", {})))
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
                   "completed,failed,cancelled,timeout,node_fail,preempted,lost)")
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
    p = sub.add_parser("cancel", help="stop a pending or running run (all points of a sweep dir)",
                       description="scancel the run's jobs (requeued attempts included) and mark the run cancelled; "
                       "a Ray job is stopped once the cluster's record of it names this run; a run on this machine "
                       "gets SIGTERM. A run that has ended (or whose job its cluster no longer knows) is refused, "
                       "naming its state.")
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
    p = sub.add_parser("resubmit", help="submit a SLURM or Ray run dir again (its plan's job, same dir; verl resumes)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--detach", action="store_true", help="return once submitted")
    p.add_argument("--exclude", default="", help="nodes the new job must not get (comma-separated hostnames)")
    p.set_defaults(fn=cmd_resubmit)
    return ap


def main(argv: list | None = None) -> int:
    if not (sys.argv[1:] if argv is None else argv):
        parser().print_help(sys.stderr)
        return EXIT_USAGE
    a = parser().parse_args(argv)
    try:
        from vrun.runs import kuberay  # cluster=kuberay: kubectl (cluster=ray: each verb reads its dashboard)

        code = kuberay.dispatch(a)
        return a.fn(a) if code is None else code
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
        from vrun.core.writer import mask

        first = mask((str(e).splitlines() or [""])[0])[:300]  # masked before cut: a cut secret would not mask
        print(f"error: {a.verb}: {type(e).__name__}: {first}; fix: check the run dir's files (python -m vrun status "
              "RUN), or plan the run again", file=sys.stderr)
        return EXIT_USAGE

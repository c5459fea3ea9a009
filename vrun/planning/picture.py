"""The plan as a picture: <run dir>/plan.svg from plan.json (matplotlib, Agg/SVG, imported here and in drawing.py).

Three panels: per pipeline stage, the training and rollout phases' memory per GPU as stacked bars against the GPU's
memory line; the step-time estimate per phase (low and high); the GPU grid (nodes × GPUs per node) coloured by
pipeline stage with the rollout replicas outlined. Every artist the tests look for carries an SVG id (gid):
`stage<S>-<phase>-<part>` for a bar segment, `gpu-limit`, `time-<phase>`, `gpu-cells` (a collection: one path per
GPU), `rollout-replicas` (one path per replica);
a sweep's overview: `point-<i>-memory`, `point-<i>-time`.

The panels are drawn in vrun.planning.drawing (`render`, `render_overview`, `stage_memory`, `gpu_layout`: their
names importable from here); this module names the files and draws a single run's picture in a child process.

A single run's picture is drawn beside its plan (Prerenderer: a child process started once the plan is accepted
imports matplotlib while the run dir is written and draws once plan.json is there; the plan does not wait for it, so
plan.svg appears a moment after the plan printed its path; a refused plan starts none); sweep points render only when asked (`python -m vrun show`, in the foreground).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

PICTURE = "plan.svg"
OVERVIEW = "overview.svg"
PICTURE_FAILED = "plan.svg.failed"  # the reason a background drawing failed

from vrun.planning.drawing import (  # noqa: E402,F401 - the panels; their names importable from here
    COLOURS, MAX_CELLS, ROLLOUT_PARTS, TRAIN_PARTS, VERDICT_COLOURS, figure as _figure, gpu_layout, render,
    render_overview, stage_memory, verdict_of)


# the drawing child's own bounds: matplotlib's import (it builds a font cache on first use), then the drawing once
# plan.json is handed over; past either it leaves PICTURE_FAILED saying so and exits. The wait for plan.json in
# between has none: it ends when the plan hands it over or exits (the child's stdin closes).
IMPORT_S = 120.0
DRAW_S = 120.0
# past a bound, a child whose hung code holds the interpreter is ended by the kernel (SIGALRM) this much later
HARD_S = 30


class Prerenderer:
    """A child process that imports matplotlib while the run dir is written, then draws plan.json when given its path.
    The plan does not wait for it: the child draws on after the plan has printed and exited (stdio to /dev/null, so
    no caller waits on its pipes), within its own bounds (import_s, draw_s). A drawing that fails, a matplotlib
    that does not import and one that hangs each leave PICTURE_FAILED beside plan.json with the reason;
    `python -m vrun show <run dir>` draws it again in the foreground."""

    def __init__(self, import_s: float = IMPORT_S, draw_s: float = DRAW_S) -> None:
        root = str(Path(__file__).resolve().parent.parent.parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        try:
            self.proc: Optional[subprocess.Popen] = subprocess.Popen(
                [sys.executable, "-m", "vrun.planning.picture", f"{import_s:g}", f"{draw_s:g}"],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env,
                start_new_session=True)
        except OSError:
            self.proc = None

    def render(self, plan_json: str) -> tuple[Optional[str], str]:
        """Hands the child plan.json's path: (the picture's path, "") once it is drawing, or (None, why)."""
        out = str(Path(plan_json).with_name(PICTURE))
        if self.proc is None or self.proc.poll() is not None:
            return None, "no process to draw it"
        try:
            self.proc.stdin.write(json.dumps({"plan": plan_json, "out": out}) + "\n")
            self.proc.stdin.close()
        except OSError as e:
            return None, f"the drawing process went away ({e.strerror or e})"
        self.proc = None  # it draws on its own from here
        return out, ""

    def close(self) -> None:
        """Stops a child that was never handed a plan (the plan was refused)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class _Bounds:
    """The child's watch over itself: a thread that, past the bound of the phase it is in, leaves the reason beside
    plan.json (reading the request itself when the main thread never got to it) and ends the process."""

    def __init__(self, import_s: float, draw_s: float) -> None:
        import threading
        import time

        self.draw_s, self.req, self.phase = draw_s, None, "import"
        self.until = time.monotonic() + import_s
        self.bound = import_s
        threading.Thread(target=self._watch, daemon=True).start()
        signal_alarm(import_s)

    def waiting(self) -> None:
        import math

        self.phase, self.until = "wait", math.inf
        signal_alarm(0)

    def drawing(self, req: dict) -> None:
        import time

        self.req, self.phase, self.until, self.bound = req, "draw", time.monotonic() + self.draw_s, self.draw_s
        signal_alarm(self.draw_s)

    def _watch(self) -> None:
        import time

        while time.monotonic() < self.until:
            time.sleep(0.2)
        what = "matplotlib's import" if self.phase == "import" else "the drawing"
        fail(self.req if self.req is not None else _request(), f"{what} took longer than {self.bound:g} s (it hung)")
        os._exit(1)


def signal_alarm(seconds: float) -> None:
    """The kernel's last word on a child whose hung code never lets the watch thread run (SIGALRM, its default
    action: the process ends)."""
    import signal

    if hasattr(signal, "alarm"):
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(seconds) + HARD_S if seconds else 0)


def _request() -> Optional[dict]:
    """The request line from stdin (None at EOF or for a line that is not a request)."""
    line = sys.stdin.readline()
    try:
        req = json.loads(line) if line.strip() else None
    except ValueError:
        return None
    return req if isinstance(req, dict) and isinstance(req.get("out"), str) else None


def fail(req: Optional[dict], reason: str) -> None:
    """The reason left beside plan.json (PICTURE_FAILED), through the writer, inside the run dir; nothing without a
    request."""
    if req is None:
        return
    from vrun.core import writer

    failed = Path(req["out"]).with_name(PICTURE_FAILED)
    try:
        writer.write_text(failed, reason.rstrip("\n") + "\n", root=str(failed.parent))
    except (OSError, ValueError):
        pass


def _serve(import_s: float = IMPORT_S, draw_s: float = DRAW_S) -> int:
    """The Prerenderer's child: import first, then one request from stdin (EOF: nothing to draw), each within its
    bound."""
    import io

    bounds = _Bounds(import_s, draw_s)
    try:
        os.nice(5)  # the plan in the parent comes first where CPUs are short
    except OSError:
        pass
    broken = None
    try:
        Figure = _figure()
        import matplotlib.backends.backend_svg  # noqa: F401
        import matplotlib.collections  # noqa: F401
        import matplotlib.patches  # noqa: F401

        warm = Figure(figsize=(2, 1))  # fonts and the SVG writer loaded before the plan arrives
        warm.add_subplot(111).bar([0], [1], label="x")
        warm.savefig(io.StringIO(), format="svg")
    except Exception as e:  # noqa: BLE001 - said beside the plan once it is handed over
        broken = f"matplotlib did not import ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); " \
                 "install it (pip install matplotlib), then python -m vrun show <run dir>"
    bounds.waiting()
    req = _request()
    if req is None:
        return 0
    if broken:
        fail(req, broken)
        return 1
    bounds.drawing(req)
    try:
        from vrun.rundir import files

        render(files.read_object(Path(req["plan"]), {}), req["out"])
    except Exception as e:  # noqa: BLE001 - the reason is left beside the plan, never raised into nothing
        fail(req, f"{type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_serve(*(float(a) for a in sys.argv[1:3])))

"""What the sweeper hands a launcher: every point of the run or sweep, composed, checked and planned. The launchers
(vrun.launch.local, vrun.launch.slurm.submit; Hydra plugins in hydra_plugins/vrun_launcher) write, check what
needs their target and run the points; nothing here plans or launches.

A run is a sweep of one point: it prints the plan's table, where a sweep prints a line per point.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from vrun.config import cli_errors
from vrun.planning.plan import Plan


@dataclass(frozen=True)
class Point:
    idx: int                       # the point's number in the sweep (hydra.job.num)
    overrides: tuple               # the point's own overrides, as typed
    plan: Plan
    resolved: dict                 # the run config resolved into plain containers (the manifest's)
    launcher: dict = field(default_factory=dict)  # what the launcher took from hydra.launcher for this point


@dataclass(frozen=True)
class Sweep:
    dir: str                       # the sweep dir (a single run's run dir is its plan's)
    points: tuple                  # Point, in order
    single: bool                   # one point: its table is printed (a sweep prints a line per point)

    @property
    def plans(self) -> list[Plan]:
        return [p.plan for p in self.points]


def write(point: Point, **fields) -> None:
    """The point's run dir: verl_config.yaml and plan.json (vrun.planning.report; `fields` of its record set by the
    launcher), manifest.json."""
    from vrun.planning import report
    from vrun.planning.manifest import write_manifest

    report.write(point.plan, **fields)
    write_manifest(point.resolved, point.plan.run_dir, list(point.overrides))


def refuse(failures: list, n_points: int, what: str = "do not plan; nothing was run") -> None:
    """failures: (point index or -1 for the whole sweep, overrides, lines). One line per problem and exit 2; a
    sweep's lines name their point, a single run's do not."""
    from vrun.config.overrides import shown_override

    if n_points == 1:
        cli_errors.emit([line for _, _, why in failures for line in why.splitlines()])
    lines = [f"sweep: {len(failures)} of {n_points} point(s) {what}"]
    for idx, overrides, why in sorted(failures, key=lambda f: f[0]):
        shown = " ".join(shown_override(o) for o in overrides)
        for line in why.splitlines():
            lines.append(f"point {idx} [{shown}]: {line}" if idx >= 0 else f"sweep: {line}")
    cli_errors.emit(lines)


def verdict(sweep: Sweep, check, what: str) -> None:
    """Each point's problems (check(point) -> list of Problem) before anything is written: any error refuses the
    sweep in its lines (`what`: what was not done); otherwise a run's plan table and every point's warnings are
    printed. The launchers of a standing cluster (vrun.launch.rayjobs, vrun.launch.kuberay) call it."""
    from vrun.planning import report

    checked, refused = [], []
    for point in sweep.points:
        found = check(point)
        errors = [x for x in found if not x.warning]
        if errors:
            refused.append((point.idx, point.overrides, "\n".join(x.line() for x in errors)))
        checked.append((point, [x for x in found if x.warning]))
    for point, warnings in checked:
        if sweep.single:
            print(report.table(point.plan), flush=True)
        for w in warnings:
            print(w.line(), flush=True)
    if refused:
        refuse(refused, len(sweep.points), what)

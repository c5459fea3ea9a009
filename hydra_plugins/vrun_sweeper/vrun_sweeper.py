"""The project's sweeper (hydra/sweeper=vrun, the default in conf/run.yaml): every run passes through it, a single
run being a sweep of one point (conf/run.yaml sets hydra.mode=MULTIRUN).

It expands the sweep as Hydra's basic sweeper does, composes each point, checks it (vrun.checks.composed, the run
dir, the launcher's own point checks) and plans it (vrun.planning.plan.make_plan: its one caller). One invalid
point and nothing is written or run, with that point named. Then it hands the planned points to the launcher
(hydra_plugins/vrun_launcher: vrun_local for cluster=local, submitit_slurm for cluster=slurm), which launches
them; the sweeper launches nothing.

Where a point lands: a run (one point, no sweep syntax, hydra.run.dir given or no hydra.sweep.dir) in hydra.run.dir; a sweep's
points in hydra.sweep.dir/<hydra.sweep.subdir>.
"""

import dataclasses
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from vrun.checks import composed as check_composed, paths as check_paths
from vrun.compose import verl_tree
from vrun.core.problems import PlanError, Problem

from hydra_plugins.vrun_sweeper import workers


# a group set's composition, in points checked and planned: the weight balancing a sweep's parts (workers.chunks)
COMPOSE_POINTS = 10.0


@dataclass
class PlanningSweeperConf:
    _target_: str = "hydra_plugins.vrun_sweeper.vrun_sweeper.PlanningSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="vrun", node=PlanningSweeperConf, provider="vrun")


def split_points(parsed: list) -> list:
    """The sweep's points, each a list of override texts, in the order and with the last-one-wins of Hydra's basic
    sweeper. Unlike it, each text reads back as the value typed: Hydra's element-as-string escapes the characters of
    an interpolation (`${oc.env:X,'a b'}` → `$\\{oc.env\\:X\\,'a\\ b'\\}`), which its own grammar then refuses."""
    import itertools

    from hydra.errors import HydraException

    parser = OverridesParser.create()
    final: dict = {}
    for o in parsed:
        key = o.get_key_element()
        if not o.is_sweep_override():
            final[key] = [o.input_line if getattr(o, "input_line", None) else f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            final[key] = [_element_text(parser, key, text, value)
                          for text, value in zip(o.sweep_string_iterator(), o.sweep_iterator())]
        else:
            raise HydraException(f"BasicSweeper does not support sweep type : {o.value_type.name}")
    return [list(x) for x in itertools.product(*final.values())]


def _element_text(parser: OverridesParser, key: str, text: str, value: Any) -> str:
    """`key=<element>` that Hydra's grammar reads back as `value`: Hydra's own spelling where it does, else the
    string as the project renders a value for Hydra (vrun.core.hydra_text.render: quoted, an interpolation kept)."""
    from vrun.core import hydra_text

    candidates = [f"{key}={text}"] + ([f"{key}={hydra_text.render(value)}"] if isinstance(value, str) else [])
    for candidate in candidates:
        try:
            if parser.parse_overrides([candidate])[0].value() == value:
                return candidate
        except Exception:  # noqa: BLE001 - a spelling the grammar refuses: try the next
            continue
    return candidates[0]


def launcher_key_problems(config: DictConfig) -> list:
    """hydra.launcher keys the chosen launcher's config lacks (`+hydra.launcher.partiton=debug`: Hydra's `+` adds
    them, and submitit's launcher would ignore them): one line each naming the nearest key it has. The keys a
    launcher has are its stored config's (hydra/launcher=<choice> in Hydra's ConfigStore); the project's own
    launchers have none, and a submitit key typed for them points at the cluster group that reads it."""
    import difflib

    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

    choice = (OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}).get("hydra/launcher")
    given = OmegaConf.select(config, "hydra.launcher", default=None)
    if choice is None or not isinstance(given, DictConfig):
        return []
    try:
        stored = ConfigStore.instance().load(f"hydra/launcher/{choice}.yaml").node
    except Exception:  # noqa: BLE001 - a launcher this project does not know: Hydra itself says what it lacks
        return []
    known = [k for k in stored.keys() if not str(k).startswith("_")]
    submitit = [f.name for f in dataclasses.fields(SlurmQueueConf) if not f.name.startswith("_")]
    raw = OmegaConf.to_container(given, resolve=False)
    cluster = (OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}).get("cluster")
    out = []
    for k in [k for k in raw if not str(k).startswith("_") and k not in known]:
        key, v = f"hydra.launcher.{k}", raw[k]
        shown = check_paths.short(v)
        near = difflib.get_close_matches(str(k), known, n=1, cutoff=0.5)
        if near:
            fix = f"hydra.launcher.{near[0]}={shown}"
        else:
            elsewhere = difflib.get_close_matches(str(k), submitit, n=1, cutoff=0.5)
            fix = (f"drop +{key}; with cluster=slurm: hydra.launcher.{elsewhere[0]}={shown}" if elsewhere else
                   f"drop +{key} (sbatch options: +cluster.additional_parameters.<option> with cluster=slurm)")
        what = f"the {choice} launcher (cluster={cluster})" if not known else f"the {choice} launcher"
        out.append(Problem(key, shown, f"no such key in {what}: nothing would read it", fix))
    return out


class PlanningSweeper(Sweeper):
    def __init__(self) -> None:
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.launcher = None
        self._overrides: dict = {}  # override text → Hydra's parsed Override (a sweep repeats the same few)
        self._parser: Optional[OverridesParser] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        unknown = launcher_key_problems(config)
        if unknown:  # before the launcher is built from them (the project's launchers take no keys at all)
            from vrun.config import cli_errors

            cli_errors.emit([p.line() for p in unknown])
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Any:
        from hydra_plugins.vrun_launcher.vrun_launcher import PlannedLauncher
        from vrun.config import cli_errors
        from vrun.launch.points import Sweep, refuse

        choices = OmegaConf.to_container(self.config.hydra.runtime.choices, resolve=False)
        if not isinstance(self.launcher, PlannedLauncher):
            cli_errors.emit([Problem("hydra/launcher", choices.get("hydra/launcher"), "the project's sweeper hands "
                                     "planned runs to the project's launchers only", "drop hydra/launcher=... "
                                     "(cluster=local and cluster=slurm select theirs)").line()])
        # the config loader lets glob() list a group's options, as Hydra's basic sweeper does
        parsed = OverridesParser.create(config_loader=self.hydra_context.config_loader).parse_overrides(arguments)
        too_many = check_composed.sweep_size_problems(parsed)
        if too_many:
            cli_errors.emit([p.line() for p in too_many])
        points: Sequence[Sequence[str]] = split_points(parsed)
        # the overrides as typed: iterating the node would resolve their ${...} (hydra.job.num is not set yet)
        hydra_overrides = OmegaConf.to_container(self.config.hydra.overrides.hydra, resolve=False)
        given = {o.lstrip("+~").split("=", 1)[0] for o in hydra_overrides}
        run_dir_given = [o.split("=", 1)[1] for o in hydra_overrides if o.startswith("hydra.run.dir=")]
        # one point given hydra.run.dir is a run, whatever hydra.sweep.dir says (Hydra's own reading)
        single = len(points) == 1 and not any(o.is_sweep_override() for o in parsed) and \
            ("hydra.sweep.dir" not in given or bool(run_dir_given))
        problems = self._sweep_problems(len(points), single, run_dir_given)
        if problems:
            cli_errors.emit([p.line() for p in problems])
        # resolve the sweep dir once: every point, the launcher and the jobs see the same one
        with open_dict(self.config):
            self.config.hydra.sweep.dir = str(Path(str(self.config.hydra.sweep.dir)).absolute())
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        self._bases, self._single, self._choices = {}, single, choices
        self._hydra_overrides, self._sweep_dir = hydra_overrides, sweep_dir
        try:
            n_workers = workers.count(len(points))
        except ValueError as e:  # refused for a run too: the variable is wrong whatever the sweep
            cli_errors.emit([f"error: {e}"])
        n_workers = 1 if single else n_workers
        items = list(enumerate(points))
        parts = workers.chunks(items, n_workers, key=lambda item: self._group_key(item[1]), setup=self._setup_cost)
        with workers.stop_on_signals():
            summaries, shared, results = workers.two_phase(parts, self._check_point, self._sweep_checks,
                                                           self._plan_points)
        failures = [s["failure"] for s in summaries if s.get("failure")] + shared["failures"]
        planned = []
        for part in results:
            planned += part["points"]
            failures += part["failures"]
            verl_tree.adopt(part["trees"])
        planned.sort(key=lambda p: p.idx)
        if failures:
            refuse(failures, len(points))
        self._hold(planned, len(points))
        return self.launcher.launch_planned(Sweep(str(sweep_dir), tuple(planned), single=len(planned) == 1))

    def _hold(self, planned: list, n_points: int) -> None:
        """The run dir (a sweep: the sweep dir) locked for the rest of this process (vrun.rundir.lock), then its
        checks made again under the lock: another process may have planned into it since they were made."""
        from vrun.config import cli_errors
        from vrun.launch.points import refuse
        from vrun.rundir import lock

        dirs = [(p.idx, p.overrides, p.plan.run_dir, p.resolved["run"].get("resume") is True) for p in planned]
        target, key = (dirs[0][2], "hydra.run.dir") if self._single else (str(self._sweep_dir), "hydra.sweep.dir")
        held = lock.take(target, key)
        if held is not None:
            cli_errors.emit([held.line()])
        failures = [] if self._single else [(-1, ["(all points)"], p.line()) for p in check_paths.sweep(
            str(self._sweep_dir), [(i, d) for i, _, d, _ in dirs], any(r for *_, r in dirs))]
        for idx, overrides, d, resume in dirs:
            again = check_paths.run_dir(d, key if self._single else "hydra.sweep.subdir",
                                        inside=None if self._single else str(self._sweep_dir), resume=resume)
            failures += [(idx, overrides, p.line()) for p in again if not p.warning]
        if failures:
            refuse(failures, n_points)

    def _group_key(self, overrides) -> tuple:
        """The point's group overrides: the points that share them share one composition."""
        return tuple(o.input_line for o in self._parsed(tuple(overrides)) if self._is_group(o))

    def _setup_cost(self, key: tuple) -> float:
        """What composing a group set costs, in points planned: none for the primary's own set (_primary_is_base),
        else COMPOSE_POINTS (Hydra's composition, about 80 ms against 8 ms to check and plan a point)."""
        groups = [o for o in self._parsed(key) if self._is_group(o)]
        return 0.0 if self._primary_is_base(groups) else COMPOSE_POINTS

    def _check_point(self, item: tuple) -> tuple:
        """Phase one of a point (vrun_sweeper.workers): composed and checked. Returns (summary, kept): the summary
        the sweep's own checks read (run dir, resume, model, or the point's failure), and what phase two plans."""
        from vrun.config import cli_errors

        idx, overrides = item
        choices, sweep_dir = self._choices, self._sweep_dir
        try:
            cfg, dirs, launcher, point_choices = self._compose(list(overrides), self._bases, self._single)
            if point_choices.get("hydra/launcher") != choices.get("hydra/launcher"):
                return {"failure": (idx, overrides, Problem(
                    "hydra/launcher", point_choices.get("hydra/launcher"), "a sweep's points share one launcher "
                    f"({choices.get('hydra/launcher')})", "sweep cluster=... in separate commands").line())}, None
            if point_choices.get("cluster") != self.launcher.cluster:
                return {"failure": (idx, overrides, self._wrong_cluster(point_choices).line())}, None
            with open_dict(cfg):
                cfg.hydra = {"job": {"num": idx, "id": str(idx), "name": str(self.config.hydra.job.name)},
                             "run": {"dir": dirs["run"]}, "sweep": {"subdir": dirs["subdir"], "dir": str(sweep_dir)},
                             "launcher": launcher}
                if self._single:  # a run: hydra.run.dir (resolved with the point's values)
                    run_dir, key = str(Path(str(cfg.hydra.run.dir)).absolute()), "hydra.run.dir"
                    inside = None
                else:
                    run_dir = os.path.normpath(str(sweep_dir / str(cfg.hydra.sweep.subdir)))
                    key, inside = "hydra.sweep.subdir", str(sweep_dir)
                problems, taken = self.launcher.point_problems(cfg, launcher, self._hydra_overrides, str(sweep_dir),
                                                               run_dir, key if self._single else "hydra.sweep.dir")
                del cfg["hydra"]
            problems += check_composed.bool_word_problems([(o.key_or_group, o.value()) for o in self._parsed(
                tuple(overrides)) if not self._is_group(o) and not o.is_sweep_override() and not o.is_delete()])
            parts = check_composed.containers(cfg)
            problems += self.launcher.as_given(check_composed.config_problems(cfg, choices=point_choices,
                                                                              parts=parts), taken)
            if not [p for p in problems if not p.warning]:
                problems += check_paths.run_dir(run_dir, key, inside=inside, resume=OmegaConf.select(
                    cfg, "run.resume", default=False) is True)
            errors = [p for p in problems if not p.warning]
            if errors:
                return {"failure": (idx, overrides, "\n".join(p.line() for p in errors))}, None
            resolved = parts[1]
            return {"idx": idx, "run_dir": run_dir, "resume": resolved["run"].get("resume") is True,
                    "model": resolved["model"]["name"]}, (idx, overrides, cfg, run_dir, taken, resolved)
        except Exception as e:  # noqa: BLE001 - reported per point
            return {"failure": (idx, overrides, cli_errors.describe(e))}, None

    def _sweep_checks(self, summaries: list) -> dict:
        """The sweep's own checks, over every point's summary (in the parent): the points' run dirs apart and in
        the sweep dir (its failures, as (-1, ...)); one model or several (a single model may take MODEL_PATH)."""
        ok = sorted((s for s in summaries if not s.get("failure")), key=lambda s: s["idx"])
        found = [] if self._single else check_paths.sweep(
            str(self._sweep_dir), [(s["idx"], s["run_dir"]) for s in ok], any(s["resume"] for s in ok))
        return {"single_model": len({s["model"] for s in ok}) == 1,
                "failures": [(-1, ["(all points)"], p.line()) for p in found]}

    def _plan_points(self, kept: list, shared: dict) -> dict:
        """Phase two: a part's checked points planned (vrun.planning.plan.make_plan: its one caller). Returns its
        Points, its failures as (idx, overrides, lines), and the verl trees it composed (the parent keeps them in
        the state dir once a plan is written)."""
        from vrun.config import cli_errors
        from vrun.config.schema import typed
        from vrun.launch.points import Point
        from vrun.planning.plan import make_plan

        out: dict = {"points": [], "failures": []}
        for idx, overrides, cfg, run_dir, taken, resolved in [k for k in kept if k is not None]:
            try:
                plan = make_plan(typed(cfg, resolved), run_dir, single_model=shared["single_model"],
                                 run_dir_key="hydra.run.dir" if self._single else "hydra.sweep.dir",
                                 typed=tuple(overrides))
                plan.verl_text  # noqa: B018 - rendered here, where it is planned (a worker), not where written
                out["points"].append(Point(idx, tuple(overrides), plan, resolved, taken))
            except PlanError as e:
                out["failures"].append((idx, overrides, str(PlanError(self.launcher.as_given(e.problems, taken),
                                                                      e.hints))))
            except Exception as e:  # noqa: BLE001
                out["failures"].append((idx, overrides, cli_errors.describe(e)))
        out["trees"] = verl_tree.composed_here()
        return out

    def _sweep_problems(self, n_points: int, single: bool, run_dir_given: list) -> list:
        """The sweep's own problems, before any point is composed."""
        from vrun.checks.paths import short

        out = []
        if run_dir_given and n_points > 1:
            out.append(Problem("hydra.run.dir", run_dir_given[-1], f"a sweep of {n_points} points has one run dir "
                               "per point, under hydra.sweep.dir", f"hydra.sweep.dir={run_dir_given[-1]}"))
        elif not single:
            out += check_paths.run_dir(str(Path(str(self.config.hydra.sweep.dir)).absolute()), "hydra.sweep.dir",
                                       resume=True)
        subdir = OmegaConf.select(self.config, "hydra.output_subdir", default=None)
        if subdir is not None:
            out.append(Problem("hydra.output_subdir", short(subdir), "Hydra's own copies of the config would be "
                               "written past the project's writer (and outside the run dir if absolute); plan.json "
                               "and manifest.json record the config", "drop it (conf/run.yaml sets null)"))
        return out

    def _wrong_cluster(self, choices: dict) -> Problem:
        if self.launcher.cluster == "slurm":
            return Problem("hydra/launcher", choices.get("hydra/launcher"), f"the submitit launcher takes its nodes, "
                           f"GPUs and time from the cluster group, and cluster={choices.get('cluster')} was given",
                           f"cluster=slurm in place of cluster={choices.get('cluster')} (it selects the launcher "
                           "itself), or drop hydra/launcher=...")
        return Problem("hydra/launcher", choices.get("hydra/launcher"), f"cluster={choices.get('cluster')} "
                       f"launches through its own launcher (this one runs on {self.launcher.cluster})",
                       "drop hydra/launcher=... (the cluster group selects it)")

    def _compose(self, overrides: List[str], bases: dict, single: bool = False) -> tuple:
        """A point's task config, its raw run dir and sweep subdir, its hydra.launcher node (unresolved) and
        its group choices: Hydra composes once per distinct set of group choices; the value overrides are then
        applied to a copy with Hydra's own override logic (tests/test_sweep.py checks the equivalence with plain
        runs). A run (single: one point, no sweep syntax) is the config Hydra already composed with the same
        overrides."""
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        if single:
            return self._split(self.config.copy())
        parsed = self._parsed(tuple(overrides))
        groups = [o.input_line for o in parsed if self._is_group(o)]
        values = [o for o in parsed if not self._is_group(o)]
        key = tuple(groups)
        if key not in bases:
            primary = self._primary_is_base([o for o in parsed if self._is_group(o)])
            full, dirs, launcher, choices = self._split(
                self.config.copy() if primary else
                self.hydra_context.config_loader.load_sweep_config(self.config, groups))
            # each point's copy of the base: a pickle round trip in memory (~10x faster than DictConfig.copy;
            # flags, types and validation kept)
            bases[key] = (pickle.dumps(full), dirs, launcher, choices)
        base, dirs, launcher, choices = bases[key]
        cfg = pickle.loads(base)
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        return cfg, dirs, launcher, choices

    def _primary_is_base(self, groups: list) -> bool:
        """Whether the config Hydra composed first (the primary) can stand for this group set's composition: the
        point's group overrides choose what the primary chose (plain group=option, no package), every group has
        an option (the primary, composed as a multirun, skips a group left at ???, where the point's own
        composition would refuse it), and no command-line value override is a + or ~ (the point applies its
        overrides again onto the copy: a plain or ++ assignment to the same effect, a + or ~ not). The primary
        skipped the sweep's own overrides, which the point applies."""
        chosen = OmegaConf.to_container(self.config.hydra.runtime.choices, resolve=False)
        if "???" in chosen.values():
            return False
        for o in groups:
            if o.is_add() or o.is_delete() or o.is_force_add() or o.package is not None or \
                    chosen.get(o.key_or_group) != o.value():
                return False
        typed = OmegaConf.to_container(self.config.hydra.overrides.task, resolve=False)  # the text, not resolved
        return not any(o.is_add() or o.is_delete() for o in self._parsed(tuple(typed)) if not self._is_group(o))

    @staticmethod
    def _split(full: DictConfig) -> tuple:
        """A composed config (changed in place) as its task config and what the point needs of its hydra node."""
        dirs = {"run": OmegaConf.to_container(full.hydra.run, resolve=False)["dir"],
                "subdir": OmegaConf.to_container(full.hydra.sweep, resolve=False)["subdir"]}
        launcher = OmegaConf.to_container(full.hydra.launcher, resolve=False)
        choices = OmegaConf.to_container(full.hydra.runtime.choices, resolve=False)
        with open_dict(full):
            del full["hydra"]  # copying Hydra's own node per point would cost more than the plan
        return full, dirs, launcher, choices

    def _parsed(self, overrides: tuple) -> list:
        """Each override parsed once per sweep."""
        missing = [o for o in overrides if o not in self._overrides]
        if missing:
            self._parser = self._parser or OverridesParser.create()
            self._overrides.update(zip(missing, self._parser.parse_overrides(missing)))
        return [self._overrides[o] for o in overrides]

    def _is_group(self, override) -> bool:
        key = override.key_or_group
        if "/" in key or "@" in key:
            return True
        repo = self.hydra_context.config_loader.repository  # type: ignore[attr-defined]
        return "." not in key and repo.group_exists(key)

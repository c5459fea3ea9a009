"""The project's sweeper (hydra/sweeper=vrun, the default in conf/run.yaml).

Hydra's basic sweeper only composes each point. This one expands the sweep the same way, then plans and
checks every point before the first runs: one invalid point and nothing runs, with that point named.
mode=plan sweeps stop there (every point's run dir written, one line per point); other modes hand the
checked points to the configured launcher, and each job reuses its plan.
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from vrun.checks import composed as check_composed, paths as check_paths, sbatch as check_sbatch
from vrun.core.problems import PlanError, Problem
from vrun.config.schema import Mode


@dataclass
class PlanningSweeperConf:
    _target_: str = "hydra_plugins.vrun_sweeper.vrun_sweeper.PlanningSweeper"
    max_batch_size: Optional[int] = None


ConfigStore.instance().store(group="hydra/sweeper", name="vrun", node=PlanningSweeperConf, provider="vrun")


class PlanningSweeper(Sweeper):
    def __init__(self, max_batch_size: Optional[int] = None):
        self.max_batch_size = max_batch_size
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.launcher = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Any:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        from vrun.config import cli_errors
        from vrun.planning import report
        from vrun.launch.slurm import submit as slurm
        from vrun.launch import task

        # the config loader lets glob() list a group's options, as Hydra's basic sweeper does
        parsed = OverridesParser.create(config_loader=self.hydra_context.config_loader).parse_overrides(arguments)
        too_many = check_composed.sweep_size_problems(parsed)
        if too_many:
            cli_errors.emit([p.line() for p in too_many])
        points: Sequence[Sequence[str]] = BasicSweeper.split_arguments(parsed, None)[0]
        # resolve the sweep dir once: every point, the launcher and the jobs see the same one
        with open_dict(self.config):
            self.config.hydra.sweep.dir = str(Path(str(self.config.hydra.sweep.dir)).absolute())
        composed, failures = [], []
        bases: dict = {}
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        # hydra.run.dir given with a run that is a multirun (cluster=slurm): honoured for one point, else refused
        run_dir_given = [o.split("=", 1)[1] for o in self.config.hydra.overrides.hydra
                         if o.startswith("hydra.run.dir=")]
        problems = check_paths.run_dir(str(sweep_dir), "hydra.sweep.dir", resume=True)
        if run_dir_given and len(points) > 1:
            problems.append(Problem("hydra.run.dir", run_dir_given[-1], f"a sweep of {len(points)} points has one "
                                    "run dir per point, under hydra.sweep.dir", f"hydra.sweep.dir={run_dir_given[-1]}"))
        if problems:
            cli_errors.emit([p.line() for p in problems])
        for idx, overrides in enumerate(points):
            try:
                cfg, subdir, launcher, choices = self._compose(list(overrides), bases)
                submitit_slurm = "SlurmLauncher" in str(launcher.get("_target_", ""))
                if "submitit" in str(launcher.get("_target_", "")) and choices.get("cluster") != "slurm":
                    failures.append((idx, overrides, Problem(
                        "hydra/launcher", choices.get("hydra/launcher"), "the submitit launcher takes its nodes, "
                        "GPUs and time from the cluster group", "add cluster=slurm (it selects the launcher "
                        "itself)").line()))
                    continue
                if choices.get("cluster") == "slurm" and not submitit_slurm:
                    failures.append((idx, overrides, Problem(
                        "hydra/launcher", choices.get("hydra/launcher"), "cluster=slurm submits through Hydra's "
                        "submitit_slurm launcher (another would run the job on this machine)",
                        "drop hydra/launcher=... and hydra.launcher._target_ (cluster=slurm selects it)").line()))
                    continue
                point_dir = sweep_dir
                with open_dict(cfg):
                    if run_dir_given:
                        point_dir = Path(run_dir_given[-1]).absolute()
                        subdir = "."
                    cfg.hydra = {"job": {"num": idx, "id": str(idx), "name": str(self.config.hydra.job.name)},
                                 "sweep": {"subdir": subdir, "dir": str(point_dir)}, "launcher": launcher}
                    run_dir = os.path.normpath(str(point_dir / str(cfg.hydra.sweep.subdir)))
                    given = slurm.launcher_given(launcher, list(self.config.hydra.overrides.hydra)) \
                        if submitit_slurm else set()
                    # resolved here only what the mesh decides and the job's folder: every other launcher value
                    # goes onto its knob unresolved, for the knob's checks
                    resolved = {k: OmegaConf.select(cfg, f"hydra.launcher.{k}")
                                for k in (given & set(slurm.LAUNCHER_MESH)) | {"submitit_folder"} if k in launcher}
                    del cfg["hydra"]
                problems, taken = slurm.take_launcher(cfg, launcher, given, resolved) if submitit_slurm else ([], {})
                folder = str(Path(str(resolved.get("submitit_folder") or sweep_dir / ".submitit/%j")).absolute())
                if "submitit_folder" in given:
                    problems += slurm.folder_problems(folder, str(sweep_dir))
                problems += slurm.as_given(check_composed.config_problems(cfg, choices=choices), taken)
                if not problems:
                    problems = check_paths.run_dir(run_dir, "hydra.sweep.subdir", inside=str(point_dir),
                                                   resume=OmegaConf.select(cfg, "run.resume", default=False) is True)
                if not problems and submitit_slurm:
                    problems = check_sbatch.expanded_path(run_dir, "hydra.run.dir" if run_dir_given else
                                                          "hydra.sweep.dir")
                errors = [p for p in problems if not p.warning]
                if errors:
                    failures.append((idx, overrides, "\n".join(p.line() for p in errors)))
                    continue
                composed.append((idx, overrides, cfg, run_dir, (folder, taken)))
            except Exception as e:  # noqa: BLE001 - reported per point below
                failures.append((idx, overrides, cli_errors.describe(e)))
        resume = any(OmegaConf.select(c, "run.resume", default=False) is True for _, _, c, _, _ in composed)
        for p in check_paths.sweep(str(sweep_dir), [d for _, _, _, d, _ in composed], resume):
            failures.append((-1, ["(all points)"], p.line()))
        models = {c.model.name for _, _, c, _, _ in composed}
        plans = []
        for idx, overrides, cfg, run_dir, (_, taken) in composed:
            try:
                plans.append((idx, overrides, task.plan_config(cfg, run_dir, single_model=len(models) == 1)))
            except PlanError as e:
                failures.append((idx, overrides, str(PlanError(slurm.as_given(e.problems, taken), e.hints))))
            except Exception as e:  # noqa: BLE001
                failures.append((idx, overrides, cli_errors.describe(e)))
        if failures:
            self._refuse(failures, len(points))
        modes = {p.config.mode for _, _, p in plans}
        if "SlurmLauncher" in str(self.config.hydra.launcher.get("_target_", "")):
            return self._slurm(plans, composed)
        if modes == {Mode.plan}:
            from vrun.planning.manifest import write_manifest

            for (idx, overrides, p), (_, _, cfg, _, _) in zip(plans, composed):
                report.write(p)
                write_manifest(cfg, p.run_dir, list(overrides))
                print(report.one_line(idx, overrides, p), flush=True)
            print(f"sweep: {len(plans)} point(s) planned and checked under {self.config.hydra.sweep.dir}", flush=True)
            return []
        for idx, overrides, p in plans:
            task.leave_planned(p)
        print(f"sweep: {len(plans)} point(s) planned and checked; launching", flush=True)
        returns = []
        batch = self.max_batch_size or len(points)
        for start in range(0, len(points), batch):
            chunk = [list(o) for o in points[start:start + batch]]
            results = self.launcher.launch(chunk, initial_job_idx=start)
            returns.append(results)
            for r in results:
                _ = r.return_value  # re-raises a failed job's exception
        return returns

    def _compose(self, overrides: List[str], bases: dict) -> DictConfig:
        """A point's task config and its raw hydra.sweep.subdir: Hydra composes once per distinct set of group
        choices; the value overrides are then applied to a copy with Hydra's own override logic
        (tests/test_sweep.py checks the equivalence with plain runs)."""
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        parsed = OverridesParser.create().parse_overrides(overrides)
        groups = [o.input_line for o in parsed if self._is_group(o)]
        values = [o for o in parsed if not self._is_group(o)]
        key = tuple(groups)
        if key not in bases:
            full = self.hydra_context.config_loader.load_sweep_config(self.config, groups)
            subdir = OmegaConf.to_container(full.hydra.sweep, resolve=False)["subdir"]
            launcher = OmegaConf.to_container(full.hydra.launcher, resolve=False)
            choices = OmegaConf.to_container(full.hydra.runtime.choices, resolve=False)
            with open_dict(full):
                del full["hydra"]  # copying Hydra's own node per point would cost more than the plan
            bases[key] = (full, subdir, launcher, choices)
        base, subdir, launcher, choices = bases[key]
        cfg = base.copy()
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        return cfg, subdir, launcher, choices

    def _refuse(self, failures, n_points: int, what: str = "do not plan; nothing was run") -> None:
        """One line per problem; a sweep's lines name their point, a single run's do not."""
        from vrun.config import cli_errors

        if n_points == 1:
            cli_errors.emit([line for _, _, why in failures for line in why.splitlines()])
        lines = [f"sweep: {len(failures)} of {n_points} point(s) {what}"]
        for idx, overrides, why in sorted(failures):
            for line in why.splitlines():
                lines.append(f"point {idx} [{' '.join(overrides)}]: {line}" if idx >= 0 else f"sweep: {line}")
        cli_errors.emit(lines)

    def _slurm(self, plans, composed) -> Any:
        """SLURM: every point's verdict shown and every check that needs no GPU made (vrun.launch.slurm.checks) before
        anything is written or submitted; then each job written to its run dir and submitted."""
        from vrun.config import cli_errors
        from vrun.planning import report
        from vrun.launch.slurm import submit as slurm, checks as slurm_checks
        from vrun.core import writer
        from vrun.planning.manifest import write_manifest

        single = len(plans) == 1
        submitting = {p.config.mode for _, _, p in plans} != {Mode.plan}
        parts = slurm_checks.partitions() if submitting else None
        checked, refused = [], []
        for (idx, overrides, p), (_, _, cfg, _, (folder, _)) in zip(plans, composed):
            sub = slurm.Submission.of(p)
            found = []
            if submitting:
                found += slurm_checks.storage_problems(p, folder) + slurm_checks.partition_problems(sub, parts or [])
            if p.config.mode == Mode.train:
                found += slurm_checks.login_problems(p)
            elif p.config.mode == Mode.preflight:
                from vrun.launch import preflight

                found += preflight.memory_problems(p)
            errors = [x for x in found if not x.warning]
            if errors:
                refused.append((idx, overrides, "\n".join(x.line() for x in errors)))
            checked.append((idx, overrides, p, cfg, folder, sub, [x for x in found if x.warning]))
        for idx, overrides, p, _, _, sub, warnings in checked:
            if single:
                print(report.table(p), flush=True)
                for w in warnings:
                    print(w.line(), flush=True)
                print(f"slurm   {sub.describe()}", flush=True)
            else:
                print(slurm.point_line(idx, overrides, p, sub, warnings), flush=True)
                for w in list(p.warnings) + warnings:
                    print(f"    {w.line()}", flush=True)
        if refused:
            self._refuse(refused, len(plans), "refused before sbatch; nothing was submitted")
        items, total = [], 0.0
        for idx, overrides, p, cfg, folder, sub, _ in checked:
            report.write(p, extra={"slurm": {"parameters": sub.parameters, "max_num_timeout": sub.max_num_timeout,
                                             "gpu_hours": sub.gpu_hours, "submitit_folder": folder,
                                             "sbatch": "sbatch.sh"}})
            write_manifest(cfg, p.run_dir, list(overrides))
            writer.write_text(Path(p.run_dir) / "sbatch.sh", slurm.sbatch_script(sub, folder), root=p.run_dir)
            items.append((p, sub, p.config.mode, folder))
            total += sub.gpu_hours
        if not single:
            print(f"sweep: {len(items)} job(s), {total:.1f} GPU-hours", flush=True)
        if not submitting:
            print("plan only: nothing submitted (sbatch.sh in " + ("the run dir)" if single else "each run dir)"),
                  flush=True)
            return []
        try:
            slurm.confirm(total, plans[0][2].config.cluster)
        except Exception as e:  # noqa: BLE001 - one line, non-zero exit
            cli_errors.emit([cli_errors.describe(e)])
        return slurm.submit(items, detach=plans[0][2].config.cluster.detach)

    def _is_group(self, override) -> bool:
        key = override.key_or_group
        if "/" in key or "@" in key:
            return True
        repo = self.hydra_context.config_loader.repository  # type: ignore[attr-defined]
        return "." not in key and repo.group_exists(key)

"""The project's launchers: each launches the points the project's sweeper (hydra/sweeper=vrun) composed, planned
and checked; none composes or plans again.

- hydra/launcher=vrun_local (what cluster=local selects): this machine (vrun.launch.local).
- hydra/launcher=vrun_ray (what cluster=ray selects): a standing Ray cluster's Job Submission API
  (vrun.launch.rayjobs).
- hydra/launcher=vrun_kuberay (what cluster=kuberay selects): a RayJob manifest for a KubeRay operator, applied
  with kubectl when asked (vrun.launch.kuberay).
- hydra/launcher=submitit_slurm (what cluster=slurm selects) is VrunSlurmLauncher, a subclass of Hydra's submitit
  SlurmLauncher stored under the stock name, so the command users type resolves to it: one sbatch job per point,
  each with its own nodes, detached or waited on (vrun.launch.slurm.submit).

The sweeper talks to them through PlannedLauncher: `point_problems(...)` per point before its plan,
`launch_planned(sweep)` after every point passed. Hydra's own `launch(overrides)` would compose each job again:
refused.
"""
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


SWEEPER = "vrun"  # the hydra/sweeper option that plans the points these launchers launch


class PlannedLauncher(Launcher):
    """A launcher of planned points. `cluster`: the cluster group (cluster.name) whose runs it launches."""
    cluster: ClassVar[str] = ""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Another sweeper (hydra/sweeper=basic) is refused here, where it sets up its launcher: before it writes
        anything (Hydra's basic sweeper writes multirun.yaml, overrides and all, before launching)."""
        from omegaconf import OmegaConf

        choice = (OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}).get("hydra/sweeper")
        if choice != SWEEPER:
            from vrun.config import cli_errors
            from vrun.core.problems import Problem

            cli_errors.emit([Problem("hydra/sweeper", choice, "the project's sweeper plans and checks every point "
                                     "before anything is written or run; another sweeper would skip that",
                                     "drop hydra/sweeper=... (conf/run.yaml selects vrun)").line()])
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        raise RuntimeError(f"{type(self).__name__} launches the points hydra/sweeper=vrun planned; it is not "
                           "driven by another sweeper (drop the hydra/sweeper override)")

    def point_problems(self, cfg: DictConfig, launcher: dict, hydra_overrides: list, sweep_dir: str,
                       run_dir: str, run_dir_key: str) -> tuple[list, dict]:
        """A composed point's problems that only this launcher knows (cfg still holds the point's hydra node), and
        what it took from the point's hydra.launcher node (handed back in the Point)."""
        return [], {}

    def as_given(self, problems: list, taken: dict) -> list:
        """The point's problems named by the keys the user typed (what point_problems took)."""
        return problems

    def launch_planned(self, sweep: Any) -> Any:  # vrun.launch.points.Sweep
        raise NotImplementedError


@dataclass
class VrunLocalConf:
    _target_: str = "hydra_plugins.vrun_launcher.vrun_launcher.VrunLocalLauncher"


class VrunLocalLauncher(PlannedLauncher):
    cluster = "local"

    def launch_planned(self, sweep: Any) -> Any:
        from vrun.launch import local

        # a single run draws its plan (sweep points only when asked: python -m vrun show); the drawing child starts
        # once the plan is accepted, so a refused plan costs no matplotlib import
        drawer = None
        if sweep.single:
            from vrun.planning.picture import Prerenderer

            drawer = Prerenderer()
        return local.launch(sweep, drawer)


@dataclass
class VrunRayConf:
    _target_: str = "hydra_plugins.vrun_launcher.vrun_launcher.VrunRayLauncher"


class VrunRayLauncher(PlannedLauncher):
    cluster = "ray"

    def launch_planned(self, sweep: Any) -> Any:
        from vrun.launch import rayjobs

        return rayjobs.launch(sweep)


@dataclass
class VrunKubeRayConf:
    _target_: str = "hydra_plugins.vrun_launcher.vrun_launcher.VrunKubeRayLauncher"


class VrunKubeRayLauncher(PlannedLauncher):
    cluster = "kuberay"

    def launch_planned(self, sweep: Any) -> Any:
        from vrun.launch import kuberay

        return kuberay.launch(sweep)


@dataclass
class VrunSlurmConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.vrun_launcher.vrun_launcher.VrunSlurmLauncher"


class VrunSlurmLauncher(PlannedLauncher, SlurmLauncher):
    cluster = "slurm"

    def point_problems(self, cfg: DictConfig, launcher: dict, hydra_overrides: list, sweep_dir: str,
                       run_dir: str, run_dir_key: str) -> tuple[list, dict]:
        from vrun.launch.slurm import submit

        return submit.point_problems(cfg, launcher, hydra_overrides, sweep_dir, run_dir, run_dir_key)

    def as_given(self, problems: list, taken: dict) -> list:
        from vrun.launch.slurm import submit

        return submit.as_given(problems, taken.get("knobs", {}))

    def launch_planned(self, sweep: Any) -> Any:
        from vrun.launch.slurm import submit

        return submit.launch(sweep)


def register() -> None:
    """Everything conf/ composes against: the run schema (vrun.config.schema) and the launchers' configs. Hydra's
    plugin scan executes every plugin module again, submitit's config module (which stores its own submitit_slurm)
    included, in an order set by sys.path: so the scan runs first here, and the project's entry is stored after it,
    replacing submitit's (tests/test_launcher.py)."""
    from hydra.core.plugins import Plugins

    from vrun.config import schema

    schema.register()
    Plugins.instance()
    ConfigStore.instance().store(group="hydra/launcher", name="vrun_local", node=VrunLocalConf, provider="vrun")
    ConfigStore.instance().store(group="hydra/launcher", name="vrun_ray", node=VrunRayConf, provider="vrun")
    ConfigStore.instance().store(group="hydra/launcher", name="vrun_kuberay", node=VrunKubeRayConf, provider="vrun")
    ConfigStore.instance().store(group="hydra/launcher", name="submitit_slurm", node=VrunSlurmConf, provider="vrun")

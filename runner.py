"""Compose → check → plan → hand off to verl.  `python runner.py model=glm5_1 mesh=256gpu algo=grpo mode=plan`

Every run passes through the project's sweeper (hydra_plugins/vrun_sweeper: compose, check and plan each point)
and its launcher (hydra_plugins/vrun_launcher: write, check the target, run or submit). Hydra never calls the task
function below: conf/run.yaml sets hydra.mode=MULTIRUN, and hydra.mode=RUN is refused before anything is written.
"""
import hydra
from omegaconf import DictConfig

from hydra_plugins.vrun_launcher.vrun_launcher import register
from vrun.config import cli_errors
from vrun.core import writer
from vrun.rundir import records

register()


@hydra.main(version_base=None, config_path="conf", config_name="run")
def main(cfg: DictConfig) -> None:
    cli_errors.emit([cli_errors.sweeper_only_problem("RUN")])


if __name__ == "__main__":
    import sys

    from vrun.config.overrides import typed_secrets, with_cluster_of_launcher

    sys.argv[1:] = with_cluster_of_launcher(sys.argv[1:])  # hydra/launcher=submitit_slurm is cluster=slurm
    writer.install()
    writer.hide(typed_secrets(sys.argv[1:]))  # a value typed for a secret key: masked in every line and file
    cli_errors.one_line_hydra_errors()
    cli_errors.mode_from_run_yaml()
    # a state dir at / or a system dir, or one of another user's, is refused before anything is written
    state_dir_refused = records.state_dir_problem()
    if state_dir_refused:
        cli_errors.emit([state_dir_refused])
    main()

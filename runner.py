"""Compose → check → plan → hand off to verl.  `python runner.py model=glm5_1 mesh=256gpu algo=grpo mode=plan`

Every run passes through the project's sweeper (hydra_plugins/vrun_sweeper: compose, check and plan each point)
and its launcher (hydra_plugins/vrun_launcher: write, check the target, run or submit). Hydra never calls the task
function below: conf/run.yaml sets hydra.mode=MULTIRUN, and hydra.mode=RUN is refused before anything is written.
"""
import sys


def _interrupted(kind, value, tb, _default=sys.excepthook):
    """Ctrl-C before the project's own handlers are in place (imports, composition): one line, not a traceback."""
    if issubclass(kind, KeyboardInterrupt):  # written straight to fd 2: the process ends by SIGINT right after
        import os

        os.write(2, b"\ninterrupted (Ctrl-C); `python -m vrun runs <dir>` shows whatever was planned or submitted\n")
        return
    _default(kind, value, tb)


sys.excepthook = _interrupted

import hydra  # noqa: E402 - after the hook: Ctrl-C while importing is one line too
from omegaconf import DictConfig  # noqa: E402

from hydra_plugins.vrun_launcher.vrun_launcher import register
from vrun.config import cli_errors
from vrun.core import writer
from vrun.rundir import records

register()


@hydra.main(version_base=None, config_path="conf", config_name="run")
def main(cfg: DictConfig) -> None:
    cli_errors.emit([cli_errors.sweeper_only_problem("RUN")])


if __name__ == "__main__":
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

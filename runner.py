"""Compose → check → plan → hand off to verl.  `python runner.py model=glm5_1 mesh=256gpu algo=grpo mode=plan`"""
import hydra
from omegaconf import DictConfig

from vrun.config import cli_errors, schema
from vrun.core import writer

schema.register()


@hydra.main(version_base=None, config_path="conf", config_name="run")
def main(cfg: DictConfig) -> None:
    from vrun.launch.task import run

    run(cfg)


if __name__ == "__main__":
    writer.install()
    cli_errors.one_line_hydra_errors()
    main()

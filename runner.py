"""Compose → check → plan → hand off to verl.  `python runner.py model=glm5_1 mesh=256gpu algo=grpo mode=plan`"""
import hydra
from omegaconf import DictConfig

from vrun import cli_errors, schema, writer

schema.register()


@hydra.main(version_base=None, config_path="conf", config_name="run")
def main(cfg: DictConfig) -> None:
    from vrun.task import run

    run(cfg)


if __name__ == "__main__":
    writer.install()
    cli_errors.one_line_hydra_errors()
    main()

"""Run by torchrun on every node in the SFT test (in place of verl's SFT trainer): a real gloo all-reduce
across the nodes checks the rendezvous; each rank writes what it saw into the run dir, with its command line as
verl's SFT CLI (a Hydra app) reads it: the config path and hydra.run.dir."""
import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    args = get_args_parser().parse_args(sys.argv[1:])
    given = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(args.overrides)}
    run_dir = Path(args.config_path)
    out = {"rank": rank, "world": world, "sum": t.item(), "host": socket.gethostname(),
           "node_rank": int(os.environ["GROUP_RANK"]), "master": os.environ["MASTER_ADDR"],
           "local_rank": int(os.environ["LOCAL_RANK"]),
           "hydra_run_dir": OmegaConf.create({"v": given["hydra.run.dir"]}).v}
    (run_dir / f"dist_rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Run by torchrun on every node in the SFT test (in place of verl's SFT trainer): a real gloo all-reduce
across the nodes checks the rendezvous; each rank writes what it saw into the run dir."""
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
    run_dir = Path(sys.argv[sys.argv.index("--config-path") + 1])
    out = {"rank": rank, "world": world, "sum": t.item(), "host": socket.gethostname(),
           "node_rank": int(os.environ["GROUP_RANK"]), "master": os.environ["MASTER_ADDR"],
           "local_rank": int(os.environ["LOCAL_RANK"])}
    (run_dir / f"dist_rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

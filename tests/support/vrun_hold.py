"""A verl task runner that holds: inside a Ray worker it says so (in the job's log and a file beside the
checkpoints), then waits until the run is cancelled. For the tests of `python -m vrun cancel` and `logs -f`."""
import os
import socket
import time
from pathlib import Path

import ray


@ray.remote(num_cpus=0)
class HoldTaskRunner:
    def run(self, config):
        marker = Path(config.trainer.default_local_dir).parent / "hold.json"
        marker.write_text(f'{{"host": "{socket.gethostname()}", "pid": {os.getpid()}}}')
        print(f"hold: holding on {socket.gethostname()} until cancelled", flush=True)
        time.sleep(900)

"""A stand-in for verl's PPO trainer where verl cannot train (no GPU, no vLLM): the same boundary a watchdog and a
restart see, with real parts behind it.

- Rank actors, one per GPU of the plan's mesh (trainer.nnodes × n_gpus_per_node), placed node by node in a
  placement group, each started as verl's RayWorkerGroup starts its workers: RANK, WORLD_SIZE and LOCAL_RANK in its
  runtime env. A gloo process group joins them; every step each rank loads a batch through a torch DataLoader and
  takes part in a dist.all_reduce.
- Step lines printed by verl's own Tracking (trainer.logger: console, wandb), i.e. `step:N - timing_s/gen:… - …`.
- Checkpoints every `save_freq` steps in the layout verl's trainer, verl_mlite and Megatron Lite write, by
  tests/support/standin_ckpt.py (each rank its part, rank 0 the coordinator's and the driver's), then the tracker.
- Resume as verl does: verl's own find_latest_ckpt_path decides the first step.
- verl's own should_save_ckpt_esi after every step, with the longest step so far and trainer.esi_redundant_time;
  when true, verl's message and a save.
Cues, from <run dir>/standin.json (read at start): {"steps": 1000, "step_s": 1.0, "save_freq": 2,
"hang": {"rank": 5, "step": 5, "where": "data"|"collective"}, "crash": {"rank": 2, "step": 4},
"cut_short": {"step": 4}} — hang: that rank blocks in its dataset's __getitem__ (or skips the all_reduce) while the
others wait in all_reduce; crash: that rank raises; cut_short: rank world-1 writes no shard and no .metadata is
written at that step, the tracker naming it all the same (a save that returned without finishing).
Writes <run dir>/standin_ranks.json (rank → host, pid) and, with wandb, the run id it got to
<run dir>/standin_tracker.jsonl.
"""
import json
import os
import socket
import time
from pathlib import Path

import ray


@ray.remote(num_cpus=0)
class Rank:
    def where(self):
        s = socket.socket()
        s.bind(("", 0))
        port = s.getsockname()[1]
        s.close()
        return {"host": socket.gethostname(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid(), "port": port}

    def setup(self, master: str, port: int, cues: dict):
        import torch
        import torch.distributed as dist

        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.cues = cues
        dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=self.rank, world_size=self.world,
                                timeout=__import__("datetime").timedelta(hours=2))
        cue = cues.get("hang") or {}
        hang = (cue.get("rank") == self.rank and cue.get("where", "data") == "data")

        class Prompts(torch.utils.data.Dataset):
            def __len__(self):
                return 1 << 20

            def __getitem__(self, i):
                if hang and self.step >= cue.get("step", 0):
                    while True:  # a read that never returns (a stuck filesystem, a dead data server)
                        time.sleep(1)
                return torch.ones(4)

        self.data = Prompts()
        self.data.step = 0
        self.loader = iter(torch.utils.data.DataLoader(self.data, batch_size=2, num_workers=0))
        return True

    def step(self, step: int):
        import torch
        import torch.distributed as dist

        self.data.step = step
        batch = next(self.loader)
        crash = self.cues.get("crash") or {}
        if crash.get("rank") == self.rank and crash.get("step") == step:
            raise RuntimeError(f"stand-in rank {self.rank} crashed at step {step} as cued")
        hang = self.cues.get("hang") or {}
        if hang.get("where") == "collective" and hang.get("rank") == self.rank and step >= hang.get("step", 0):
            while True:
                time.sleep(1)
        t = batch.sum().reshape(1)
        dist.all_reduce(t)
        return float(t.item())

    def save(self, root: str, step: int, cut_short: bool):
        import standin_ckpt

        # the last rank's shard cut short: DCP's coordinator never writes .metadata
        return standin_ckpt.save(root, step, self.rank, self.world, tracker=False, wait_s=15.0,
                                 cut_short="shards" if cut_short and self.rank == self.world - 1 else False)


@ray.remote(num_cpus=0)
class StandinTaskRunner:
    def run(self, config):
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path, should_save_ckpt_esi
        import standin_ckpt
        from omegaconf import OmegaConf
        from verl.utils.tracking import Tracking

        t = config.trainer
        root = Path(t.default_local_dir)
        run_dir = root.parent
        cue_file = run_dir / "standin.json"
        cues = json.loads(cue_file.read_text()) if cue_file.exists() else {}
        steps, step_s = int(cues.get("steps", 5)), float(cues.get("step_s", 1.0))
        save_freq = int(cues.get("save_freq", t.save_freq if t.save_freq and t.save_freq > 0 else 0))
        cut = (cues.get("cut_short") or {}).get("step")
        nodes, per = int(t.nnodes), int(t.n_gpus_per_node)
        world = nodes * per
        start = 1
        latest = find_latest_ckpt_path(str(root))
        if latest:
            start = int(Path(latest).name.rpartition("_")[2]) + 1
            print(f"Load from checkpoint folder: {latest}", flush=True)
        pg = placement_group([{"GPU": per, "CPU": 0} for _ in range(nodes)], strategy="STRICT_SPREAD")
        ray.get(pg.ready())
        ranks = []
        for r in range(world):
            env = {"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r % per)}
            ranks.append(Rank.options(num_gpus=1, runtime_env={"env_vars": env}, scheduling_strategy=
                                      PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r // per)).remote())
        where = ray.get([a.where.remote() for a in ranks])
        ray.get([a.setup.remote(where[0]["ip"], where[0]["port"], cues) for a in ranks])
        (run_dir / "standin_ranks.json").write_text(json.dumps({str(r): w for r, w in enumerate(where)}))
        tracking = Tracking(project_name=t.project_name, experiment_name=t.experiment_name,
                            default_backend=list(t.logger), config=OmegaConf.to_container(config, resolve=True))
        if "wandb" in list(t.logger):
            import wandb

            with open(run_dir / "standin_tracker.jsonl", "a") as f:
                f.write(json.dumps({"run_id": wandb.run.id, "start": start, "host": socket.gethostname()}) + "\n")
        longest = 0.0
        for step in range(start, steps + 1):
            t0 = time.time()
            ray.get([a.step.remote(step) for a in ranks])
            time.sleep(max(step_s - (time.time() - t0), 0.0))
            dt = time.time() - t0
            longest = max(longest, dt)
            tracking.log({"timing_s/gen": round(dt * 0.5, 3), "timing_s/update_actor": round(dt * 0.4, 3),
                          "timing_s/step": round(dt, 3), "perf/throughput": 100.0}, step)
            esi = should_save_ckpt_esi(max_steps_duration=longest, redundant_time=t.esi_redundant_time)
            if save_freq > 0 and (step % save_freq == 0 or esi or step == steps):
                if esi:
                    print("Force saving checkpoint: ESI instance expiration approaching.", flush=True)
                ray.get([a.save.remote(str(root), step, step == cut) for a in ranks])
                standin_ckpt.write_tracker(root, step)  # verl's driver, once every rank returned
        return {"steps": steps}

"""A stand-in for verl's PPO trainer where verl cannot train (no GPU, no vLLM): what a watchdog, a stall's
diagnosis and a restart see of verl, with real parts behind it. Used as `run.task_runner=vrun_standin.StandinTaskRunner`
(verl's run_ppo calls `task_runner_class.remote().run.remote(config)`).

- Rank actors, trainer.nnodes × trainer.n_gpus_per_node of them, each asking one GPU, placed node by node in a
  placement group and started as verl's RayWorkerGroup starts its workers (verl/single_controller/ray/base.py,
  `_create_worker`): runtime_env env_vars WORLD_SIZE, RANK, WG_PREFIX, WG_BACKEND, RAY_LOCAL_WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT, the master's address and a free port taken on the first bundle's node. (verl puts no
  LOCAL_RANK there; its workers set it in os.environ later.) A gloo process group joins them (two hours' timeout).
- Each step: every rank loads a batch through a torch DataLoader over a tiny dataset, then takes part in one
  dist.all_reduce; the driver-side task runner paces the step to `step_s` and logs it through verl's own
  Tracking (trainer.logger): the console backend prints verl's line, `step:N - key:value - ...`
  (verl/utils/logger/aggregate_logger.py: LocalLogger, concat_dict_to_str), with the keys and order of
  RayPPOTrainer.fit (timing_s/* in the order its timers end, then timing_per_token_ms/*, then perf/*).
- Checkpoints where verl's trainer saves (trainer.save_freq > 0, and the step a multiple of it, the last step, or
  verl's own should_save_ckpt_esi true — asked after every step with the longest step so far and
  trainer.esi_redundant_time, its message printed), in the layout verl, verl_mlite and Megatron Lite write, by
  tests/support/standin_ckpt.py: every rank its part, then the tracker once all returned (verl's driver).
- Resume as verl's `_load_checkpoint` does: trainer.resume_mode (auto / disable / resume_path) and verl's own
  find_latest_ckpt_path decide the checkpoint; verl's lines are printed; the first step is the one after it.
- With "wandb" in trainer.logger, the run id verl's Tracking got is appended to <run dir>/standin_tracker.jsonl.
- <run dir>/standin_ranks.json: rank → {host, ip, pid}, once every rank is up.
- <run dir>/standin_env.json: the deadline verl's should_save_ckpt_esi reads in this task runner
  (MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP, null when unset), written at its start.

Cues, from <run dir>/standin.json (read at start; the run dir is default_local_dir's parent):
  {"steps": 1000, "step_s": 1.0, "save_freq": 5,
   "hang": {"rank": 5, "step": 3, "where": "data" | "collective"},
   "crash": {"rank": 2, "step": 4},
   "kill_mid_save": {"step": 10, "stage": "shards"},
   "cut_short": {"step": 4}}
Named phases (`_run_phases`, `_phase_work`), with {"phases": {"old_log_prob": 0.2, "update_actor": 0.2,
"update_weights": 0.2}} in standin.json: after the rollout, each step runs each named phase as a rank actor method
of the name verl's fused worker gives it (`actor_rollout_compute_log_prob`, `actor_rollout_update_actor`,
`actor_rollout_update_weights`: what Ray's state API lists while verl runs them), each rank sleeping the phase's
seconds then joining one all_reduce, and prints the phase's wall time as its timing_s/<timer> key. Cues on them:
  "phase_hang": {"timer": "update_weights", "step": 4, "rank": 0}   that rank never returns from that phase at that
      step (the others wait in its all_reduce);
  "phase_slow": {"timer": "update_weights", "step": 6, "to": 7, "s": 1.0}   from that step on (to `to`, default
      the end) the phase takes `s` seconds.
hang: from that step on, that rank blocks forever inside its dataset's __getitem__ (data) or skips the all_reduce
and sleeps (collective), while the others wait in all_reduce. crash: that rank raises at that step. kill_mid_save:
at that step every rank writes its save cut short (standin_ckpt's stage, default "shards") and the rank processes
os._exit(9): the job dies mid-save, the tracker untouched. cut_short: at that step the last rank's shard is cut
short while the save returns and the tracker names the step all the same (a save that returned without
finishing). Without cues: `steps` (default 5) steps at step_s (default 1.0), then return.
"""
import json
import os
import socket
import time
from pathlib import Path

import ray

TWO_HOURS_S = 7200


def _free_port() -> int:
    s = socket.socket()
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@ray.remote(num_cpus=0)
def _master_addr_port():
    """The master's address and a free port, on the node of the first bundle (as verl's worker group takes them)."""
    return ray.util.get_node_ip_address(), str(_free_port())


def _master(pg, first_bundle) -> tuple:
    """MASTER_ADDR/PORT on the first bundle's node: taken here when that is this node, else by a task there."""
    from ray.util.placement_group import placement_group_table

    node = (placement_group_table(pg).get("bundles_to_node_id") or {}).get(0)
    if node is not None and node == ray.get_runtime_context().get_node_id():
        return ray.util.get_node_ip_address(), str(_free_port())
    return tuple(ray.get(_master_addr_port.options(scheduling_strategy=first_bundle).remote()))


def _gather(refs: list) -> list:
    """ray.get of every ref, raising the first failure as soon as it happens (a dead rank must not wait for a
    collective the others never finish)."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ray.get(ready)
    return ray.get(refs)


@ray.remote(num_cpus=0)
class Rank:
    def __init__(self, cues: dict):
        self.cues = cues
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    def where(self) -> dict:
        return {"host": socket.gethostname(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def setup(self) -> bool:
        import datetime

        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://", rank=self.rank, world_size=self.world,
                                timeout=datetime.timedelta(seconds=TWO_HOURS_S))
        hang = self.cues.get("hang") or {}
        mine = hang.get("rank") == self.rank and hang.get("where", "data") == "data"
        first = int(hang.get("step", 0) or 0)

        class Prompts(torch.utils.data.Dataset):
            step = 0

            def __len__(self):
                return 1 << 20

            def __getitem__(self, i):
                if mine and self.step >= first:
                    while True:  # a read that never returns (a stuck filesystem, a dead data server)
                        time.sleep(1)
                return torch.ones(4)

        self.data = Prompts()
        self.loader = iter(torch.utils.data.DataLoader(self.data, batch_size=2, num_workers=0))
        return True

    def step(self, step: int) -> float:
        import torch.distributed as dist

        t0 = time.time()
        self.data.step = step
        batch = next(self.loader)
        crash = self.cues.get("crash") or {}
        if crash.get("rank") == self.rank and crash.get("step") == step:
            raise RuntimeError(f"stand-in rank {self.rank} crashed at step {step} as cued")
        hang = self.cues.get("hang") or {}
        if hang.get("where") == "collective" and hang.get("rank") == self.rank and step >= hang.get("step", 0):
            while True:  # never joins the all_reduce the others wait in
                time.sleep(1)
        t = batch.sum().reshape(1)
        dist.all_reduce(t)
        return time.time() - t0

    # ---- named phases: verl's fused worker methods (actor_rollout_ prefix), see _run_phases
    def actor_rollout_compute_log_prob(self, step: int) -> float:
        return _phase_work(self, "old_log_prob", step)

    def actor_rollout_update_actor(self, step: int) -> float:
        return _phase_work(self, "update_actor", step)

    def actor_rollout_update_weights(self, step: int) -> float:
        return _phase_work(self, "update_weights", step)

    def save(self, root: str, step: int, cut_short=False) -> bool:
        import standin_ckpt

        return standin_ckpt.save(root, step, self.rank, self.world, cut_short=cut_short, tracker=False, wait_s=15.0)

    def die_mid_save(self, root: str, step: int, stage) -> None:
        import standin_ckpt

        standin_ckpt.save(root, step, self.rank, self.world, cut_short=stage, tracker=False, wait_s=2.0)
        os._exit(9)


# ==================================================================== named phases (verl's worker methods)
PHASE_METHODS = (("old_log_prob", "actor_rollout_compute_log_prob"), ("update_actor", "actor_rollout_update_actor"),
                 ("update_weights", "actor_rollout_update_weights"))


def _phase_work(rank, timer: str, step: int) -> float:
    """One rank's part of a named phase: the cued seconds (a slow phase's from its step), a hang where cued, then
    one all_reduce with the other ranks (a rank that never comes holds them there)."""
    import torch
    import torch.distributed as dist

    t0 = time.time()
    cues = rank.cues
    hang, slow = cues.get("phase_hang") or {}, cues.get("phase_slow") or {}
    if hang.get("timer") == timer and step == hang.get("step") and rank.rank == int(hang.get("rank", 0)):
        while True:  # a weight sync that never returns (a peer's transfer lost, an engine that never wakes)
            time.sleep(1)
    seconds = float((cues.get("phases") or {}).get(timer, 0.0))
    if slow.get("timer") == timer and int(slow.get("step", 0)) <= step <= int(slow.get("to", 1 << 30)):
        seconds = float(slow.get("s", seconds))
    time.sleep(seconds)
    dist.all_reduce(torch.ones(1))
    return time.time() - t0


def _run_phases(ranks: list, step: int, cues: dict, timing: dict) -> None:
    """The step's named phases, each on every rank at once, each one's wall time as verl's timer key."""
    if not cues.get("phases"):
        return
    for timer, method in PHASE_METHODS:
        t0 = time.time()
        _gather([getattr(a, method).remote(step) for a in ranks])
        timing[timer] = timing.get(timer, 0.0) + time.time() - t0


def _cues(run_dir: Path) -> dict:
    try:
        cues = json.loads((run_dir / "standin.json").read_text())
    except (OSError, ValueError):
        return {}
    return cues if isinstance(cues, dict) else {}


def _resume(t) -> int:
    """The step verl's _load_checkpoint loads (0: none), printing what verl prints."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    mode = t.get("resume_mode", "auto")
    if mode == "disable":
        return 0
    folder = t.default_local_dir
    if not os.path.isabs(folder):
        folder = os.path.join(os.getcwd(), folder)
    found = find_latest_ckpt_path(folder)
    if mode == "auto" and found is None:
        print("Training from scratch", flush=True)
        return 0
    if mode == "resume_path":
        found = t.resume_from_path
        if not os.path.isabs(found):
            found = os.path.join(os.getcwd(), found)
    print(f"Load from checkpoint folder: {found}", flush=True)
    step = int(str(found).split("global_step_")[-1])
    print(f"Setting global step to {step}", flush=True)
    print(f"Resuming from {found}", flush=True)
    return step


def _metrics(step: int, world: int, timing: dict) -> dict:
    """One step's metrics in RayPPOTrainer.fit's order: actor, training/*, data, timing_s (as the timers end),
    timing_per_token_ms, perf (metric_utils.compute_timing_metrics, compute_throughout_metrics)."""
    prompt, response = 128.0, 256.0
    n_prompt, n_response = prompt * 8 * world, response * 8 * world
    total = n_prompt + n_response
    out = {"actor/entropy": 0.61, "actor/pg_loss": -0.002 * (step % 7), "actor/pg_clipfrac": 0.001,
           "actor/ppo_kl": 0.0, "actor/grad_norm": 0.25 + 0.01 * (step % 5), "actor/lr": 1e-06,
           "training/global_step": step, "training/epoch": 0,
           "critic/score/mean": min(1.0, 0.1 + 0.01 * step), "critic/rewards/mean": min(1.0, 0.1 + 0.01 * step),
           "critic/advantages/mean": 0.0, "response_length/mean": response, "prompt_length/mean": prompt}
    out.update({f"timing_s/{k}": v for k, v in timing.items()})
    out.update({"timing_per_token_ms/gen": timing["gen"] * 1000 / n_response,
                "timing_per_token_ms/update_actor": timing["update_actor"] * 1000 / total,
                "timing_per_token_ms/adv": timing["adv"] * 1000 / total})
    out.update({"perf/total_num_tokens": int(total), "perf/time_per_step": timing["step"],
                "perf/throughput": total / (timing["step"] * world)})
    return out


@ray.remote(num_cpus=0)
class StandinTaskRunner:
    def run(self, config):
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        t = config.trainer
        root = Path(t.default_local_dir)
        run_dir = root.parent
        cues = _cues(run_dir)
        (run_dir / "standin_env.json").write_text(json.dumps(
            {"esi": os.environ.get("MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"), "t": time.time()}))
        steps, step_s = int(cues.get("steps", 5)), float(cues.get("step_s", 1.0))
        save_freq = int(cues.get("save_freq", t.save_freq if t.save_freq is not None else -1))
        kill = cues.get("kill_mid_save") or {}
        cut = cues.get("cut_short") or {}
        nodes, per = int(t.nnodes), int(t.n_gpus_per_node)
        world = nodes * per
        # the rank actors start (their processes, torch, the process group) while this one imports verl
        pg = placement_group([{"GPU": per, "CPU": 0} for _ in range(nodes)], strategy="STRICT_SPREAD")
        ray.get(pg.ready())
        on = lambda i: PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)  # noqa: E731
        addr, port = _master(pg, on(0))
        ranks = []
        for r in range(world):
            env = {"WORLD_SIZE": str(world), "RANK": str(r), "WG_PREFIX": "standin", "WG_BACKEND": "ray",
                   "RAY_LOCAL_WORLD_SIZE": str(per), "MASTER_ADDR": addr, "MASTER_PORT": port}
            ranks.append(Rank.options(num_gpus=1, runtime_env={"env_vars": env},
                                      scheduling_strategy=on(r // per)).remote(cues))
        ready = [a.setup.remote() for a in ranks]

        import standin_ckpt
        from omegaconf import OmegaConf
        from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi
        from verl.utils.tracking import Tracking

        first = _resume(t) + 1  # verl: global_steps = the loaded step, then += 1 before the first batch
        _gather(ready)
        where = _gather([a.where.remote() for a in ranks])
        (run_dir / "standin_ranks.json").write_text(json.dumps({str(r): w for r, w in enumerate(where)}))

        tracking = Tracking(project_name=t.project_name, experiment_name=t.experiment_name,
                            default_backend=list(t.logger), config=OmegaConf.to_container(config, resolve=True))
        if "wandb" in list(t.logger):
            import wandb

            with open(run_dir / "standin_tracker.jsonl", "a") as f:
                f.write(json.dumps({"run_id": wandb.run.id, "start": first, "host": socket.gethostname(),
                                    "pid": os.getpid()}) + "\n")
        longest = 0.0
        step = first
        for step in range(first, steps + 1):
            timing = {}
            t_step = time.time()
            timing["start_profile"] = 0.0
            t0 = time.time()
            _gather([a.step.remote(step) for a in ranks])
            timing["gen"] = time.time() - t0
            timing["reward"], timing["old_log_prob"], timing["adv"] = 0.0, 0.0, 0.0
            t0 = time.time()
            time.sleep(max(step_s - (time.time() - t_step), 0.0))  # the update's share of the step
            timing["update_actor"] = time.time() - t0
            _run_phases(ranks, step, cues, timing)
            if kill.get("step") == step:
                _gather([a.die_mid_save.remote(str(root), step, kill.get("stage", True)) for a in ranks])
            esi = should_save_ckpt_esi(max_steps_duration=longest, redundant_time=t.esi_redundant_time)
            if save_freq > 0 and (step >= steps or step % save_freq == 0 or esi):
                if esi:
                    print("Force saving checkpoint: ESI instance expiration approaching.", flush=True)
                t0 = time.time()
                short = cut.get("stage", "shards") if cut.get("step") == step else False
                _gather([a.save.remote(str(root), step, short if r == world - 1 else False)
                         for r, a in enumerate(ranks)])
                standin_ckpt.write_tracker(root, step)  # verl's driver, once every rank returned
                timing["save_checkpoint"] = time.time() - t0
            timing.setdefault("update_weights", 0.0)
            timing["step"] = time.time() - t_step
            timing["stop_profile"] = 0.0
            longest = max(longest, timing["step"])
            tracking.log(data=_metrics(step, world, timing), step=step)
        finish = getattr(tracking, "finish", None)
        if finish is not None:
            finish()
        if "wandb" in list(t.logger):
            import wandb

            wandb.teardown()  # now, not at the worker's exit, when Ray may have stopped wandb's service first
        return {"steps": steps, "first": first, "last": step}

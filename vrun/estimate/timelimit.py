"""A SLURM time limit against verl's own pre-deadline save, as pure arithmetic (the job's end itself is read on the
node: vrun/launch/deadline.py).

What verl does (read in 0.9.1, a6ef5009 and 1dda039b; the three agree line for line where it exists):

  verl/utils/checkpoint/checkpoint_manager.py  should_save_ckpt_esi(max_steps_duration, save_ckpt_duration=60,
      redundant_time=0): with MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP set (unix seconds, read with float()),
      true when 0 < end − now ≤ save_ckpt_duration + max_steps_duration + redundant_time, and false whenever
      max_steps_duration ≤ 0; an unparsable value is false. (SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP
      is read only when the MLP variable is unset.)
  verl/trainer/ppo/ray_trainer.py  RayPPOTrainer.fit (the legacy trainer: main_ppo_v0.TaskRunner, which main_ppo runs
      when trainer.use_v1=false): once per step, after the actor update and before the weights go to the rollout,
      inside the "step" timer, it calls should_save_ckpt_esi(max_steps_duration=self.max_steps_duration,
      redundant_time=trainer.esi_redundant_time) — save_ckpt_duration stays verl's 60 s. max_steps_duration is the
      longest timing_raw["step"] of the earlier steps of this process (set to 0 before the loop, raised after each
      step): the step timer holds generation, rewards, log-probs, the update and that step's own save, not the
      validation (test_freq), which runs after it. On the first step of an attempt it is 0, so the first step never
      saves for the deadline. A true answer saves only when trainer.save_freq > 0 (one condition with the periodic
      save: save_freq ≤ 0 saves nothing at all), prints "Force saving checkpoint: ESI instance expiration
      approaching." and the loop goes on: the trainer does not stop, and every later step while 0 < end − now still
      answers true saves again.
  verl/trainer/ppo/v1/trainer_base.py  the v1 trainer's fit (main_ppo.TaskRunnerV1, trainer.use_v1=true) saves on
      is_last_step or global_steps % save_freq == 0 only: no call of should_save_ckpt_esi in any of the three.
      trainer.use_v1 defaults to true in 0.9.1 and 1dda039b, false in a6ef5009.
  verl/trainer/sft_trainer.py, sft_trainer_ray.py  fit saves on the last step or every save_freq steps: no
      deadline save in any of the three.
  verl/experimental (fully_async_policy, separation) call it too; the project runs neither.

What SLURM and submitit do: submitit asks sbatch for --signal=USR2@signal_delay_s and, on the signal, its rank 0
requeues the job (scontrol requeue) or, with no requeue left, raises UncompletedJobError; either way training stops
at the signal. sbatch(1) (Slurm 22.05): "the signal may be sent up to 60 seconds earlier than specified". So the
deadline verl is given is EndTime − signal_delay_s − SIGNAL_EARLY_S. (submitit 1.5.4 core/job_environment.py
has_timed_out counts the signal as a time-out, using up one of max_num_timeout, only when its process has run
min(0.8 × limit, limit − 600 s); a signal that comes earlier than max(600 s, 0.2 × limit) before the end is taken
for a preemption and requeues without counting.)

What a plan can say from that (each a pure function of figures the plan already has):
  save_seconds       one save: every rank of a node writes its training state (params + optimizer, GPU and host)
                     at SAVE_WRITE_RATE per node, plus SAVE_FIXED_S
  first_save_steps   steps of an attempt before the first save can happen: 1 with save_freq 1, else 2 with the
                     deadline save (the first step never forces one), else save_freq (a resumed attempt can need
                     up to that many before the next multiple); None when nothing is ever saved
  time_limit_problem whether time_min − signal_delay_s − SIGNAL_EARLY_S holds the load, those steps and one save
  redundant_time     trainer.esi_redundant_time that makes verl's rule hold for this save: verl counts 60 s for it
  support / plan_lines  whether this run's trainer saves before the deadline, and the plan table's line
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from vrun.core.problems import Problem

ESI_VAR = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
# should_save_ckpt_esi's save_ckpt_duration: the caller in ray_trainer.py passes none, so verl counts 60 s per save
VERL_SAVE_S = 60.0
# sbatch(1) --signal, Slurm 22.05: "Due to the resolution of event handling by Slurm, the signal may be sent up to 60
# seconds earlier than specified."
SIGNAL_EARLY_S = 60.0
# A conservative write rate per node to shared storage: one NFS client over 10-25 GbE sustains about 1-2 GB/s, a
# Lustre or GPFS client more; the same figure the first step's load is read at (vrun/planning/watch.py LOAD_RATE).
SAVE_WRITE_RATE = 1.0e9
# submitit's has_timed_out: a signal counts as the time limit only after min(0.8 × limit, limit − 600 s) of the job
SUBMITIT_GRACE_FLOOR_S, SUBMITIT_GRACE_SHARE = 600.0, 0.2
# what a save costs beyond the bytes: the barrier around it, the metadata, the tracker file
SAVE_FIXED_S = 30.0

# where each trainer lives in a verl tree, and the call that is its deadline save
TRAINER_SOURCES = {"legacy": "trainer/ppo/ray_trainer.py", "v1": "trainer/ppo/v1/trainer_base.py",
                   "sft": "trainer/sft_trainer.py"}
ESI_CALL = "should_save_ckpt_esi("
# what the three verls read hold (0.9.1, a6ef5009, 1dda039b)
KNOWN_CALLERS = {"legacy": True, "v1": False, "sft": False}


def deadline(end_time: float, signal_delay_s: float) -> float:
    """The last moment training can count on: the job's end less submitit's signal and SLURM's early margin."""
    return float(end_time) - max(float(signal_delay_s or 0), 0.0) - SIGNAL_EARLY_S


def max_signal_delay_s(time_min: int) -> int:
    """The largest cluster.signal_delay_s whose signal submitit still reads as the time limit: the signal may come
    SIGNAL_EARLY_S before signal_delay_s, and submitit counts it as a time-out only when at most
    max(SUBMITIT_GRACE_FLOOR_S, SUBMITIT_GRACE_SHARE × limit) of the limit is left. A longer delay makes every time
    limit a "preemption": the job requeues at each one without using up cluster.max_requeues, so it never ends."""
    limit = time_min * 60.0
    return int(max(SUBMITIT_GRACE_FLOOR_S, SUBMITIT_GRACE_SHARE * limit) - SIGNAL_EARLY_S)


def save_seconds(bytes_per_rank: float, ranks_per_node: int, write_rate: float = SAVE_WRITE_RATE) -> float:
    """One checkpoint save: the node's ranks write their state together through the node's link to storage.
    bytes_per_rank: params + optimizer of one rank (vrun.estimate.memory.Estimate: weights + optimizer +
    optimizer_host, the busiest stage; dist_opt's bf16 weights are replicated over DP and counted whole: an upper
    bound)."""
    rate = write_rate if write_rate and write_rate > 0 else SAVE_WRITE_RATE
    return SAVE_FIXED_S + max(float(bytes_per_rank), 0.0) * max(int(ranks_per_node), 1) / rate


def training_state_bytes(est) -> float:
    """What one rank saves, from the memory estimate (vrun.estimate.memory.Estimate): its parameters and the whole
    optimizer, the part offloaded to the host included (gradients are not saved)."""
    return float(est.weights) + float(est.optimizer) + float(getattr(est, "optimizer_host", 0.0) or 0.0)


def first_save_steps(save_freq, saves_for_deadline: bool) -> Optional[int]:
    """Steps of an attempt before its first checkpoint can be written; None when verl saves nothing
    (save_freq ≤ 0, or not an integer)."""
    if isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq <= 0:
        return None
    if save_freq == 1:
        return 1
    return 2 if saves_for_deadline else save_freq


def time_limit_problem(time_min, signal_delay_s, load_s: float, step_high_s: Optional[float], save_s: float,
                       steps: Optional[int] = 2, cluster: str = "slurm") -> Optional[Problem]:
    """A warning naming cluster.time_min when one attempt cannot load the model, run `steps` steps at the plan's high
    end and write one save before submitit's signal (less SLURM's early margin); None when it can or when there
    is no step estimate or no save at all (steps None)."""
    if step_high_s is None or steps is None or not isinstance(time_min, (int, float)) or isinstance(time_min, bool):
        return None
    usable = time_min * 60.0 - float(signal_delay_s or 0) - SIGNAL_EARLY_S
    need = float(load_s) + steps * float(step_high_s) + float(save_s)
    if usable >= need:
        return None
    fix_min = math.ceil((need + float(signal_delay_s or 0) + SIGNAL_EARLY_S) / 60.0)
    margin = (f"submitit's {float(signal_delay_s or 0):g} s signal and SLURM's {SIGNAL_EARLY_S:g} s early margin"
              if cluster == "slurm" else f"the {float(signal_delay_s or 0):g} s (cluster.signal_delay_s) + "
              f"{SIGNAL_EARLY_S:g} s kept before a {cluster} job's end")
    why = (f"{time_min:g} min less {margin} leaves {usable:,.0f} s, under the {need:,.0f} s the first checkpoint "
           f"of an attempt needs (model load {load_s:,.0f} s + {steps} step(s) × {step_high_s:,.0f} s, the estimate's "
           f"high end, + one save {save_s:,.0f} s): every attempt would end with nothing saved")
    return Problem("cluster.time_min", time_min, why, f"cluster.time_min={fix_min} or more", warning=True)


def redundant_time(save_s: float, validation_s: float = 0.0) -> int:
    """trainer.esi_redundant_time for this save. verl saves when end − now ≤ 60 + longest step + redundant; skipping
    is safe only while one more step, its validation and then this save still fit, so redundant = save − 60 +
    validation (the deadline verl is given already lies before the signal: nothing more for it here)."""
    return max(0, math.ceil(float(save_s) - VERL_SAVE_S + max(float(validation_s or 0), 0.0)))


def calls_esi(source: str) -> bool:
    """Whether a trainer's source text calls verl's deadline check (a call, not the import line)."""
    return any(ESI_CALL in line and not line.lstrip().startswith(("from ", "import ", "#"))
               for line in (source or "").splitlines())


def esi_callers(read: Callable[[str], Optional[str]]) -> dict:
    """Which trainers of a verl tree call the deadline check; read(rel) returns the text of a file under the verl
    package (or None/""): a trainer whose file is not there keeps what the three known verls hold."""
    out = dict(KNOWN_CALLERS)
    for name, rel in TRAINER_SOURCES.items():
        text = read(rel)
        if text:
            out[name] = calls_esi(text)
    return out


@dataclass(frozen=True)
class Support:
    """Whether this run's trainer saves before the deadline (None: a task runner of the run's own decides)."""
    saves: Optional[bool]
    trainer: str
    why: str


def support(entrypoint: str, use_v1, save_freq, task_runner: Optional[str] = None,
            callers: Optional[Mapping[str, bool]] = None) -> Support:
    """entrypoint: "ppo" or "sft"; use_v1 and save_freq: the resolved trainer.use_v1 / trainer.save_freq."""
    callers = {**KNOWN_CALLERS, **(callers or {})}
    if str(entrypoint) == "sft":
        if callers["sft"]:
            return Support(True, "sft_trainer", "verl's SFT trainer saves before the deadline")
        return Support(False, "sft_trainer", "verl's SFT trainer has no pre-deadline save: steps after its last "
                       "trainer.save_freq save are lost at the time limit")
    if task_runner:
        return Support(None, str(task_runner), f"the task runner {task_runner} (run.task_runner) decides; verl's own "
                       "pre-deadline save is RayPPOTrainer.fit's")
    trainer = "v1" if use_v1 else "legacy"
    name = "the v1 trainer (trainer.use_v1=true)" if use_v1 else "RayPPOTrainer (trainer.use_v1=false)"
    if first_save_steps(save_freq, True) is None:
        # both PPO trainers save only under save_freq > 0, the last step and the deadline save included
        return Support(False, trainer, f"trainer.save_freq={save_freq}: {name} saves no checkpoint at all, "
                       "before the deadline or otherwise (it needs save_freq > 0)")
    if not callers[trainer]:
        other = " — trainer.use_v1=false runs RayPPOTrainer, which does" if use_v1 and callers["legacy"] else ""
        return Support(False, trainer, f"{name} has no pre-deadline save: a step may be lost at the time "
                       f"limit{other}")
    return Support(True, trainer, f"{name} saves before the time limit")


# where a Ray job's end comes from (vrun.launch.deadline.ray_env, in the job's entry)
RAY_END = {"ray": "cluster=ray: the job ends cluster.time_min after its entry starts (the entry ends it there)",
           "kuberay": "cluster=kuberay: the operator ends the job at activeDeadlineSeconds = cluster.time_min × 60, "
                      "counted here from the head pod's start (later than the operator's by the pods' scheduling)"}


def plan_lines(s: Support, signal_delay_s, verl_version: Optional[str] = None,
               redundant_s: Optional[int] = None, cluster: str = "slurm") -> list[str]:
    """The plan table's `deadline` row for a SLURM run, and a Ray job's (with where its end comes from)."""
    delay = float(signal_delay_s or 0)
    var = f"{ESI_VAR} = end − {delay:g} s {'signal' if cluster == 'slurm' else 'margin'} − {SIGNAL_EARLY_S:g} s"
    if cluster in RAY_END:
        return [line + f"; {RAY_END[cluster]}" for line in plan_lines(s, signal_delay_s, verl_version, redundant_s)]
    if s.saves:
        tail = f"; trainer.esi_redundant_time={redundant_s}" if redundant_s is not None else ""
        return [f"deadline  verl{' ' + verl_version if verl_version else ''}: {s.why} ({var}{tail})"]
    if s.saves is None:
        return [f"deadline  {s.why} ({var} is set for it)"]
    return [f"deadline  verl{' ' + verl_version if verl_version else ''}: {s.why}"]

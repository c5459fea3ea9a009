"""verl's per-step metrics read back from a job's output (<run dir>/job.log locally; submitit's stdout on SLURM).

verl's console logger (verl/utils/logger/aggregate_logger.py: LocalLogger, concat_dict_to_str) prints one line per
step, `step:<n> - <key>:<value> - ...`, every value a number formatted by pprint (numpy scalars as
`np.float64(...)`); Ray prefixes a worker's lines with `(TaskRunner pid=…)`. The PPO trainer's keys
(verl/trainer/ppo/metric_utils.py: compute_timing_metrics, compute_throughout_metrics; ray_trainer.py's
marked_timer names): timing_s/gen, old_log_prob, ref, update_actor, update_weights, step; perf/throughput (tokens
per second per GPU), perf/time_per_step, perf/mfu/actor. SFT logs train/mfu and no step time. A line that is not
such a line, or a value that is not a number, is skipped: never fatal. Standard library only.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

JOB_LOG = "job.log"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
STEP = re.compile(r"(?:^|[\s)\]|])step:(\d+) - (.+)$")
# a plain number, or one inside numpy's repr: np.float64(1.5), numpy.int64(3)
NUMBER = re.compile(r"^(?:(?:np|numpy)\.[a-z0-9_]+\()?\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*\)?$")
# the metrics kept (the rest of a step's line is not needed)
KEYS = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/update_weights",
        "timing_s/step", "timing_s/reward", "timing_s/save_checkpoint", "perf/throughput", "perf/time_per_step",
        "perf/mfu/actor", "train/mfu")
# a value verl could print: a time of at most ~11.6 days a step, a throughput or MFU below 1e9; anything else
# (1e400 reads as inf, a negative time) is not a measurement and is skipped
VALUE_MAX = 1e6
VALUE_MAX_OF = {"perf/throughput": 1e9}
# a job log is read from its last LOG_TAIL bytes (the recent steps): a huge log costs no more than that
LOG_TAIL = 8 << 20
# the plan's phases each verl timer measures (rollout = gen; sync = update_weights)
PHASES = {"rollout": ("timing_s/gen",), "log_prob": ("timing_s/old_log_prob", "timing_s/ref"),
          "train": ("timing_s/update_actor",), "sync": ("timing_s/update_weights",)}


def parse_line(line: str) -> Optional[tuple[int, dict]]:
    """(step, {key: value}) from one console line, or None for any other line."""
    m = STEP.search(ANSI.sub("", line).rstrip())
    if not m:
        return None
    out = {}
    for part in m.group(2).split(" - "):
        k, sep, v = part.rpartition(":")
        if not sep or k.strip() not in KEYS:
            continue
        n = NUMBER.match(v.strip())
        if n:
            try:
                x = float(n.group(1))
            except ValueError:
                continue
            if 0 <= x <= VALUE_MAX_OF.get(k.strip(), VALUE_MAX):  # NaN and inf fail too
                out[k.strip()] = x
    return int(m.group(1)), out


@dataclass
class Measured:
    steps: dict = field(default_factory=dict)    # step -> {key: value} (the last line of a step wins)
    skipped: int = 0                              # lines that looked like a step line but carried nothing known

    def series(self, key: str) -> list:
        return [v[key] for _, v in sorted(self.steps.items()) if key in v]

    def median(self, key: str) -> Optional[float]:
        """The median over the steps, the first (warm-up, compilation) left out when there are three or more."""
        xs = self.series(key)
        if len(xs) >= 3:
            xs = xs[1:]
        return statistics.median(xs) if xs else None

    @property
    def step_s(self) -> Optional[float]:
        return self.median("timing_s/step") or self.median("perf/time_per_step")

    def summary(self) -> dict:
        out = {"steps": len(self.steps), "last_step": max(self.steps) if self.steps else None,
               "step_s": _r(self.step_s), "throughput": _r(self.median("perf/throughput")),
               "mfu": _r(self.median("perf/mfu/actor") or self.median("train/mfu"), 3)}
        for phase, keys in PHASES.items():
            vals = [self.median(k) for k in keys]
            if any(v is not None for v in vals):
                out[f"{phase}_s"] = _r(sum(v for v in vals if v is not None))
        return out


def _r(x: Optional[float], nd: int = 1) -> Optional[float]:
    return round(x, nd) if x is not None else None


def parse(lines: Iterable[str]) -> Measured:
    m = Measured()
    for line in lines:
        try:
            got = parse_line(line)
        except Exception:  # noqa: BLE001 - a foreign line is skipped, never fatal
            got = None
        if got is None:
            continue
        step, values = got
        if not values:
            m.skipped += 1
            continue
        m.steps.setdefault(step, {}).update(values)
    return m


def read(paths: Iterable[Path]) -> Measured:
    """Every step line of these files' last LOG_TAIL bytes (missing or unreadable files, FIFOs and devices are
    skipped; never blocks)."""
    from vrun.core import fs

    lines: list = []
    for p in paths:
        data, _ = fs.read_checked(p, LOG_TAIL, binary=True, tail=True)
        got = (data or b"").decode("utf-8", errors="replace").splitlines()
        lines.extend(got[1:] if len(data or b"") >= LOG_TAIL else got)  # a cut first line is not a step line
    return parse(lines)

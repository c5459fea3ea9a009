"""The rollout phase's time: a decode step's roofline (weights and KV read per GPU, or its FLOPs) with the TP
all-reduces of a replica wider than its NVLink domain, the prefill, and the whole rollout — every response at one
length in waves, or the lengths spread with their mean (Lengths: the maximum-entropy distribution on [0, max]) and
the step waiting for its longest. Pure arithmetic."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

from vrun.estimate.hardware import Part
from vrun.estimate.steptime_comm import nvlink_span, tp_collectives_s
from vrun.estimate.steptime_work import Workload, compute_s


def decode_step_s(w: Workload, part: Part, concurrent: float, context: float, mbu: float, mfu: float,
                  net: Optional[float] = None) -> float:
    """One decode step of a replica with `concurrent` sequences at `context` tokens each: the roofline, then, for a
    replica wider than its NVLink domain, its TP all-reduces (net: the network efficiency; None leaves them out).
    Within a domain they are in the measured MBU (DECODE_MBU_AT_TP); past it the whole TP group's are counted on top
    at every end of the band, whose MBU past TP8 carries the source's trend (decode_mbu_worst, decode_mbu_best):
    their within-domain share is counted twice, a pessimistic bias."""
    tp, dp = w.rollout_tp, w.rollout_dp
    per_rank = concurrent / dp
    touched = 1.0 if not w.experts else 1 - (1 - w.top_k / w.experts) ** concurrent
    weights = (w.rollout_dense / tp + w.rollout_routed / (tp * dp) * touched) * w.rollout_weight_bytes
    kv = per_rank * (context * w.kv_per_token + w.kv_per_sequence)
    memory = (weights + kv) / (part.hbm * mbu)
    flops = 2 * w.active_params * per_rank / tp / (part.bf16_flops * mfu)
    span = nvlink_span(w.gpus_per_node, part)
    if net is None or tp <= span:
        return max(memory, flops)
    return max(memory, flops) + tp_collectives_s(w, part, per_rank, net)


def _replicas(w: Workload) -> tuple[int, int]:
    """(replicas, the step's sequences per replica)."""
    replicas = max(w.world // (w.rollout_tp * w.rollout_dp), 1)
    return replicas, -(-w.samples // replicas)


def prefill_s(w: Workload, part: Part, mfu: float) -> float:
    return compute_s(2 * w.active_params * w.samples * w.prompt_mean, w, part, mfu)


def rollout_s(w: Workload, part: Part, response: float, mbu: float, mfu: float, longest: bool,
              net: Optional[float] = None) -> float:
    """Every response at `response` tokens (longest=False), or (longest=True) the last wave's whole batch decoding
    `response` steps. Concurrency: at the mean, as many sequences as the paged KV cache holds at their mean occupancy
    (concurrency); at the longest, the KV cache's fit at the longest sequence (kv_fits); in waves."""
    _, share = _replicas(w)
    c = max(1, int(concurrency(w, w.prompt_mean + w.response_mean / 2 if not longest else None)))
    waves = -(-share // c)
    mean_step = decode_step_s(w, part, c, w.prompt_mean + w.response_mean / 2, mbu, mfu, net)
    if not longest:
        decode = waves * response * mean_step
    else:
        decode = (waves - 1) * w.response_mean * mean_step + \
            response * decode_step_s(w, part, c, w.prompt_mean + response / 2, mbu, mfu, net)
    return decode + prefill_s(w, part, mfu)


def concurrency(w: Workload, occupancy: Optional[float]) -> float:
    """Sequences a replica decodes at once: its share of the step, at most DP·max_num_seqs and what its KV cache
    holds — at the longest sequence (occupancy None: kv_fits), or, vLLM's paged cache allocating blocks as
    sequences grow (Kwon et al. 2023), at `occupancy` tokens each (kv_fits scaled by the longest sequence over it)."""
    _, share = _replicas(w)
    fit = float(share)
    if w.kv_fits is not None and w.kv_fits > 0:
        fit = w.kv_fits * ((w.prompt_mean + w.response_max) / max(occupancy, 1.0) if occupancy else 1.0)
    return max(1.0, min(float(share), float(w.rollout_dp * w.max_num_seqs), fit))


@functools.lru_cache(maxsize=256)
def _lengths(mean: float, cap: float, n: int) -> tuple:
    """(rate, mean age, expected maximum of n) of Lengths(mean, cap): computed once per distinct workload (mesh=auto
    asks for the same rollout many times)."""
    L = Lengths(mean, cap)
    a = L.rate
    return a, L.mean_age(a=a), L.expected_max(n, a=a)


@dataclass(frozen=True)
class Lengths:
    """Response lengths on [0, cap] with a known mean, spread as the maximum-entropy distribution with that mean and
    support (density ∝ e^(λx); uniform at mean = cap/2, falling toward the cap below it, rising above it): the least
    committal spread the two known figures allow (Jaynes 1957)."""
    mean: float
    cap: float

    @property
    def rate(self) -> float:
        """λ·cap, solved from the mean by bisection (0: uniform)."""
        m = min(max(self.mean / self.cap, 1e-4), 1 - 1e-4) if self.cap > 0 else 0.5
        lo, hi = -1e4, 1e4
        for _ in range(64):
            mid = (lo + hi) / 2
            if _mean_of(mid) < m:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    def cdf(self, x: float, a: Optional[float] = None) -> float:
        if self.cap <= 0:
            return 1.0  # no response tokens at all (max_response_length 0 or unset)
        a = self.rate if a is None else a
        u = min(max(x / self.cap, 0.0), 1.0)
        if abs(a) < 1e-9:
            return u
        if a > 0:
            return math.exp(a * (u - 1)) * (-math.expm1(-a * u)) / -math.expm1(-a)
        return math.expm1(a * u) / math.expm1(a)

    def expected_max(self, n: int, points: int = 400, a: Optional[float] = None) -> float:
        """E[the longest of n] = ∫ 1 − F(x)^n dx over [0, cap] (midpoint rule)."""
        if self.cap <= 0:
            return 0.0
        a, h = self.rate if a is None else a, self.cap / points
        return sum(1 - self.cdf((i + 0.5) * h, a) ** n for i in range(points)) * h

    def mean_age(self, points: int = 400, a: Optional[float] = None) -> float:
        """The mean decoded length of a sequence in flight when slots refill as sequences end (a renewal process's
        mean age, E[L²] / (2·E[L]))."""
        if self.cap <= 0 or self.mean <= 0:
            return 0.0
        a, h = self.rate if a is None else a, self.cap / points
        second = sum(2 * ((i + 0.5) * h) * (1 - self.cdf((i + 0.5) * h, a)) for i in range(points)) * h
        return second / (2 * self.mean) if self.mean > 0 else 0.0


def _mean_of(a: float) -> float:
    """The mean of density ∝ e^(a·u) on [0, 1]."""
    if abs(a) < 1e-6:
        return 0.5 + a / 12
    if a > 0:
        return 1 / -math.expm1(-a) - 1 / a
    return math.exp(a) / math.expm1(a) - 1 / a


def spread_rollout_s(w: Workload, part: Part, mbu: float, mfu: float, net: Optional[float] = None,
                     paged: bool = False, segments: int = 48) -> float:
    """The middle rollout: response lengths spread as Lengths(mean, max). A replica decodes as many sequences at
    once as its KV cache holds at the longest sequence (concurrency, kv_fits); while sequences wait, the slots decode
    at full batch (the queue's tokens over the slots), each at the prompt and the mean age of a sequence in flight;
    then the last slots drain, alive(t) = C·(1 − F(t)), until the step's longest response ends (its expected
    maximum over all the step's sequences: the step waits for the slowest replica). vLLM admits more than that fit
    and preempts when its paged cache fills (Kwon et al. 2023): paged=True counts the admitted at their mean
    occupancy (the prompt and the mean age), the optimistic end's concurrency, not the middle's."""
    _, share = _replicas(w)
    lengths = Lengths(w.response_mean, w.response_max)
    a, age, longest = _lengths(float(w.response_mean), float(w.response_max), int(w.samples))
    occupancy = w.prompt_mean + age
    c = concurrency(w, occupancy if paged else None)
    queued = max(0.0, (share - c) * w.response_mean / c)
    full = queued * decode_step_s(w, part, c, occupancy, mbu, mfu, net) if queued else 0.0
    h, drain = longest / segments, 0.0
    for i in range(segments):
        t = (i + 0.5) * h
        alive = max(1.0, c * (1 - lengths.cdf(t, a)))
        drain += h * decode_step_s(w, part, alive, w.prompt_mean + t, mbu, mfu, net)
    return full + drain + prefill_s(w, part, mfu)

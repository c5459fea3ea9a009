"""mesh=auto: rank the meshes that pass the plan's checks (vrun.estimate.meshes enumerates them), and say why none
passes.

Objective (RANKING, in order): fits in GPU memory by the estimate (vrun.estimate.memory: the GPU holds the high end of
its band) — and among meshes that do
not, the lower peak first; then, among those that fit, the lower predicted step time (vrun.estimate.steptime's
middle, when a time estimate can be made: computed only for the meshes that fit); then least communication —
smaller TP, smaller CP, expert parallelism within a node (EP·ETP ≤ GPUs per node), fewer pipeline stages; then the
lower memory peak. Without a time estimate the time entry ties and the memory/communication ranking decides alone.
Pure functions of their inputs.
"""
from __future__ import annotations

import math
from bisect import insort
from itertools import takewhile
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable, NamedTuple, Optional

from vrun.estimate.mesh import KNOBS, Mesh, Rules
from vrun.estimate.meshes import valid_meshes
from vrun.estimate.rollout import RANKING as ROLLOUT_RANKING, ROLLOUT_TP

TIME = "lower predicted step time"
# step times closer than this share are equal for the ranking (the estimate's low–high bound spans ~2–6× and its
# terms omit TP/EP communication): the communication entries after the time entry then decide. A ranking
# resolution, not an efficiency factor: it scales no prediction.
TIME_RESOLUTION = 0.02


def step_s(st) -> float:
    """A StepTime's middle, rounded to TIME_RESOLUTION on a log scale (0.0: no estimate)."""
    return step_bucket(st.central) if st is not None else 0.0


# step_bucket's steps start this far above 0 (which stands for no time), so that every time, a second or less
# included, is a positive step
BUCKET_BASE = 100_000


def step_bucket(seconds: float) -> float:
    """Seconds in steps of TIME_RESOLUTION on a log scale (monotone; every time a positive step, 0.0: none): the
    order in which rank() times the meshes exactly, before the fastest is known."""
    if not seconds > 0:
        return 0.0
    return float(max(1, round(math.log(seconds) / math.log1p(TIME_RESOLUTION)) + BUCKET_BASE))


def step_from(seconds: float, fastest: float) -> float:
    """Seconds as the time entry ranks them: steps of TIME_RESOLUTION on a log scale counted from the fastest mesh's
    time, so every time within TIME_RESOLUTION of the fastest is step 1 and ties with it (0.0: none, which ties)."""
    if not seconds > 0 or not fastest > 0:
        return 0.0
    return float(math.floor(math.log(max(seconds, fastest) / fastest) / math.log1p(TIME_RESOLUTION)) + 1)


# how far apart (in step_bucket's steps) a lower bound must be from the first meshes' times for rank() to leave its
# mesh untimed: step_bucket's rounding and step_from's anchoring move a time by up to one step each way
PRUNE_STEPS = 3


class Candidate(NamedTuple):
    mesh: Mesh
    estimate: object = None  # vrun.estimate.memory.Estimate or None when no estimate can be made
    time: object = None      # vrun.estimate.steptime.StepTime: only for a mesh that fits, when a time estimate exists
    ranked_key: tuple = ()   # its ranking key as rank() computed it

    @property
    def fits(self) -> bool:
        return self.estimate is None or self.estimate.fits

    @property
    def peak(self) -> float:
        """The memory peak as ranked: the high end of the estimate's band."""
        return self.estimate.high if self.estimate is not None else 0.0

    @property
    def step(self) -> float:
        """The predicted step time as ranked: its step of TIME_RESOLUTION on a log scale from the fastest mesh's
        (rank's key; step_s's absolute step without one; 0: none, which ties)."""
        return self.ranked_key[TIME_AT] if self.ranked_key else step_s(self.time)

    def key(self):
        return self.ranked_key or ranking_key(self.mesh, self.fits, self.peak, self.step)


# mesh=auto's ranking: (what it prefers, its value as an expression of the mesh `m`, `fits` — the GPU holds the
# memory band's high end —, `peak` — that high end — and `step`, the predicted step time as step_s ranks it, 0 where
# none is made; smaller first), applied in order. One list shared by
# memory and time. The expressions are compiled into one key function (the search ranks thousands of meshes).
RANKING: tuple = (
    ("fits in memory", "not fits"),
    ("when it does not fit, the lower peak (band high end)", "0.0 if fits else peak"),
    (TIME, "step"),
    ("smaller TP", "m.tp"),
    ("smaller CP", "m.cp"),
    ("EP·ETP within a node", "m.ep * m.etp > m.gpus_per_node"),
    ("fewer PP stages", "m.pp"),
    ("lower peak (band high end)", "peak"),
    ("more EP", "-m.ep"),
    ("smaller ETP", "m.etp"),
)


def compile_ranking(ranking: tuple) -> Callable:
    return eval("lambda m, fits, peak, step: (" + "".join(f"{expr}, " for _, expr in ranking) + ")")  # noqa: S307


ranking_key = compile_ranking(RANKING)
TIME_AT = [name for name, _ in RANKING].index(TIME)


@dataclass(frozen=True)
class MeshSearch:
    """What a plan records about mesh=auto's search (plan.json's mesh_search). The rows are plan.json's:
    chosen and each alternative {overrides, dp, edp, rollout_tp, peak_gib, band_gib, fits, step_low_s, step_high_s,
    step_middle_s (None without a step-time estimate)}; each rollout TP choice {tp, dp, replicas, sequences_fit,
    step_sequences_per_replica}. chosen_by: the ranking entry that put the chosen mesh before the next."""
    valid_meshes: int
    search_ms: float
    chosen: dict
    alternatives: tuple            # the next best meshes after the chosen one
    rollout_tp_choices: tuple      # the best rollout (TP, DP) first; empty without a rollout or an estimate
    memory: str                    # "estimated", or why no estimate ranked the meshes
    chosen_by: str = ""
    time: str = "estimated"        # "estimated", or why no step time ranked the meshes
    decided_by: Optional[int] = None  # the index in RANKING of the entry that chose the mesh (None: nothing to rank)
    objective: ClassVar[str] = ("mesh: " + ", then ".join(name for name, _ in RANKING) + "; rollout TP·DP: "
                                + ", then ".join(ROLLOUT_RANKING))

    def summary(self) -> dict:
        return {"valid_meshes": self.valid_meshes, "search_ms": self.search_ms, "chosen": self.chosen,
                "chosen_by": self.chosen_by, "decided_by": entry_text(self.decided_by),
                "alternatives": list(self.alternatives),
                "rollout_tp_choices": list(self.rollout_tp_choices), "memory": self.memory, "time": self.time,
                "objective": self.objective}

    def rows(self) -> list[str]:
        """The plan table's auto rows: the search, the chosen mesh with its peak and step time, the ranking entry
        that chose it and why, each alternative with its peak and step time (middle, then the band)."""
        c = self.chosen
        out = [f"auto    {self.valid_meshes} valid meshes searched in {self.search_ms} ms; chosen "
               f"{c['overrides']} (peak {c['peak_gib']} GiB{band_text(c)}{step_text(c, ', ')})",
               f"        chosen by {entry_place(self.decided_by)}{self.chosen_by}"]
        for alt in self.alternatives:
            out.append(f"        alternative {alt['overrides']}  DP{alt['dp']} EDP{alt['edp']}  peak "
                       f"{alt['peak_gib']} GiB{band_text(alt)}{step_text(alt, '  ')}"
                       f"{'' if alt['fits'] else '  (does not fit)'}")
        return out


def entry_text(index: Optional[int]) -> Optional[dict]:
    """plan.json's decided_by: the RANKING entry's place (1-based) and what it prefers; None when no entry decided."""
    if index is None:
        return None
    return {"entry": index + 1, "of": len(RANKING), "prefers": RANKING[index][0]}


def entry_place(index: Optional[int]) -> str:
    """The table's words for the deciding entry's place, before chosen_by (which starts with what it prefers)."""
    return "" if index is None else f"ranking entry {index + 1} of {len(RANKING)}, "


def candidate_row(c: Candidate) -> dict:
    """A candidate's step-time fields for plan.json's mesh_search rows (None where no time was estimated)."""
    t = c.time
    return {"step_low_s": round(t.low, 1) if t is not None else None,
            "step_high_s": round(t.high, 1) if t is not None else None,
            "step_middle_s": round(t.central, 1) if t is not None else None}


def band_text(row: dict) -> str:
    """A row's memory band (vrun.estimate.memory: each term at the ends of how it is known)."""
    band = row.get("band_gib")
    return f", band {band[0]}–{band[1]}" if band else ""


def step_text(row: dict, sep: str) -> str:
    """A row's predicted step time: the middle, then the low–high band."""
    if row.get("step_low_s") is None:
        return ""
    return (f"{sep}step ≈ {_num(row['step_middle_s'])} s ({_num(row['step_low_s'])}–{_num(row['step_high_s'])})")


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


# rank() times exactly (with step_time) at least this many first meshes: the chosen one and the alternatives the
# plan records; the rest keep the lower bound's order
HEAD = 8


class Ranked(list):
    """rank()'s candidates, best first, and the one the ranking without the time entry puts first among those
    that fit (memory_first; None without a step time)."""
    memory_first = None


def rank(meshes: Iterable[Mesh], estimate: Optional[Callable[[Mesh], object]] = None,
         step_time: Optional[Callable[[Mesh, object], object]] = None, head: int = HEAD,
         cp_matters: bool = True) -> list[Candidate]:
    """The meshes, best first. estimate(mesh): the memory estimate; step_time(mesh, estimate): the step-time
    estimate (a StepTime), asked only for the meshes that fit. When step_time has a `bound(mesh, estimate)` (a
    lower bound of its middle in seconds, cheap), the meshes are ordered by it first and timed exactly in that order
    only while one can still enter the first `head`: those are exact and carry their time, the rest follow in the
    bound's order without one. cp_matters: the estimate changes with CP (an attention that gathers the CP group's
    sequence: vrun.estimate.memory.cp_matters); else one estimate serves every CP of a (world, TP, PP, EP·ETP)."""
    # the memory estimate depends on the mesh only through (world, TP, PP, EP·ETP), and CP where an attention
    # gathers its sequence (vrun.estimate.activations): DP and EDP follow from them; the step time besides through
    # CP and VPP (the micro-batches per DP rank, the bubble)
    memo: dict = {}
    seen: dict = {}
    keys: dict = {}   # a step_time function returns one StepTime for the meshes it cannot tell apart
    bound = getattr(step_time, "bound", None)
    after = TIME_AT + 1

    def exact(m: Mesh, e) -> tuple:
        k = (m.world, m.tp, m.pp, m.ep * m.etp, m.cp, m.vpp)
        got = seen.get(k)
        if got is None:
            t = step_time(m, e)
            if id(t) not in keys:
                keys[id(t)] = (t, step_s(t))
            got = seen[k] = keys[id(t)]
        return got

    keyed = []
    alone = None
    bounds: dict = {}
    for m in meshes:
        tk = (m.world, m.tp, m.pp, m.ep * m.etp, m.cp, m.vpp)
        mk = tk[:5] if cp_matters else tk[:4]
        if mk not in memo:
            memo[mk] = estimate(m) if estimate else None
        e = memo[mk]
        fits, peak = (True, 0.0) if e is None else (e.fits, e.high)
        if step_time is None or not fits:
            t, sk = None, 0.0
        elif bound is not None:
            sk = bounds.get(tk)
            if sk is None:
                sk = bounds[tk] = step_bucket(bound(m, e))
            t = None
        else:
            t, sk = exact(m, e)
        k = ranking_key(m, fits, peak, sk)
        keyed.append((k, m, e, t))
        if step_time is not None and fits and (alone is None or k[after:] < alone[0][after:]):
            alone = (k, m, e)
    keyed.sort(key=lambda kc: kc[0])
    out = Ranked()
    if bound is None:
        done, rest = keyed, []
    else:
        done, best, i = [], [], 0
        for i, (kb, m, e, _) in enumerate(keyed):
            if len(best) >= head and _beyond(kb, best[head - 1]):
                break
            fits = e is None or e.fits
            t, sk = exact(m, e) if fits else (None, 0.0)
            k = ranking_key(m, fits, e.high if e is not None else 0.0, sk) if fits else kb
            done.append((k, m, e, t))
            insort(best, k)
        else:
            i = len(keyed)
        rest = keyed[i:]
    # the time entry counts steps from the fastest mesh timed: within TIME_RESOLUTION of it is a tie, which the
    # entries after it decide
    times = [t.central for _, _, _, t in done if t is not None]
    fastest = min(times) if times else 0.0

    def keyed_from_fastest(k, m, e, t):
        return ranking_key(m, True, e.high if e is not None else 0.0, step_from(t.central, fastest)) \
            if t is not None else k

    done = sorted(((keyed_from_fastest(k, m, e, t), m, e, t) for k, m, e, t in done), key=lambda kc: kc[0])
    out.extend(Candidate(m, e, t, k) for k, m, e, t in done)
    out.extend(Candidate(m, e, None, k) for k, m, e, _ in rest)
    if alone is not None:
        k, m, e = alone
        t, _ = exact(m, e)
        out.memory_first = Candidate(m, e, t, keyed_from_fastest(k, m, e, t))
    return out


def _beyond(bound_key: tuple, head_key: tuple) -> bool:
    """Whether a mesh keyed by its lower bound can be left untimed: after the head-th first mesh by the entries
    before the time entry, or, equal on those, PRUNE_STEPS time steps or more slower (so no re-counting from the
    fastest can bring it level with any of the first meshes); without times, after it by the whole key."""
    a, b = bound_key[:TIME_AT], head_key[:TIME_AT]
    if a != b:
        return a > b
    if not head_key[TIME_AT]:
        return bound_key > head_key
    return bound_key[TIME_AT] >= head_key[TIME_AT] + PRUNE_STEPS


def chosen_by(ranked: list, time_note: str = "") -> str:
    """Which ranking entry chose the first mesh (decided_by gives its index): the first entry of RANKING on which it
    and the next differ, with their figures for it; where the time entry set aside the mesh memory and communication
    alone would have chosen, that first. time_note: why no step time was estimated (empty when one was)."""
    return _decision(ranked, time_note)[1]


def decided_by(ranked: list) -> Optional[int]:
    """The index in RANKING of the entry that chose the first mesh (chosen_by says why), None when no entry did (one
    mesh, or meshes equal on every entry)."""
    return _decision(ranked, "")[0]


def _time_lead(ranked: list):
    """The mesh the ranking without the time entry puts first (among those that fit), when the time entry set it
    aside for the chosen one; else None."""
    first = ranked[0]
    if first.time is None:
        return None
    alone = getattr(ranked, "memory_first", None)
    if alone is None:
        after = TIME_AT + 1  # the entries before the time entry are equal among the meshes that fit (first)
        alone = min(takewhile(lambda c: c.fits, ranked), key=lambda c: c.key()[after:])
    return alone if alone.mesh != first.mesh and alone.step != first.step else None


def decision(ranked: list, time_note: str = "") -> tuple:
    """(decided_by, chosen_by) at once: the deciding entry's index in RANKING (None: none decided) and why."""
    return _decision(ranked, time_note)


def _decision(ranked: list, time_note: str) -> tuple:
    why = f"; no step-time estimate: {time_note}" if time_note else ""
    if not ranked:
        return None, ""
    first = ranked[0]
    alone = _time_lead(ranked)
    lead = (f"{TIME} (≈ {first.time.central:.3g} s vs ≈ {alone.time.central:.3g} s for "
            f"{alone.mesh.overrides()}, the first by memory and communication alone)") if alone is not None else ""
    if len(ranked) == 1:
        return (TIME_AT if lead else None), (lead or "the only valid mesh" + why)
    second = ranked[1]
    a, b = first.key(), second.key()
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    name = RANKING[i][0] if i is not None else None
    decider = TIME_AT if lead else i
    if name == TIME:
        return TIME_AT, lead or (f"{TIME} (≈ {first.time.central:.3g} s vs ≈ {second.time.central:.3g} s for "
                                 f"{second.mesh.overrides()})")
    if name is None:
        then = "equal on every entry (the enumeration's order)"
    elif name == "fits in memory":
        then = f"{name} (the next, {second.mesh.overrides()}, does not)"
    elif name in (RANKING[1][0], "lower peak (band high end)"):
        then = f"{name} ({first.peak / 2 ** 30:.1f} vs {second.peak / 2 ** 30:.1f} GiB)"
    else:
        then = f"{name} (than {second.mesh.overrides()})"
    if first.time is not None and second.time is not None and name != "fits in memory":
        then += f", the step times equal within {TIME_RESOLUTION:.0%}"
    return decider, (f"{lead}; then {then}" if lead else then) + why


def binding_constraint(rules: Rules, nnodes: int, gpus_per_node: int, verl: Optional[dict], entrypoint,
                       rollout_tps: Optional[list]):
    """Why no mesh passes: the first family of checks that leaves none — Megatron Lite's mesh rules, the rollout
    TP, then the batch checks (with the problem of the best mesh that passed the earlier ones). rollout_tps: the
    rollout (TP, DP) choices mesh=auto had, None for an entrypoint without a rollout."""
    from vrun.core.problems import Problem

    world = nnodes * gpus_per_node
    arch = rules.arch
    meshes = valid_meshes(rules, nnodes, gpus_per_node)
    if not meshes:
        return Problem("mesh.nnodes", nnodes, f"no TP·CP·PP / ETP·EP·PP split of {nnodes}×{gpus_per_node}={world} "
                       f"GPUs meets {rules.model}'s rules (EP divides {arch.routed_experts} experts, TP in "
                       f"{list(rules.tp_allowed)})", "a GPU count with more factors of 2, e.g. mesh.nnodes="
                       f"{max(1, 1 << (max(nnodes, 1) - 1).bit_length())}")
    if rollout_tps is not None and not rollout_tps:  # mesh=auto's rollout TP choices (None: no rollout)
        rule = f" and divide {arch.o_groups} o_groups" if arch.o_groups else ""
        return Problem(ROLLOUT_TP, None, f"no rollout TP fits within a node of {gpus_per_node} GPUs, tiles {world} GPUs"
                       f"{rule}", "mesh.gpus_per_node a power of two")
    ranked = rank(meshes)
    found = entrypoint.mesh_problems(verl, ranked[0].mesh, rules, rollout_tps) if verl else []
    if found:
        p = found[0]
        example = " ".join(f"{k}={getattr(ranked[0].mesh, k)}" for k in KNOBS)
        return Problem(p.key, p.value, f"every mesh of {world} GPUs fails the batch checks; with {example}: {p.why}",
                       p.fix)
    return None

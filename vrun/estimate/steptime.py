"""Step time and cost of a run, as pure arithmetic: an ESTIMATE with a low and a high bound per phase.

A colocated RL step (verl's ray_trainer: gen, old_log_prob, ref, update_actor, update_weights) and an SFT step,
from what the plan knows. N = active parameters (vrun/estimate/params.py: the top-k experts), T = the step's tokens,
P = peak dense bf16 FLOP/s of the part, B = its HBM bandwidth (vrun/estimate/hardware.py), G = GPUs.
  rollout     per replica (TP·DP GPUs), S = the step's sequences per replica. One decode step reads, per GPU, the
              dense weights / TP, the routed experts / (TP·DP) that its C sequences touch (1 − (1 − k/E)^C of them)
              and their KV: time = max(bytes / (B·MBU), 2·N·C/DP/TP / (P·MFU)) (the roofline: memory bound until the
              batch is large). The middle MBU is the one measured at the replica's TP (DECODE_MBU_AT_TP: a whole
              decode step on one node, its all-reduces included); past the widest TP measured (TP8) both ends of
              the band carry on the source's trend per doubling (decode_mbu_worst, decode_mbu_best: the band keeps
              its TP8 width), the middle between TP8's figure held flat and the trend. A replica wider than its
              NVLink domain adds the
              step's two all-reduces per decoder layer (Shoeybi et al. 2019) of its bf16 activations over the TP
              group: NCCL's own latency model (Ring or Tree, LL; vrun/estimate/hardware.py NCCL_LATENCY_US, from
              NCCL's tuning.cc) + 2(n−1)/n·bytes over the node's network, at every end (decode_step_s).
              Prefill: 2·N·prompt tokens / (G·P·MFU).
              spread_rollout_s: the response lengths spread as the maximum-entropy distribution on
              [0, max_response_length] with the known mean (Lengths); C = min(S, DP·max_num_seqs, the KV cache's fit
              at the longest sequence) decoding at full batch while any wait, then draining as they finish; the step
              waits for the longest of the step's sequences (its expected maximum). Low: the optimistic efficiencies
              and C at what vLLM's paged KV cache holds at the sequences' mean occupancy (Kwon et al. 2023,
              arXiv:2309.06180); middle: the middle efficiencies. High: the pessimistic efficiencies and the
              longest tail — C in ceil(S/C) waves, the last one's whole batch decoding max_response_length steps
              (rollout_s; plan.json's rollout_at_max_response_length, beside rollout_at_mean: every response at
              the mean).
  log-prob    2·N·T / (G·P·MFU) per pass: the old policy always, the reference when a KL term is on
              (NeMo RL's Megatron worker swaps the reference's weights in through pinned host memory for its pass:
              three copies of the per-GPU weights, reference_swap_s; verl's reference is its own module)
  training    6·N·T (8·N·T under full recompute: the forward again) / (G·P·MFU) — the 6·N·T rule of Kaplan
              et al. 2020 (arXiv:2001.08361) and Narayanan et al. 2021 (arXiv:2104.04473, with recompute) — plus
              the training mesh's TP all-reduce and EP all-to-all bytes (training_collectives_s; log-prob too).
              MFU: a dense model's (train_mfu) or a mixture of experts' (train_mfu_moe), each measured apart.
              Under expert parallelism (EP > 1) the routed experts' share of the FLOPs (routed_share) at the MoE
              balance (moe_balance: the layer waits for its busiest EP rank; pessimistic 18.6% of its time lost)
  bubble      log-prob and training × (1 + (PP − 1) / (m·VPP)), m micro-batches per mini-batch per DP rank
              (Narayanan et al. 2021, the 1F1B schedule's bubble fraction)
  sync        the weight refit (refit_parts): the whole bf16 model through every rank at a measured refit rate
              (REFIT_RATE: verl's and NeMo RL's refit gather each tensor in full on every rank, and the rollout
              engine loads it whole, keeping its shard), never less than an ideal reshard of the rollout rank's own
              shard; + a measured cost per tensor handed over (REFIT_TENSOR_S × the model's tensor count, tensor_count;
              at the optimistic end beside the transfer, as in the refit REFIT_RATE's optimistic figure was measured
              on); + the rollout engine's wake-up (ENGINE_WAKE_S) and, when it slept at vLLM's level 1 (weights kept in
              host memory), its weights copied back over PCIe; + what the colocated refit itself moves between the GPU
              and the host to make room for the engine (refit_host_parts, REFIT_HOST): verl brings the offloaded
              training weights to the GPU for the export and sends them back after it; NeMo RL sends the optimizer
              states and the training weights to the host. For a dense model that is most of the refit (NeMo RL v0.3's
              Llama-3.1-8B: 2.8 s of its host copies beside 1.2 s of gather and wake-up)
  offload     over PCIe per GPU (host_copies, offload_parts), what the refit does not move: under verl the
              weights and optimizer states to the host after the update and back before it; under NeMo RL their
              way back. The parameters (param_offload) in and out of pinned host memory, the optimizer states
              (optimizer_offload) through pageable host memory (the pinned rate × PAGEABLE). Gradients are not
              copied: Megatron's grad buffer is freed and zeroed again (megatron-core
              ParamAndGradBuffer.offload_to_cpu, Megatron Lite's offload_model_to_cpu)
  sft         training and bubble only; T = train_batch_size · max_length · the mean fraction
Collectives stay at NVLink speed inside the part's NVLink domain (nvlink_span: a node's GPUs, or a whole NVL72 rack),
at the node's network speed across domains; a job fills one domain after another, so a group whose block of ranks
meets a domain's edge (an EP16 block on a 72-GPU rack) straddles two (in_domain).
  optimizer   per optimizer step, the distributed optimizer's gradient reduce-scatter and parameter all-gather over
              data parallel (gradient_sync_s), added to training
  host        the refit, offload and the engine's sleep copy are host-bound: their pessimistic ends on a slower
              cluster than their rates' sources (FACTORS host: the same recipes' refit measured 1.33–1.5× slower on
              a second cluster while the GPU-bound phases held)
Not modelled (said in the assumptions): reward computation, sequence imbalance between DP ranks, communication not
named above (CP and PP traffic, the rollout's EP all-to-all in place of its MoE all-reduce), kernel-launch and
scheduling overheads, a CPU optimizer's own step, start-up and checkpoint saves.

The efficiencies are one fixed set (FACTORS, and the refit's REFIT_RATE, REFIT_TENSOR_S, ENGINE_WAKE_S), each a
(pessimistic, optimistic) pair with its source, never fitted to the published step times the tests hold the
estimate to (tests/test_steptime.py). A calibration from recorded runs (vrun/planning/calibration.py) scales the
result; the plan says so.

Where each part lives: the factors and measured rates (steptime_factors), the workload and a phase's arithmetic
(steptime_work), the collectives (steptime_comm), the rollout (steptime_rollout), the refit and the offload
(steptime_refit); this module puts them together per phase (estimate), with the calibration (calibrated) and the
training mesh's collectives added per mesh (with_collectives). Their names are importable from here too.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from vrun.estimate.hardware import Part
from vrun.estimate.steptime_factors import (  # noqa: F401 - the estimate's names, one namespace for its callers
    CALIBRATED_SPREAD, DECODE_MBU_AT_TP, ENGINE_SLEEP_LEVEL, ENGINE_WAKE_S, FACTORS, Factor, MEAN_FRACTION,
    REFIT_ENGINE_PARTS, REFIT_HOST, REFIT_RATE, REFIT_TENSOR_S, Rate, decode_mbu, decode_mbu_best, decode_mbu_worst,
    middle)
from vrun.estimate.steptime_work import (  # noqa: F401 - the estimate's names, one namespace for its callers
    Phase, Workload, attention_flops_per_key, compute_s, mfu_factor, on_mesh, plus, routed_share, summed,
    tensor_count)
from vrun.estimate.steptime_comm import (  # noqa: F401 - the estimate's names, one namespace for its callers
    allreduce_s, gradient_sync_s, in_domain, nvlink_span, tp_collectives_s, training_collectives_s)
from vrun.estimate.steptime_rollout import (  # noqa: F401 - the estimate's names, one namespace for its callers
    Lengths, concurrency, decode_step_s, prefill_s, rollout_s, spread_rollout_s)
from vrun.estimate.steptime_refit import (  # noqa: F401 - the estimate's names, one namespace for its callers
    host_copies, offload_parts, on_host, reference_swap_s, refit_bytes, refit_host_parts, refit_parts,
    rollout_shard_bytes, sync_s)


@dataclass(frozen=True)
class StepTime:
    phases: dict                    # name -> Phase, in step order
    rollout_at_mean: Optional[Phase] = None
    rollout_at_max: Optional[Phase] = None
    assumptions: tuple = ()
    factors: dict = field(default_factory=dict)
    scale: float = 1.0              # a calibration's measured/predicted ratio (1: none)
    calibration: str = ""           # "calibrated from 3 runs" or ""
    ratios: tuple = ()              # the calibration's measured/predicted ratios (the bound then spans them)

    @property
    def low(self) -> float:
        if self.ratios:
            return self.model_middle * min(self.ratios) * CALIBRATED_SPREAD[0]
        return sum(p.low for p in self.phases.values()) * self.scale

    @property
    def high(self) -> float:
        if self.ratios:
            return self.model_middle * max(self.ratios) * CALIBRATED_SPREAD[1]
        return sum(p.high for p in self.phases.values()) * self.scale

    @property
    def model_middle(self) -> float:
        """The uncalibrated middle: what a calibration's ratios are taken against."""
        return sum(p.middle for p in self.phases.values())

    @property
    def central(self) -> float:
        """Every phase at the middle efficiencies, the rollout's responses spread over their lengths (the step
        waiting for its longest). The figure held to published step times."""
        return sum(p.middle for p in self.phases.values()) * self.scale

    def phase(self, name: str) -> Phase:
        return self.phases.get(name, Phase(0.0, 0.0)).scaled(self.scale)

    def part(self, phase: str, name: str) -> Phase:
        """One cost inside a phase (offload's to_host, sync's transfer …), scaled like the phase; zero if absent."""
        return dict(self.phase(phase).parts).get(name, Phase(0.0, 0.0))

    def summary(self) -> dict:
        return {
            "estimate": True,
            "step_low_s": round(self.low, 1), "step_high_s": round(self.high, 1),
            "step_middle_s": round(self.central, 1),
            "phases": {k: self.phase(k).summary() for k in self.phases},
            "rollout_at_mean": self.rollout_at_mean.summary() if self.rollout_at_mean else None,
            "rollout_at_max_response_length": self.rollout_at_max.summary() if self.rollout_at_max else None,
            "factors": {k: asdict(v) for k, v in self.factors.items()},
            "model_middle_s": round(self.model_middle, 2),
            "calibration": {"scale": round(self.scale, 3), "from": self.calibration,
                            "ratios": [round(r, 3) for r in self.ratios]} if self.calibration else None,
            "assumptions": list(self.assumptions),
        }


def calibrated(st: StepTime, ratios: list, how: str) -> StepTime:
    """The estimate scaled by the median measured/predicted ratio of recorded runs, its bound spanning them."""
    rs = sorted(ratios)
    mid = rs[len(rs) // 2] if len(rs) % 2 else (rs[len(rs) // 2 - 1] + rs[len(rs) // 2]) / 2
    return StepTime(st.phases, st.rollout_at_mean, st.rollout_at_max, st.assumptions, st.factors, mid, how,
                    tuple(rs))


def _bubble(w: Workload) -> float:
    return (w.pp - 1) / (max(w.micro_batches, 1) * max(w.vpp, 1)) if w.pp > 1 else 0.0


def estimate(w: Workload, part: Part, factors: Optional[dict] = None, same_rollout: Optional[StepTime] = None,
             collectives: bool = True) -> StepTime:
    """The step time of w on part. same_rollout: an estimate of the same workload on another training mesh of the
    same GPUs (on_mesh): its rollout and sync phases, which do not depend on the training mesh, are taken as they
    are (mesh=auto times many meshes). collectives=False leaves the training mesh's collectives out (for
    with_collectives to add per mesh)."""
    f = factors or FACTORS
    mfu, mbu, net = mfu_factor(w, f), f["decode_mbu"], f["network"]
    phases: dict = {}
    at_mean = at_max = None
    bubble = 1 + _bubble(w)
    attn = w.attention_flops()

    routed, bal = routed_share(w), f["moe_balance"]

    def compute(n_flops: float, attn_flops: float, note: str, passes: float) -> Phase:
        """Compute and the training mesh's collectives, × the pipeline bubble; the routed experts' share of the
        N-term FLOPs at the MoE balance's efficiency."""
        def t(e_mfu: float, e_net: float, e_bal: float) -> float:
            comm = training_collectives_s(w, part, passes, e_net) if collectives else 0.0
            flops = n_flops * (1 - routed + routed / e_bal) + attn_flops
            return (compute_s(flops, w, part, e_mfu) + comm) * bubble
        return Phase(t(mfu.high, net.high, bal.high), t(mfu.low, net.low, bal.low), note,
                     t(middle(mfu), middle(net), middle(bal)))

    if w.rollout and same_rollout is not None:
        at_mean, at_max = same_rollout.rollout_at_mean, same_rollout.rollout_at_max
        phases["rollout"] = same_rollout.phases["rollout"]
    elif w.rollout:
        at_tp, worst = decode_mbu(w.rollout_tp, mbu), decode_mbu_worst(w.rollout_tp, mbu)
        best = decode_mbu_best(w.rollout_tp, mbu)
        at_mean = Phase(rollout_s(w, part, w.response_mean, best, mfu.high, False, net.high),
                        rollout_s(w, part, w.response_mean, worst, mfu.low, False, net.low), "",
                        rollout_s(w, part, w.response_mean, at_tp, middle(mfu), False, middle(net)))
        at_max = Phase(rollout_s(w, part, w.response_max, best, mfu.high, True, net.high),
                       rollout_s(w, part, w.response_max, worst, mfu.low, True, net.low), "",
                       rollout_s(w, part, w.response_max, at_tp, middle(mfu), True, middle(net)))
        decode = Phase(spread_rollout_s(w, part, best, mfu.high, net.high, paged=True),
                       max(spread_rollout_s(w, part, worst, mfu.low, net.low), at_max.high), "",
                       spread_rollout_s(w, part, at_tp, middle(mfu), middle(net)))
        parts = {"decode": decode}
        if w.engine_sleep_level == 1:
            # vLLM's level-1 sleep after the rollout copies its weights to pinned host memory
            b, pcie = rollout_shard_bytes(w) / part.pcie, f["pcie"]
            parts["sleep"] = on_host(Phase(b / pcie.high, b / pcie.low, "", b / middle(pcie)), f)
        phases["rollout"] = summed(parts, "the response lengths spread with their mean, the step waiting for its "
                                   "longest; low: the optimistic efficiencies, as many sequences at once as the paged "
                                   "KV cache holds at their mean occupancy; middle: as many as it holds at the "
                                   "longest; high: the last wave's whole batch decoding max_response_length")
    if w.rollout:
        passes = 2 if w.reference else 1
        note = "old policy" + (" + reference" if w.reference else "")
        passes_s = compute(2 * w.active_params * w.tokens * passes, attn * passes, note, passes)
        swap = reference_swap_s(w, part, f)
        phases["log_prob"] = summed({"passes": passes_s, "reference_swap": swap},
                                    note + ", its weights swapped in through host memory") if swap.high > 0 \
            else passes_s
    k = 8 if w.recompute else 6
    train = compute(k * w.active_params * w.tokens, k / 2 * attn,
                    f"{k}·N·T + attention + TP/EP collectives, pipeline bubble ×{bubble:.2f}, the optimizer's "
                    f"DP traffic × {w.mini_batches}", k / 2)
    if collectives:
        g = [gradient_sync_s(w, part, e) for e in (net.high, net.low, middle(net))]
        train = Phase(train.low + g[0], train.high + g[1], train.note, train.middle + g[2])
    phases["train"] = train
    if w.rollout:
        # the engine's side of the refit does not depend on the training mesh (taken from same_rollout when given);
        # what the refit moves to and from the host does (the per-GPU bytes of the training engine's state)
        engine = dict(same_rollout.phases["sync"].parts) if same_rollout is not None else refit_parts(w, part, f)
        engine = {n: p for n, p in engine.items() if n in REFIT_ENGINE_PARTS}
        r = REFIT_RATE
        host = " beside it " + ("the training weights to the GPU for the export and back to the host"
                                if w.refit_host != "state" else "the optimizer states and training weights to the host")
        phases["sync"] = summed({**engine, **refit_host_parts(w, part, f)},
                                f"every rank handles the whole bf16 model ({refit_bytes(w) / 1e9:.0f} GB) at "
                                f"{r.low / 1e9:.0f}–{r.high / 1e9:.0f} GB/s (the frameworks' per-tensor refit), "
                                f"{w.tensors:,} tensors, the engine's wake-up;{host}")
    moved = offload_parts(w, part, f)
    if moved:
        per_way = (w.param_bytes if w.param_offload else 0.0) + (w.optimizer_bytes if w.optimizer_offload else 0.0)
        ways = "back" if w.refit_host == "state" else "each way"
        phases["offload"] = summed(moved, f"{per_way / 2 ** 30:.0f} GiB per GPU {ways} over PCIe (optimizer "
                                          "states through pageable memory)")
    assumptions = (
        "ESTIMATE: roofline per phase with the efficiencies listed (low time = the optimistic efficiency; the "
        "middle = their geometric mean, the decode MBU measured at the rollout's TP, the response lengths spread "
        "with their mean, the step waiting for its longest)",
        w.mean_source,
        "decode: a replica's TP all-reduces within its NVLink domain in its measured MBU; a replica wider than the "
        "domain adds its whole TP group's by NCCL's latency model + bytes; training and log-prob: TP all-reduce "
        "and EP all-to-all bytes, NVLink inside the part's NVLink domain; the optimizer's DP reduce-scatter and "
        "all-gather per optimizer step; refit: the whole bf16 model through every rank at the measured refit "
        "rate, a measured cost per tensor, the engine's wake-up, the training state the refit moves to and from "
        "the host; offload: parameters pinned, optimizer states pageable, gradients freed; the host-bound costs "
        "(refit, offload) slower on another cluster at the pessimistic end; " +
        ("experts split over EP ranks waiting for the busiest; " if routed else "") +
        "not modelled: reward, DP imbalance, CP and PP traffic, kernel-launch overheads, a CPU optimizer's step, "
        "start-up, checkpoint saves",
    )
    host_bound = "sync" in phases or "offload" in phases or (
        "rollout" in phases and any(n == "sleep" for n, _ in phases["rollout"].parts))
    unused = {"moe_balance": not routed, "host": not host_bound}
    used = {"train_mfu" if not w.moe else "train_mfu_moe": mfu,
            **{k: v for k, v in f.items() if not k.startswith("train_mfu") and not unused.get(k, False)}}
    if "sync" in phases:
        used.update(refit_rate=REFIT_RATE, refit_tensor_s=REFIT_TENSOR_S, engine_wake_s=ENGINE_WAKE_S)
    return StepTime(phases=phases, rollout_at_mean=at_mean, rollout_at_max=at_max, assumptions=assumptions,
                    factors=used)


def collective_seconds(w: Workload, part: Part, mesh) -> tuple[float, float]:
    """The training mesh's collectives at efficiency 1, before the pipeline bubble: (per forward-equivalent pass,
    the optimizer's DP traffic per step). They depend on the mesh through TP, PP, EP and ETP alone (DP·CP is
    world/(TP·PP)), so mesh=auto computes them once per such mesh."""
    return training_collectives_s(w, part, 1, 1.0, mesh), gradient_sync_s(w, part, 1.0, mesh)


def _passes(w: Workload) -> tuple:
    """(phase, forward-equivalent passes) of the phases the training mesh's collectives add to."""
    train = ("train", (8 if w.recompute else 6) / 2)
    return (("log_prob", 2 if w.reference else 1), train) if w.rollout else (train)


def collectives_middle_s(w: Workload, seconds: tuple, factors: Optional[dict] = None) -> float:
    """What with_collectives adds to the middle, log-prob and training together, from collective_seconds."""
    per_pass, sync = seconds
    one = per_pass * (1 + _bubble(w)) * sum(n for _, n in _passes(w)) + sync
    return one / middle((factors or FACTORS)["network"])


def with_collectives(st: StepTime, w: Workload, part: Part, mesh, factors: Optional[dict] = None,
                     seconds: Optional[tuple] = None) -> StepTime:
    """An estimate made with collectives=False, with the collectives of the training mesh `mesh` (its tp, cp, ep,
    etp, pp) added to its log-prob and training phases: the same figures estimate() gives on that mesh, without
    building the workload again (mesh=auto times thousands of meshes). w: the workload st was made from; seconds:
    collective_seconds(w, part, mesh) when already known."""
    net = (factors or FACTORS)["network"]
    bubble = 1 + _bubble(w)
    phases = dict(st.phases)
    # both are bytes over links at efficiency `net`: computed once at 1, divided by each efficiency
    per_pass, sync = seconds if seconds is not None else collective_seconds(w, part, mesh)
    for name, passes in _passes(w):
        p = phases.get(name)
        if p is None:
            continue
        one = per_pass * bubble * passes + (sync if name == "train" else 0.0)
        if one:
            phases[name] = Phase(p.low + one / net.high, p.high + one / net.low, p.note, p.middle + one / middle(net))
    return StepTime(phases, st.rollout_at_mean, st.rollout_at_max, st.assumptions, st.factors, st.scale,
                    st.calibration, st.ratios)


def gpu_hours(st: StepTime, steps: float, gpus: int) -> tuple[float, float]:
    """(low, high) GPU-hours for `steps` steps on `gpus` GPUs."""
    return st.low * steps * gpus / 3600, st.high * steps * gpus / 3600

"""Step time and cost of a run, as pure arithmetic: an ESTIMATE with a low and a high bound per phase.

A colocated RL step (verl's ray_trainer: gen, old_log_prob, ref, update_actor, update_weights) and an SFT step,
from what the plan knows. N = active parameters (vrun/estimate/params.py: the top-k experts), T = the step's tokens,
P = peak dense bf16 FLOP/s of the part, B = its HBM bandwidth (vrun/estimate/hardware.py), G = GPUs.
  rollout     per replica (TP·DP GPUs), S = the step's sequences per replica, C = min(S, the KV cache's fit,
              DP·max_num_seqs) decoding at once, in ceil(S/C) waves. One decode step reads, per GPU, the dense
              weights / TP, the routed experts / (TP·DP) that C tokens touch (1 − (1 − k/E)^C of them) and the KV
              of its C/DP sequences: time = max(bytes / (B·MBU), 2·N·C/DP/TP / (P·MFU)) (the roofline: memory
              bound until the batch is large). The middle MBU is the one measured at the replica's TP
              (DECODE_MBU_AT_TP: a whole decode step on one node, its all-reduces included). A replica wider than
              a node adds the step's two all-reduces per decoder layer (Shoeybi et al. 2019) of its bf16
              activations over the TP group: NCCL's own latency model (Ring or Tree, LL;
              vrun/estimate/hardware.py NCCL_LATENCY_US, from NCCL's tuning.cc) + 2(n−1)/n·bytes over the
              node's network. Prefill: 2·N·prompt tokens / (G·P·MFU).
              At the mean: waves · mean response · step(context prompt + response/2). The step waits for its
              longest response: at max_response_length, the last wave runs max_response_length decode steps.
  log-prob    2·N·T / (G·P·MFU) per pass: the old policy always, the reference when a KL term is on
  training    6·N·T (8·N·T under full recompute: the forward again) / (G·P·MFU) — the 6·N·T rule of Kaplan
              et al. 2020 (arXiv:2001.08361) and Narayanan et al. 2021 (arXiv:2104.04473, with recompute) — plus
              the training mesh's TP all-reduce and EP all-to-all bytes (training_collectives_s; log-prob too)
  bubble      log-prob and training × (1 + (PP − 1) / (m·VPP)), m micro-batches per mini-batch per DP rank
              (Narayanan et al. 2021, the 1F1B schedule's bubble fraction)
  sync        the weight refit: the whole bf16 model through every rank at a measured refit rate (REFIT_RATE: verl's
              and NeMo RL's refit gather each tensor in full on every rank, and the rollout engine loads it whole,
              keeping its shard), never less than an ideal reshard of the rollout rank's own shard (from other nodes
              over the node's network, a share 1 − 1/nodes of it, within a node over NVLink)
  offload     over PCIe per GPU: parameters and gradients loaded and offloaded once per step each
              (param_offload), the optimizer states too (optimizer_offload)
  sft         training and bubble only; T = train_batch_size · max_length · the mean fraction
Not modelled (said in the assumptions): reward computation, sequence imbalance between DP ranks, MoE load
imbalance, communication not named above (the DP gradient reduction, CP and PP traffic, the rollout's EP
all-to-all in place of its MoE all-reduce), kernel-launch and scheduling overheads, start-up and checkpoint saves.

The efficiencies are one fixed set (FACTORS, and the refit's REFIT_RATE), each a (pessimistic, optimistic) pair with
its source, never fitted to the published step times the tests hold the estimate to (tests/test_steptime.py). A
calibration from recorded runs (vrun/planning/calibration.py) scales the result; the plan says so.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from vrun.estimate import hardware
from vrun.estimate.hardware import Part


@dataclass(frozen=True)
class Factor:
    low: float          # the pessimistic efficiency (the high time)
    high: float         # the optimistic one (the low time)
    source: str


# one fixed set, sourced independently of the published step times
FACTORS = {
    "train_mfu": Factor(0.08, 0.47, "low: Megatron Lite's bench, Qwen3.5-35B-A3B proxy on 8×H100, 80.4 TFLOPs/GPU "
                        "= 8% of 989 (Megatron-LM dev d48bd6be experimental/lite/examples/bench/README.md); high: "
                        "up to 47% MFU on H100 (Megatron-LM README, GPT weak scaling)"),
    # the band spans the source's figures over TP8 (0.25) to TP2 (0.60); the middle is the figure at the rollout's
    # TP (DECODE_MBU_AT_TP, decode_mbu)
    "decode_mbu": Factor(0.25, 0.60, "model-bandwidth utilisation of a decode step measured with TensorRT-LLM at "
                         "batch 1–16: 60% at TP2 (H100, A100), 40% at TP4, 25% at TP8 (Databricks, 'LLM Inference "
                         "Performance Engineering: Best Practices', 2023-10, figures 2–3)"),
    "network": Factor(0.50, 0.90, "ASSUMED (no measurement read): the share of the NICs' line rate a bulk weight "
                      "transfer reaches"),
    "pcie": Factor(0.50, 0.80, "ASSUMED (no measurement read): the share of the PCIe x16 rate a pinned host-device "
                   "copy reaches"),
}


# The decode MBU the same source measured at each tensor-parallel size on one node (its figures 2–3: 60% at TP2,
# 40% at TP4, 25% at TP8): a whole decode step's time, so its all-reduces within the node are in the figure.
DECODE_MBU_AT_TP = {2: 0.60, 4: 0.40, 8: 0.25}


def decode_mbu(tp: int, band: Factor) -> float:
    """The middle decode MBU of a rollout replica of TP `tp`: the source's figure at that TP, log-linear between its
    points; TP1 (not measured) at TP2's figure; past TP8 at TP8's, with the whole TP group's all-reduces counted
    on top (decode_step_s: their within-node share is then counted twice, a pessimistic bias). Kept inside the
    factor's band."""
    pts = sorted(DECODE_MBU_AT_TP.items())
    if tp <= pts[0][0]:
        v = pts[0][1]
    elif tp >= pts[-1][0]:
        v = pts[-1][1]
    else:
        (t0, m0), (t1, m1) = next((a, b) for a, b in zip(pts, pts[1:]) if a[0] <= tp <= b[0])
        v = m0 * (m1 / m0) ** ((math.log2(tp) - math.log2(t0)) / (math.log2(t1) - math.log2(t0)))
    return min(max(v, band.low), band.high)


@dataclass(frozen=True)
class Rate:
    low: float          # bytes/s, the pessimistic rate (the high time)
    high: float         # bytes/s, the optimistic one
    source: str


# The refit path of both frameworks this project drives hands every rank each weight in FULL: verl's Megatron
# per_tensor_generator (verl/utils/megatron_utils.py: PP broadcast, EP and TP all-gathers, every rank yields the
# whole tensor) and NeMo RL's Megatron-Bridge export (stream_weights_megatron_to_hf, NVIDIA-NeMo/Megatron-Bridge
# 8aa287df: the same gathers, every rank yielding the full tensor), then the rollout engine loads the full tensor
# and keeps its shard. So a refit moves the whole bf16
# model through every rank, tensor by tensor; its rate is measured, not a link's line rate.
REFIT_RATE = Rate(36e9, 96e9, "bf16 bytes of the whole model per second through a refit, measured by NeMo RL on "
                  "DGX H100 with the same full-tensor export feeding an NCCL broadcast (NVIDIA-NeMo/RL pull 1379, "
                  "2025-10: Qwen3-235B-A22B 470 GB in 13 s = 36 GB/s before overlapping export and broadcast, "
                  "DeepSeek-V3 1.34 TB in 14 s = 96 GB/s after); taken as is for every part (ASSUMED beyond H100)")
# the mean prompt and response as a share of their maxima when nothing better is known (a calibration replaces it)
MEAN_FRACTION = 0.5
# a calibrated bound: the recorded runs' ratios, widened by this much each way (step-to-step variation)
CALIBRATED_SPREAD = (0.9, 1.1)
# vLLM's concurrent sequences per engine (verl's rollout.max_num_seqs default)
MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class Workload:
    """What the plan knows, as numbers (vrun/planning/steptime_plan.py builds it from a plan)."""
    world: int
    gpus_per_node: int
    active_params: float            # N: active per token (training and decode FLOPs)
    samples: int                    # sequences trained per step (train_batch_size · n; SFT: train_batch_size)
    prompt_mean: float
    response_mean: float            # SFT: 0 (prompt_mean carries the whole sequence)
    response_max: float
    pp: int = 1
    vpp: int = 1
    micro_batches: int = 1          # per mini-batch per DP rank (the bubble's m)
    recompute: bool = False
    reference: bool = False         # a KL term: the reference policy's log-prob pass
    rollout: bool = True            # RL (False: SFT)
    rollout_tp: int = 1
    rollout_dp: int = 1
    rollout_dense: float = 0.0      # parameters vLLM loads: dense, routed experts
    rollout_routed: float = 0.0
    experts: int = 0                # E routed experts per layer, k per token
    top_k: int = 0
    rollout_weight_bytes: float = 2.0
    attn_flops_per_key: float = 0.0 # forward FLOPs per token per attended key, all layers (attention_flops_per_key)
    attn_keys_cap: Optional[int] = None  # sparse attention: keys a query attends at most (index_topk)
    kv_per_token: float = 0.0       # bytes per token per GPU (vrun/estimate/rollout.py)
    kv_per_sequence: float = 0.0
    kv_fits: Optional[int] = None   # sequences per replica the KV cache holds at once
    max_num_seqs: int = MAX_NUM_SEQS
    layers: int = 0                 # decoder layers and hidden size: the TP all-reduces (0: none counted)
    hidden: int = 0
    moe_layers: int = 0             # layers with routed experts: training's EP all-to-alls
    tp: int = 1                     # the training mesh (PP above): TP, CP, EP, ETP
    cp: int = 1
    ep: int = 1
    etp: int = 1
    param_bytes: float = 0.0        # per GPU, the busiest stage (vrun/estimate/memory.py's estimate): weights, grads, optim
    grad_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    param_offload: bool = False
    optimizer_offload: bool = False
    mean_source: str = f"mean prompt and response = {MEAN_FRACTION:g} × their maxima (assumed)"

    @property
    def tokens(self) -> float:
        return self.samples * (self.prompt_mean + self.response_mean)

    def attention_flops(self) -> float:
        """Forward attention FLOPs of the step's tokens: causal, each token attends half its sequence on average."""
        keys = (self.prompt_mean + self.response_mean) / 2
        if self.attn_keys_cap:
            keys = min(keys, self.attn_keys_cap)
        return self.tokens * keys * self.attn_flops_per_key

    @property
    def nodes(self) -> int:
        return max(1, -(-self.world // self.gpus_per_node))


@dataclass(frozen=True)
class Phase:
    low: float
    high: float
    note: str = ""
    mid: Optional[float] = None     # the middle efficiencies (geometric); None: the geometric mean of the bound

    @property
    def middle(self) -> float:
        return self.mid if self.mid is not None else math.sqrt(self.low * self.high)

    def summary(self) -> dict:
        return {"low_s": round(self.low, 2), "high_s": round(self.high, 2), "middle_s": round(self.middle, 2),
                **({"note": self.note} if self.note else {})}


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
        """Every phase at the middle efficiencies, the step waiting for its longest response: the rollout's last
        wave decodes max_response_length steps with its whole batch (every sequence of that wave taken to run that
        long, a pessimistic tail). The figure held to published step times."""
        return sum(p.middle for p in self.phases.values()) * self.scale

    def phase(self, name: str) -> Phase:
        p = self.phases.get(name, Phase(0.0, 0.0))
        return Phase(p.low * self.scale, p.high * self.scale, p.note, p.middle * self.scale)

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


def on_mesh(w: Workload, mesh, micro_batches: int, est=None) -> Workload:
    """The workload on another training mesh of the same GPUs (vrun.estimate.mesh.Mesh): its parallel sizes,
    micro-batches per DP rank and, from the memory estimate (vrun.estimate.memory.Estimate, or None), the per-GPU
    bytes offload moves."""
    from dataclasses import replace

    return replace(w, world=mesh.world, pp=mesh.pp, vpp=mesh.vpp, tp=mesh.tp, cp=mesh.cp, ep=mesh.ep, etp=mesh.etp,
                   micro_batches=micro_batches,
                   param_bytes=est.weights if est is not None else 0.0,
                   grad_bytes=est.grads if est is not None else 0.0,
                   optimizer_bytes=est.optimizer if est is not None else 0.0)


def calibrated(st: StepTime, ratios: list, how: str) -> StepTime:
    """The estimate scaled by the median measured/predicted ratio of recorded runs, its bound spanning them."""
    rs = sorted(ratios)
    mid = rs[len(rs) // 2] if len(rs) % 2 else (rs[len(rs) // 2 - 1] + rs[len(rs) // 2]) / 2
    return StepTime(st.phases, st.rollout_at_mean, st.rollout_at_max, st.assumptions, st.factors, mid, how,
                    tuple(rs))


def _bubble(w: Workload) -> float:
    return (w.pp - 1) / (max(w.micro_batches, 1) * max(w.vpp, 1)) if w.pp > 1 else 0.0


def compute_s(flops: float, w: Workload, part: Part, mfu: float) -> float:
    return flops / (w.world * part.bf16_flops * mfu)


def allreduce_s(ranks: int, gpus_per_node: int, nbytes: float, part: Part, net: float) -> float:
    """One all-reduce of nbytes over `ranks` GPUs (filling nodes of gpus_per_node): NCCL's latency model (the least
    of Ring and Tree, LL protocol; vrun.estimate.hardware.NCCL_LATENCY_US) plus the bytes a ring moves per GPU,
    2(n−1)/n·S, over NVLink within a node or the node's network across nodes, at efficiency `net`."""
    if ranks <= 1:
        return 0.0
    lat = hardware.NCCL_LATENCY_US
    nodes = max(1, -(-ranks // gpus_per_node))
    ppn = ranks // nodes
    steps = 2 * (ranks - 1)
    if nodes == 1:
        ring = lat["base_ring_ll"] + steps * lat["nvlink_ring_ll"]
        tree = lat["base_tree_ll"] + 2 * (ppn - 1) * lat["nvlink_tree_ll"]
        bw = part.nvlink
    else:
        inter = 2 * nodes
        ring = lat["base_ring_ll"] + (steps - inter) * max(lat["nvlink_ring_ll"], lat["net_overhead"]) + \
            inter * lat["net_ring_ll"]
        tree = lat["base_tree_ll"] + 2 * ((ppn - 1) * lat["nvlink_tree_ll"] + (nodes.bit_length() - 1) * lat["net_tree_ll"])
        bw = part.network
    return min(ring, tree) * 1e-6 + 2 * (ranks - 1) / ranks * nbytes / (bw * net)


def tp_collectives_s(w: Workload, part: Part, per_rank: float, net: float) -> float:
    """A decode step's tensor-parallel all-reduces: two per decoder layer (after the attention output projection and
    after the MLP/MoE down projection: Shoeybi et al. 2019, arXiv:1909.08053 §3), each of the step's bf16
    activations (per_rank tokens × hidden × 2 bytes) over the replica's TP group."""
    if w.rollout_tp <= 1 or not w.layers or not w.hidden:
        return 0.0
    return 2 * w.layers * allreduce_s(w.rollout_tp, w.gpus_per_node, per_rank * w.hidden * 2.0, part, net)


def decode_step_s(w: Workload, part: Part, concurrent: int, context: float, mbu: float, mfu: float,
                  net: Optional[float] = None) -> float:
    """One decode step of a replica with `concurrent` sequences at `context` tokens each: the roofline, then, for a
    replica wider than a node, its TP all-reduces (net: the network efficiency; None leaves them out). Within a
    node they are in the measured MBU (DECODE_MBU_AT_TP)."""
    tp, dp = w.rollout_tp, w.rollout_dp
    per_rank = concurrent / dp
    touched = 1.0 if not w.experts else 1 - (1 - w.top_k / w.experts) ** concurrent
    weights = (w.rollout_dense / tp + w.rollout_routed / (tp * dp) * touched) * w.rollout_weight_bytes
    kv = per_rank * (context * w.kv_per_token + w.kv_per_sequence)
    memory = (weights + kv) / (part.hbm * mbu)
    flops = 2 * w.active_params * per_rank / tp / (part.bf16_flops * mfu)
    wide = tp > w.gpus_per_node
    return max(memory, flops) + (tp_collectives_s(w, part, per_rank, net) if net is not None and wide else 0.0)


def rollout_s(w: Workload, part: Part, response: float, mbu: float, mfu: float, longest: bool,
              net: Optional[float] = None) -> float:
    replicas = max(w.world // (w.rollout_tp * w.rollout_dp), 1)
    share = -(-w.samples // replicas)
    cap = w.rollout_dp * w.max_num_seqs
    c = max(1, min(share, cap, w.kv_fits if w.kv_fits is not None and w.kv_fits > 0 else share))
    waves = -(-share // c)
    mean_step = decode_step_s(w, part, c, w.prompt_mean + w.response_mean / 2, mbu, mfu, net)
    if not longest:
        decode = waves * response * mean_step
    else:
        decode = (waves - 1) * w.response_mean * mean_step + \
            response * decode_step_s(w, part, c, w.prompt_mean + response / 2, mbu, mfu, net)
    prefill = compute_s(2 * w.active_params * w.samples * w.prompt_mean, w, part, mfu)
    return decode + prefill


def middle(f) -> float:
    """The geometric mean of a (pessimistic, optimistic) pair: a Factor or a Rate."""
    return math.sqrt(f.low * f.high)


def refit_bytes(w: Workload) -> float:
    """The bf16 bytes of the whole model: what every rank materialises in a refit (REFIT_RATE)."""
    return (w.rollout_dense + w.rollout_routed) * 2.0


def sync_s(w: Workload, part: Part, net: float, rate: float) -> float:
    """The weight refit before the rollout: the longer of (1) the whole bf16 model through every rank at the
    refit path's measured rate (REFIT_RATE: the training side gathers each tensor in full on every rank and the
    rollout engine loads the full tensor, keeping its shard) and (2) the floor of an ideal reshard, the rollout
    rank's own bf16 shard from other nodes over the node's network (a share 1 − 1/nodes of it) and within the node
    over NVLink, at efficiency `net`."""
    per_gpu = (w.rollout_dense / w.rollout_tp + w.rollout_routed / (w.rollout_tp * w.rollout_dp)) * 2.0
    gpn = min(w.gpus_per_node, w.world)
    floor = max(per_gpu * gpn * (1 - 1 / w.nodes) / (part.network * net), per_gpu / (part.nvlink * net))
    return max(refit_bytes(w) / rate, floor)


def attention_flops_per_key(arch: dict) -> tuple[float, Optional[int]]:
    """Forward FLOPs per token per attended key over the layers with softmax attention: QK^T and AV, 2·H·(d_qk + d_v)
    per layer (Narayanan et al. 2021's attention term); the sparse families attend at most index_topk keys."""
    a, fam = arch, arch.get("attention") or "gqa"
    H = a.get("heads") or 0
    if fam in ("mla", "mla_dsa"):
        d = (a.get("qk_nope_head_dim") or 0) + (a.get("qk_rope_head_dim") or 0) + (a.get("v_head_dim") or 0)
    else:
        hd = a.get("head_dim") or (a["hidden"] // H if H else 0)
        d = 2 * hd
    layers = a.get("layers") or 0
    if fam == "gdn_hybrid" and a.get("full_attention_interval"):
        layers //= a["full_attention_interval"]
    cap = a.get("index_topk") if fam in ("mla_dsa", "csa") else None
    return 2.0 * H * d * layers, cap


def training_collectives_s(w: Workload, part: Part, passes: float, net: float, mesh=None) -> float:
    """Per GPU, the training mesh's collectives over `passes` forward-equivalent passes of the step's tokens (a
    training step: forward + backward = 2, 3 with full recompute; a log-prob pass: 1), bandwidth only (at these
    message sizes, MBs per call, the latency is small): per pass and decoder layer of the stage two TP all-reduces
    of its tokens' bf16 activations, 2(TP−1)/TP of them per GPU over NVLink (Shoeybi et al. 2019, arXiv:1909.08053
    §3: two in the forward, their conjugates in the backward); per pass and MoE layer of the stage an EP dispatch
    and combine all-to-all of its tokens' top-k bf16 activations, the share on other EP ranks, over NVLink within a
    node and the node's network (its per-GPU share) across nodes (Lepikhin et al. 2020, GShard, arXiv:2006.16668:
    two all-to-alls per MoE layer forward, two backward). Tokens per GPU: the step's / (DP·CP), over TP again for
    the dispatch (sequence parallelism). Not counted: the DP gradient reduction, CP's KV exchange, ETP's
    reductions, PP's sends. mesh: the training mesh's sizes (tp, cp, ep, etp, pp; default: the workload's)."""
    m = mesh if mesh is not None else w
    tp, cp, ep, pp, etp = m.tp, m.cp, m.ep, m.pp, m.etp
    if (tp <= 1 and ep <= 1) or not w.hidden:
        return 0.0
    dp = max(w.world // (pp * tp * cp), 1)
    tokens = w.tokens / (dp * cp)
    out = 0.0
    if tp > 1 and w.layers:
        bw = part.nvlink if tp <= w.gpus_per_node else part.network / w.gpus_per_node
        out += 2 * w.layers / pp * 2 * (tp - 1) / tp * tokens * w.hidden * 2.0 / (bw * net)
    if ep > 1 and w.moe_layers and w.top_k:
        moved = tokens / tp * w.top_k * w.hidden * 2.0 * (1 - 1 / ep)
        per_node = min(ep, max(w.gpus_per_node // max(etp, 1), 1))
        remote = 1 - per_node / ep
        t = max(moved * (1 - remote) / part.nvlink, moved * remote / (part.network / w.gpus_per_node))
        out += 2 * w.moe_layers / pp * t / net
    return out * passes


def estimate(w: Workload, part: Part, factors: Optional[dict] = None, same_rollout: Optional[StepTime] = None,
             collectives: bool = True) -> StepTime:
    """The step time of w on part. same_rollout: an estimate of the same workload on another training mesh of the
    same GPUs (on_mesh): its rollout and sync phases, which do not depend on the training mesh, are taken as they
    are (mesh=auto times many meshes). collectives=False leaves the training mesh's collectives out (for
    with_collectives to add per mesh)."""
    f = factors or FACTORS
    mfu, mbu, net, pcie = f["train_mfu"], f["decode_mbu"], f["network"], f["pcie"]
    phases: dict = {}
    at_mean = at_max = None
    bubble = 1 + _bubble(w)
    attn = w.attention_flops()

    def compute(flops: float, note: str, passes: float) -> Phase:
        """Compute and the training mesh's collectives, × the pipeline bubble."""
        def t(e_mfu: float, e_net: float) -> float:
            comm = training_collectives_s(w, part, passes, e_net) if collectives else 0.0
            return (compute_s(flops, w, part, e_mfu) + comm) * bubble
        return Phase(t(mfu.high, net.high), t(mfu.low, net.low), note, t(middle(mfu), middle(net)))

    if w.rollout and same_rollout is not None:
        at_mean, at_max = same_rollout.rollout_at_mean, same_rollout.rollout_at_max
        phases["rollout"] = same_rollout.phases["rollout"]
        passes = 2 if w.reference else 1
        phases["log_prob"] = compute((2 * w.active_params * w.tokens + attn) * passes,
                                     "old policy" + (" + reference" if w.reference else ""), passes)
    elif w.rollout:
        at_tp = decode_mbu(w.rollout_tp, mbu)
        at_mean = Phase(rollout_s(w, part, w.response_mean, mbu.high, mfu.high, False, net.high),
                        rollout_s(w, part, w.response_mean, mbu.low, mfu.low, False, net.low), "",
                        rollout_s(w, part, w.response_mean, at_tp, middle(mfu), False, middle(net)))
        at_max = Phase(rollout_s(w, part, w.response_max, mbu.high, mfu.high, True, net.high),
                       rollout_s(w, part, w.response_max, mbu.low, mfu.low, True, net.low), "",
                       rollout_s(w, part, w.response_max, at_tp, middle(mfu), True, middle(net)))
        phases["rollout"] = Phase(at_mean.low, at_max.high, "low: every response at the mean length; high: the "
                                  "step waits for one at max_response_length", at_max.middle)
        passes = 2 if w.reference else 1
        phases["log_prob"] = compute((2 * w.active_params * w.tokens + attn) * passes,
                                     "old policy" + (" + reference" if w.reference else ""), passes)
    k = 8 if w.recompute else 6
    phases["train"] = compute(k * w.active_params * w.tokens + k / 2 * attn,
                              f"{k}·N·T + attention + TP/EP collectives, pipeline bubble ×{bubble:.2f}", k / 2)
    if w.rollout and same_rollout is not None:
        phases["sync"] = same_rollout.phases["sync"]
    elif w.rollout:
        r = REFIT_RATE
        phases["sync"] = Phase(sync_s(w, part, net.high, r.high), sync_s(w, part, net.low, r.low),
                               f"every rank handles the whole bf16 model ({refit_bytes(w) / 1e9:.0f} GB) at "
                               f"{r.low / 1e9:.0f}–{r.high / 1e9:.0f} GB/s (the frameworks' per-tensor refit)",
                               sync_s(w, part, middle(net), middle(r)))
    moved = (2 * (w.param_bytes + w.grad_bytes) if w.param_offload else 0.0) + \
        (2 * w.optimizer_bytes if w.optimizer_offload else 0.0)
    if moved:
        phases["offload"] = Phase(moved / (part.pcie * pcie.high), moved / (part.pcie * pcie.low),
                                  f"{moved / 2 ** 30:.0f} GiB per GPU over PCIe", moved / (part.pcie * middle(pcie)))
    assumptions = (
        "ESTIMATE: roofline per phase with the efficiencies listed (low time = the optimistic efficiency; the "
        "middle = their geometric mean, the decode MBU measured at the rollout's TP, the last wave decoding to "
        "max_response_length)",
        w.mean_source,
        "decode: a replica's TP all-reduces within a node in its measured MBU; a replica wider than a node adds "
        "its whole TP group's by NCCL's latency model + bytes; training and log-prob: TP all-reduce "
        "and EP all-to-all bytes; refit: the whole bf16 model through every rank at the measured refit rate; "
        "not modelled: reward, DP and MoE load imbalance, the DP gradient reduction, CP "
        "and PP traffic, kernel-launch overheads, start-up, checkpoint saves",
    )
    return StepTime(phases=phases, rollout_at_mean=at_mean, rollout_at_max=at_max, assumptions=assumptions,
                    factors={**f, **({"refit_rate": REFIT_RATE} if "sync" in phases else {})})


def with_collectives(st: StepTime, w: Workload, part: Part, mesh, factors: Optional[dict] = None) -> StepTime:
    """An estimate made with collectives=False, with the collectives of the training mesh `mesh` (its tp, cp, ep,
    etp, pp) added to its log-prob and training phases: the same figures estimate() gives on that mesh, without
    building the workload again (mesh=auto times thousands of meshes). w: the workload st was made from."""
    net = (factors or FACTORS)["network"]
    bubble = 1 + _bubble(w)
    phases = dict(st.phases)
    for name, passes in (("log_prob", 2 if w.reference else 1), ("train", (8 if w.recompute else 6) / 2)):
        p = phases.get(name)
        if p is None:
            continue
        c = [training_collectives_s(w, part, passes, e, mesh) * bubble for e in (net.high, net.low, middle(net))]
        if c[1]:
            phases[name] = Phase(p.low + c[0], p.high + c[1], p.note, p.middle + c[2])
    return StepTime(phases, st.rollout_at_mean, st.rollout_at_max, st.assumptions, st.factors, st.scale,
                    st.calibration, st.ratios)


def gpu_hours(st: StepTime, steps: float, gpus: int) -> tuple[float, float]:
    """(low, high) GPU-hours for `steps` steps on `gpus` GPUs."""
    return st.low * steps * gpus / 3600, st.high * steps * gpus / 3600

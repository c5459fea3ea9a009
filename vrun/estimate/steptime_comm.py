"""The step's collectives, bandwidth and latency: which GPUs talk over NVLink (a node, or a whole NVL72 rack) and
which groups straddle two NVLink domains, one all-reduce by NCCL's latency model and the ring's bytes, a decode
step's tensor-parallel all-reduces, the training mesh's TP all-reduces and EP all-to-alls, and the distributed
optimizer's data-parallel traffic. Pure arithmetic; vrun.estimate.steptime adds them to its phases."""
from __future__ import annotations

import functools
from typing import Optional

from vrun.estimate import hardware
from vrun.estimate.hardware import Part
from vrun.estimate.steptime_work import Workload


def nvlink_span(gpus_per_node: int, part: Part) -> int:
    """How many consecutive GPUs talk over NVLink: the part's NVLink domain where it spans more GPUs than one of its
    nodes (GB200/GB300 NVL72: 72 GPUs, 4 per compute tray), else the mesh's node. A job fills one domain after
    another; which of a training mesh's groups then straddle two domains: in_domain."""
    return part.nvlink_domain if part.nvlink_domain > part.gpus_per_node else gpus_per_node


def allreduce_s(ranks: int, gpus_per_node: int, nbytes: float, part: Part, net: float) -> float:
    """One all-reduce of nbytes over `ranks` GPUs (filling NVLink domains of gpus_per_node GPUs): NCCL's latency
    model (the least of Ring and Tree, LL protocol; vrun.estimate.hardware.NCCL_LATENCY_US) plus the bytes a ring
    moves per GPU, 2(n−1)/n·S, over NVLink within a domain or the node's network across domains, at efficiency
    `net`."""
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


def tp_collectives_s(w: Workload, part: Part, per_rank: float, net: float, ranks: Optional[int] = None) -> float:
    """A decode step's tensor-parallel all-reduces: two per decoder layer (after the attention output projection and
    after the MLP/MoE down projection: Shoeybi et al. 2019, arXiv:1909.08053 §3), each of the step's bf16
    activations (per_rank tokens × hidden × 2 bytes) over the replica's TP group (ranks: over that many GPUs)."""
    n = w.rollout_tp if ranks is None else ranks
    if n <= 1 or not w.layers or not w.hidden:
        return 0.0
    return 2 * w.layers * allreduce_s(n, nvlink_span(w.gpus_per_node, part), per_rank * w.hidden * 2.0, part, net)


@functools.lru_cache(maxsize=1024)
def in_domain(world: int, span: int, members: int, stride: int) -> int:
    """The fewest ranks of one group that share an NVLink domain with any of its members: groups of `members` ranks
    `stride` apart, in blocks of members·stride consecutive ranks (megatron-core's rank order, TP innermost, PP
    outermost), the job's ranks filling one domain of `span` GPUs after another. Where the domain is a multiple
    of the block, every group lies inside one domain (or splits evenly over whole domains); where it is not — an
    NVL72 rack's 72 GPUs and EP16 or EP32 blocks — the block that meets the rack's edge straddles two domains, and
    a collective waits for its ranks with the fewest peers on NVLink."""
    block = members * stride
    if members <= 1 or world <= span or span % block == 0:
        return members
    if block % span == 0:  # each block over whole domains, stride dividing them evenly
        return max(1, members * span // block) if span % stride == 0 else _fewest(world, span, members, stride)
    return _fewest(world, span, members, stride)


def _fewest(world: int, span: int, members: int, stride: int) -> int:
    """in_domain counted group by group."""
    block = members * stride
    fewest = members
    for start in range(0, max(world, block), block):
        for t in range(stride):
            ranks = [start + t + stride * i for i in range(members)]
            counts: dict = {}
            for r in ranks:
                counts[r // span] = counts.get(r // span, 0) + 1
            fewest = min(fewest, min(counts.values()))
    return fewest


def training_collectives_s(w: Workload, part: Part, passes: float, net: float, mesh=None) -> float:
    """Per GPU, the training mesh's collectives over `passes` forward-equivalent passes of the step's tokens (a
    training step: forward + backward = 2, 3 with full recompute; a log-prob pass: 1), bandwidth only (at these
    message sizes, MBs per call, the latency is small): per pass and decoder layer of the stage two TP all-reduces
    of its tokens' bf16 activations, 2(TP−1)/TP of them per GPU over NVLink (Shoeybi et al. 2019, arXiv:1909.08053
    §3: two in the forward, their conjugates in the backward); per pass and MoE layer of the stage an EP dispatch
    and combine all-to-all of its tokens' top-k bf16 activations, the share on other EP ranks, over NVLink within the
    NVLink domain (nvlink_span; the ranks of the worst-placed group, in_domain) and the node's network (its per-GPU
    share) beyond it (Lepikhin et al. 2020, GShard, arXiv:2006.16668: two all-to-alls per MoE layer forward, two
    backward). Tokens per GPU: the step's / (DP·CP), over TP again for the dispatch (sequence parallelism). Not counted
    here: the DP gradient reduction (gradient_sync_s), CP's KV exchange, ETP's reductions, PP's sends. mesh: the
    training mesh's sizes (tp, cp, ep, etp, pp; default: the workload's)."""
    m = mesh if mesh is not None else w
    tp, cp, ep, pp, etp = m.tp, m.cp, m.ep, m.pp, m.etp
    if (tp <= 1 and ep <= 1) or not w.hidden:
        return 0.0
    span = nvlink_span(w.gpus_per_node, part)
    dp = max(w.world // (pp * tp * cp), 1)
    tokens = w.tokens / (dp * cp)
    out = 0.0
    if tp > 1 and w.layers:
        bw = part.nvlink if tp <= span else part.network / w.gpus_per_node
        out += 2 * w.layers / pp * 2 * (tp - 1) / tp * tokens * w.hidden * 2.0 / (bw * net)
    if ep > 1 and w.moe_layers and w.top_k:
        moved = tokens / tp * w.top_k * w.hidden * 2.0 * (1 - 1 / ep)
        per_domain = in_domain(w.world, span, ep, max(etp, 1))
        remote = 1 - per_domain / ep
        t = max(moved * (1 - remote) / part.nvlink, moved * remote / (part.network / w.gpus_per_node))
        out += 2 * w.moe_layers / pp * t / net
    return out * passes


def gradient_sync_s(w: Workload, part: Part, net: float, mesh=None) -> float:
    """Per GPU, the distributed optimizer's data-parallel traffic, once per optimizer step (w.mini_batches per
    step): the gradients' reduce-scatter (grad_reduce_bytes each) and the updated bf16 parameters' all-gather, each
    (n−1)/n of the rank's parameters for a group of n (a ring), the dense ones over DP·CP, the routed experts over
    the expert DP (megatron-core's DistributedOptimizer; Rajbhandari et al. 2020, ZeRO, arXiv:1910.02054). Over
    NVLink when the group's ranks (strided by TP, or by EP·ETP) sit in one NVLink domain, else over the node's
    network, its per-GPU share. An FSDP2 run gathers per micro-batch: this counts its least."""
    m = mesh if mesh is not None else w
    tp, cp, ep, pp, etp = m.tp, m.cp, m.ep, m.pp, m.etp
    span = nvlink_span(w.gpus_per_node, part)

    def ring(params: float, group: int, stride: int) -> float:
        if group <= 1 or params <= 0:
            return 0.0
        bw = part.nvlink if in_domain(w.world, span, group, stride) == group else part.network / w.gpus_per_node
        return (group - 1) / group * params * (w.grad_reduce_bytes + 2.0) / (bw * net)

    dp = max(w.world // (pp * tp * cp), 1)
    edp = max(w.world // (pp * ep * etp), 1)
    if w.moe:
        dense, routed = w.rollout_dense / (tp * pp), w.rollout_routed / (ep * etp * pp)
    else:  # one "expert" taken by every token is the dense MLP: TP-split, reduced over data parallel
        dense, routed = (w.rollout_dense + w.rollout_routed) / (tp * pp), 0.0
    return w.mini_batches * (ring(dense, dp * cp, tp) + ring(routed, edp, ep * etp))

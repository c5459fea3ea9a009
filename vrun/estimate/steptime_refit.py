"""The weight sync and the offload: the refit's costs (the whole bf16 model through every rank at the measured
refit rate, never less than an ideal reshard; a cost per tensor; the engine's wake-up and, at vLLM's level-1 sleep,
its weights back over PCIe), what the colocated refit moves between the GPU and the host, and the offload outside
it, each at the host factor's ends. Pure arithmetic."""
from __future__ import annotations

from vrun.estimate.hardware import Part
from vrun.estimate.steptime_comm import nvlink_span
from vrun.estimate.steptime_factors import ENGINE_WAKE_S, REFIT_RATE, REFIT_TENSOR_S, Factor, middle
from vrun.estimate.steptime_work import Phase, Workload, plus


def refit_bytes(w: Workload) -> float:
    """The bf16 bytes of the whole model: what every rank materialises in a refit (REFIT_RATE)."""
    return (w.rollout_dense + w.rollout_routed) * 2.0


def rollout_shard_bytes(w: Workload) -> float:
    """The rollout engine's weights per GPU, in the format it loads."""
    return (w.rollout_dense / w.rollout_tp + w.rollout_routed / (w.rollout_tp * w.rollout_dp)) * w.rollout_weight_bytes


def sync_s(w: Workload, part: Part, net: float, rate: float) -> float:
    """The refit's transfer: the longer of (1) the whole bf16 model through every rank at the refit path's measured
    rate (REFIT_RATE: the training side gathers each tensor in full on every rank and the rollout engine loads the
    full tensor, keeping its shard) and (2) the floor of an ideal reshard, the rollout rank's own bf16 shard from
    other NVLink domains over the node's network (a share 1 − 1/domains of it) and within the domain over NVLink,
    at efficiency `net`."""
    per_gpu = (w.rollout_dense / w.rollout_tp + w.rollout_routed / (w.rollout_tp * w.rollout_dp)) * 2.0
    span = nvlink_span(w.gpus_per_node, part)
    gpn = min(w.gpus_per_node, w.world)
    domains = max(1, -(-w.world // span))
    floor = max(per_gpu * gpn * (1 - 1 / domains) / (part.network * net), per_gpu / (part.nvlink * net))
    return max(refit_bytes(w) / rate, floor)


def refit_parts(w: Workload, part: Part, f: dict) -> dict:
    """The refit's costs, each a Phase (pessimistic, optimistic, middle): the transfer (sync_s), the cost per tensor
    handed over (REFIT_TENSOR_S × w.tensors), the engine's wake-up (ENGINE_WAKE_S) and, for an engine that slept at
    level 1, its weights copied back from pinned host memory over PCIe. The optimistic end runs the per-tensor
    export beside the transfer, only its excess over the transfer on top: REFIT_RATE's optimistic figure is the
    refit measured after NeMo RL overlapped the export with the broadcast (its pessimistic figure before, the two
    one after the other: summed at the pessimistic end and the middle). Summed at the optimistic end too, DeepSeek-V3's
    refit would take 14 s + 4.5 s, above the 14 s the source measured for it."""
    net, pcie, r, per, wake = f["network"], f["pcie"], REFIT_RATE, REFIT_TENSOR_S, ENGINE_WAKE_S
    best = sync_s(w, part, net.high, r.high)
    out = {"transfer": Phase(best, sync_s(w, part, net.low, r.low), "", sync_s(w, part, middle(net), middle(r))),
           "tensors": Phase(max(0.0, w.tensors * per.high - best), w.tensors * per.low, "", w.tensors * middle(per)),
           "wake": Phase(wake.high, wake.low, "", middle(wake))}
    if w.engine_sleep_level == 1:
        b = rollout_shard_bytes(w) / part.pcie
        out["restore"] = Phase(b / pcie.high, b / pcie.low, "", b / middle(pcie))
    return {n: on_host(p, f) for n, p in out.items()}


def on_host(p: Phase, f: dict) -> Phase:
    """A host-bound cost (the refit, PCIe copies) at the host factor's ends: its optimistic end as the rates' sources
    measured, its pessimistic end on a slower cluster (FACTORS host)."""
    h = f["host"]
    return Phase(p.low / h.high, p.high / h.low, p.note, p.middle / middle(h), p.parts)


def host_copies(w: Workload, part: Part, f: dict) -> tuple[Phase, Phase]:
    """(the training weights, the optimizer states) one way over PCIe per GPU, each a Phase at the host factor's
    ends: the weights (param_offload) at the pinned rate, the optimizer states (optimizer_offload) at the pageable
    rate (pinned × PAGEABLE); zero where not offloaded. Gradients are freed, not copied."""
    pcie, pageable = f["pcie"], f["pageable"]
    params = w.param_bytes if w.param_offload else 0.0
    optim = w.optimizer_bytes if w.optimizer_offload else 0.0

    def way(nbytes: float, page: Factor) -> Phase:
        return on_host(Phase(nbytes / (part.pcie * pcie.high * page.high), nbytes / (part.pcie * pcie.low * page.low),
                             "", nbytes / (part.pcie * middle(pcie) * middle(page))), f)

    flat = Factor(1.0, 1.0, "")
    return way(params, flat), way(optim, pageable)


def reference_swap_s(w: Workload, part: Part, f: dict) -> Phase:
    """The reference log-prob pass of NeMo RL's Megatron worker, which holds one model on the GPU and the reference's
    weights in host memory: per step the policy's weights go to the host, the reference's come in, and after the
    pass the policy's go back (nemo_rl/models/policy/megatron_policy_worker.py use_reference_model @ v0.3.0 b1c86a81,
    workers/megatron_policy_worker.py @ v0.6.0 5fb58893: state_dict tensors .to("cpu", non_blocking=True,
    copy=True), the reference's made the same way, then load_state_dict): three copies of the per-GPU weights over
    PCIe, to and from pinned memory (PyTorch's _to_copy pins the host tensor of a non-blocking copy from the GPU,
    aten/src/ATen/native/TensorConversions.cpp pin_out), at the pinned rate and the host factor's ends. Zero without
    the swap or without a reference pass."""
    if not (w.reference_swap and w.reference and w.param_bytes > 0):
        return Phase(0.0, 0.0)
    pcie, nbytes = f["pcie"], 3 * w.param_bytes
    return on_host(Phase(nbytes / (part.pcie * pcie.high), nbytes / (part.pcie * pcie.low), "",
                         nbytes / (part.pcie * middle(pcie))), f)


def refit_host_parts(w: Workload, part: Part, f: dict) -> dict:
    """What the colocated refit itself moves between the GPU and the host beside the weights it hands the engine
    (REFIT_HOST, w.refit_host): verl's ("weights") brings the offloaded training weights to the GPU for the export
    and sends them back after it; NeMo RL's ("state") sends the optimizer states and then the training weights to
    the host. Each a Phase; those of zero bytes left out by summed()."""
    weights, optim = host_copies(w, part, f)
    if w.refit_host == "state":
        return {"optimizer_to_host": optim, "weights_to_host": weights}
    return {"weights_to_gpu": weights, "weights_to_host": weights}


def offload_parts(w: Workload, part: Part, f: dict) -> dict:
    """The offload outside the refit, per GPU over PCIe (host_copies): under verl's refit ("weights") the weights and
    optimizer states to the host after the update and back before it; under NeMo RL's ("state"), whose refit sends
    both to the host (refit_host_parts), their way back alone."""
    weights, optim = host_copies(w, part, f)
    way = plus(weights, optim)
    if way.high <= 0:
        return {}
    return {"to_gpu": way} if w.refit_host == "state" else {"to_host": way, "to_gpu": way}

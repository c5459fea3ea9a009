"""Per-GPU memory estimate for the actor (and the colocated rollout engine), as pure arithmetic.

The model (README, "Memory estimate") — every figure is bytes per GPU on the busiest pipeline stage:
  layout       units [embedding, decoder layer × L, MTP layer × M, loss] split into PP contiguous chunks of
               near-equal count (earlier stages take the remainder); the busiest stage is the largest sum.
  weights      bf16, 2 B/param: dense params / TP, routed-expert params / (EP·ETP)
  gradients    fp32 main grads, 4 B/param (Megatron keeps them in fp32)
  optimizer    Adam: fp32 master weights + two moments, 12 B/param, on GPU for (1 − offload_fraction)
  fsdp2        weights, gradients and optimizer states all sharded over the data-parallel group
               (dense over DP·CP, experts over EDP), plus one unsharded layer being computed
  dist_opt     weights and gradients replicated across data parallel; optimizer states sharded as above
  activations  T tokens per GPU (the per-GPU token budget), hidden h, top-k k, TP t (sequence parallel),
               residual streams m (DeepSeek-V4's mHC carries 4, others 1):
               full recompute: stored layer inputs L_stage·T·h·m·2/t B for PP in-flight micro-batches, plus
               one layer being recomputed, T·h·(34 + 4k)/t B; no recompute: PP·L_stage·T·h·(34 + 4k)/t B
  logits       last stage: T·vocab·4 B / t (fp32 logits for the loss; 2 B with cross_entropy_fusion)
  rollout      colocated vLLM takes gpu_memory_utilization of the GPU while the actor's residents stay:
               weights unless param_offload, gradients unless grad_offload (the plan passes param_offload: Megatron
               Lite offloads gradients with the parameters), optimizer unless optimizer_offload;
               what vLLM does inside its share (weights, KV cache, sequences): vrun/rollout.py
  peak         max(training step, rollout phase)
Assumptions: no activation offload, no sequence-length imbalance between DP ranks, MTP layers cost as a
decoder layer with experts, the optimizer keeps no extra buffers beyond the above.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

from vrun.mesh import Mesh

GIB = 1024 ** 3


@dataclass(frozen=True)
class Params:
    """Parameter counts per unit (logical parameters)."""
    embedding: int
    output: int
    dense_per_layer: tuple      # per decoder layer: attention, norms, router, shared experts, dense MLP
    expert_per_layer: tuple     # per decoder layer: routed experts
    mtp_dense: int = 0          # all MTP layers together
    mtp_expert: int = 0
    mtp_layers: int = 0
    source: str = "model group facts (approximate)"

    @property
    def total(self) -> int:
        return self.embedding + self.output + sum(self.dense_per_layer) + sum(self.expert_per_layer) + \
            self.mtp_dense + self.mtp_expert


def params_from_arch(arch: dict) -> tuple[Optional[Params], str]:
    """Counts from the architecture facts (vrun/params.py, every layer with all its parts); None with the
    reason when a needed fact is missing."""
    from vrun import params

    c, why = params.count(arch)
    if c is None:
        return None, why
    return params.to_memory_params(c, mtp=True, vision=False), ""


def stage_layout(pp: int, layers: int, mtp_layers: int) -> list[list]:
    """Units split into pp contiguous chunks: ('emb',), ('layer', i), ('mtp', j), ('loss',)."""
    units = [("emb",)] + [("layer", i) for i in range(layers)] + [("mtp", j) for j in range(mtp_layers)] + [("loss",)]
    base, extra = divmod(len(units), pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(units[start:start + n])
        start += n
    return out


@dataclass
class Estimate:
    stage: int
    layers_on_stage: int
    weights: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    train_peak: float
    rollout: float
    rollout_residents: float
    peak: float
    gpu_mem: float
    params_source: str
    breakdown: dict = field(default_factory=dict)
    rollout_detail: Optional[object] = None     # vrun.rollout.RolloutEstimate (RL runs)
    assumptions: str = ""

    @property
    def fits(self) -> bool:
        return self.peak <= self.gpu_mem

    def summary(self) -> dict:
        g = lambda b: round(b / GIB, 1)  # noqa: E731
        return {"stage": self.stage, "layers_on_stage": self.layers_on_stage, "weights_gib": g(self.weights),
                "grads_gib": g(self.grads), "optimizer_gib": g(self.optimizer),
                "activations_gib": g(self.activations), "logits_gib": g(self.logits),
                "train_peak_gib": g(self.train_peak), "rollout_gib": g(self.rollout),
                "rollout_residents_gib": g(self.rollout_residents), "peak_gib": g(self.peak),
                "gpu_mem_gib": g(self.gpu_mem), "fits": self.fits, "params": self.params_source,
                "rollout_phase": self.rollout_detail.summary() if self.rollout_detail is not None else None,
                "assumptions": self.assumptions}


@functools.lru_cache(maxsize=4096)
def _stages(p: Params, pp: int) -> tuple:
    """Per stage: (dense params, expert params, decoder+MTP layers, holds the loss, biggest layer (dense, expert))."""
    out = []
    for units in stage_layout(pp, len(p.dense_per_layer), p.mtp_layers):
        dense = expert = 0.0
        layers, loss, biggest = 0, False, (0.0, 0.0)
        for u in units:
            if u[0] == "emb":
                dense += p.embedding
            elif u[0] == "loss":
                dense += p.output
                loss = True
            else:
                if u[0] == "layer":
                    d, e = p.dense_per_layer[u[1]], p.expert_per_layer[u[1]]
                else:
                    d, e = p.mtp_dense / max(p.mtp_layers, 1), p.mtp_expert / max(p.mtp_layers, 1)
                dense, expert, layers = dense + d, expert + e, layers + 1
                biggest = max(biggest, (d, e), key=sum)
        out.append((dense, expert, layers, loss, biggest))
    return tuple(out)


def estimate(p: Params, mesh: Mesh, *, optimizer: str, hidden: int, vocab: int, top_k: int, tokens_per_gpu: int,
             recompute: bool, param_offload: bool, grad_offload: bool, optimizer_offload: bool,
             offload_fraction: float, gpu_mem_gib: float, rollout_fraction: float = 0.0,
             cross_entropy_fusion: bool = False, residual_streams: int = 1) -> Estimate:
    frac = 1.0 if optimizer_offload else min(max(offload_fraction or 0.0, 0.0), 1.0)
    dense_dp, edp, ept = mesh.dp * mesh.cp, mesh.edp, mesh.ep * mesh.etp
    T = tokens_per_gpu
    per_layer_act = T * hidden * (34 + 4 * top_k) / mesh.tp
    rollout = rollout_fraction * gpu_mem_gib * GIB
    best = None
    for s, (dense, expert, layers, loss, biggest) in enumerate(_stages(p, mesh.pp)):
        d_rank, e_rank = dense / mesh.tp, expert / ept
        sharded = d_rank / dense_dp + e_rank / edp
        if optimizer == "fsdp2":
            w = 2 * sharded + 2 * (biggest[0] / mesh.tp + biggest[1] / ept)
            gr = 4 * sharded
        else:
            w, gr = 2 * (d_rank + e_rank), 4 * (d_rank + e_rank)
        opt = 12 * sharded * (1 - frac)
        if not layers:
            act = 0.0
        elif recompute:
            act = mesh.pp * layers * T * hidden * residual_streams * 2 / mesh.tp + per_layer_act
        else:
            act = mesh.pp * layers * per_layer_act
        logits = T * vocab * (2 if cross_entropy_fusion else 4) / mesh.tp if loss else 0.0
        train = w + gr + opt + act + logits
        residents = (0 if param_offload else w) + (0 if grad_offload else gr) + (0 if optimizer_offload else opt)
        peak = max(train, rollout + residents)
        if best is None or peak > best[0]:
            best = (peak, s, layers, w, gr, opt, act, logits, train, residents)
    peak, s, layers, w, gr, opt, act, logits, train, residents = best
    return Estimate(stage=s, layers_on_stage=layers, weights=w, grads=gr, optimizer=opt, activations=act,
                    logits=logits, train_peak=train, rollout=rollout, rollout_residents=residents, peak=peak,
                    gpu_mem=gpu_mem_gib * GIB, params_source=p.source)


def stage_split(p: Params, mesh: Mesh) -> list[dict]:
    """Per pipeline stage: its parameters, and what one rank of it holds (dense / TP, experts / (EP·ETP))."""
    out = []
    for s, (dense, expert, layers, loss, _) in enumerate(_stages(p, mesh.pp)):
        out.append({"stage": s, "layers": layers, "dense": int(dense), "routed_expert": int(expert),
                    "per_rank": int(dense / mesh.tp + expert / (mesh.ep * mesh.etp)), "has_loss": loss})
    return out

"""Per-GPU memory estimate for the actor (and the colocated rollout engine), as pure arithmetic.

The model (README, "Memory estimate") — every figure is bytes per GPU on the busiest pipeline stage:
  layout       units [embedding, decoder layer × L, MTP layer × M, loss] split into PP contiguous chunks of
               near-equal count (earlier stages take the remainder); every stage is estimated (plan.json
               memory.stages) and the busiest — highest peak, then highest training peak, then the later — is shown
  per rank     dense params / TP, routed-expert params / (EP·ETP); "sharded" = dense / (DP·CP) + experts / EDP
  fsdp2        (Megatron Lite's default for the launchers) parameter shards and their grads in fp32, 4 B per
               sharded param (bf16, 2 B, for DeepSeek-V4: FSDP2_BF16_SHARDS); Adam (fp32 master + two moments,
               12 B per sharded param) wholly on the host when offload_fraction > 0, else on the GPU;
               transient at the step's peak (a layer's backward): two unsharded bf16 units (the one in backward and
               the one prefetched, 2·2 B per param of the biggest layer on the rank, its routed experts / (EP·ETP)
               included) and the root's embedding and output head unsharded in bf16 (2 B / TP), which stay from
               the forward to the end of the backward
  dist_opt     bf16 weights (2 B) and fp32 grads (4 B) replicated across data parallel; Adam 12 B per sharded
               param, offload_fraction of it on the host. Checked against the source, not built (megatron-core's
               DistributedOptimizer assumes CUDA): primitive/optimizers/megatron_wrap.py builds megatron-core's
               DDP with grad_reduce_in_fp32=True (an fp32 grad buffer for every local param), bf16=True and
               use_distributed_optimizer=True (fp32 main params and both moments sharded over DP), and passes
               offload_fraction as optimizer_offload_fraction
  activations  T tokens per rank (rank_tokens: a dynamic batch's per-GPU budget, or without one micro-batch ×
               sequence / CP, the CP group's micro-batch split over it), hidden h, TP t (sequence parallel), CP c,
               residual streams m (DeepSeek-V4's mHC carries 4, others 1); 1F1B keeps PP − s micro-batches in
               flight on stage s (0-based; measured by running Megatron Lite's own 1F1B schedule on a stage of PP 4,
               tests/test_activation_oracle.py); what a layer keeps for backward, per token of its own and per token
               of the CP-gathered sequence, and what its backward adds: vrun/estimate/activations.py.
               full recompute: the stored layer inputs (PP − s)·L_stage·T·h·m·2/t, and one layer recomputed and in
               its backward; no recompute: (PP − s)·L_stage·(what a layer keeps), and the last layer's backward
  logits       last stage: T·vocab·(2 + 4) B / t (the loss holds bf16 logits and an fp32 copy; 2 B with
               cross_entropy_fusion); the loss's backward ends (its logits freed) before the last layer's begins,
               so the step holds max(the layer in its backward, the logits) on top of the stored activations
  rollout      colocated vLLM takes gpu_memory_utilization of the GPU while the actor's residents stay:
               weights unless param_offload, gradients unless grad_offload (the plan passes param_offload: Megatron
               Lite offloads gradients with the parameters), optimizer unless optimizer_offload;
               what vLLM does inside its share (weights, KV cache, sequences): vrun/estimate/rollout.py
  peak         max(training step, rollout phase); training = params + grads + optimizer + activations + logits
               + transient
Checked against Megatron Lite's real model: tests/test_memory_oracle.py builds every stage of each model's
default mesh (meta parameters, fake process group, its FSDP2 wrapping and AdamW) and compares params, grads
and optimizer (GPU and host) per stage.
Assumptions: no activation offload, no sequence-length imbalance between DP ranks, MTP layers cost as a
decoder layer with experts, the optimizer keeps no extra buffers beyond the above.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from vrun.estimate import activations as acts
from vrun.estimate.mesh import Mesh
from vrun.core.units import GIB



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


# Megatron Lite's FSDP2 path (primitive/optimizers/fsdp2/optimizer.py, build_fsdp2_training_optimizer) promotes
# the sharded parameters to fp32 (_DEFAULT_USE_FP32_SHARDS = True) and FSDP2 hands each gradient back in its sharded
# parameter's dtype; model/deepseek_v4/lite/protocol.py passes use_fp32_shards=False: bf16 shards and grads there.
FSDP2_BF16_SHARDS = frozenset({"deepseek_v4"})
ADAM_BYTES = 12            # fp32 master copy + exp_avg + exp_avg_sq (fsdp2/adamw.py FP32AdamW; Megatron's dist_opt)


class Known(NamedTuple):
    """How a term of the estimate is known, and the band it gets (factors on the term: low, high)."""
    how: str
    factors: tuple
    source: str

    def summary(self) -> dict:
        return {"known": self.how, "band": list(self.factors), "source": self.source}


EXACT = Known("exact", (1.0, 1.0), "counted on Megatron Lite's real model built per stage "
              "(tests/test_memory_oracle.py: to the byte)")
READ = Known("read", (1.0, 1.1), "counted from megatron-core's source, not built (no CUDA here): its DDP buckets "
             "and the distributed optimizer's shards are padded, up to 10% assumed")
MEASURED = Known("measured", (0.8, 1.25), "within 20% of a training step of Megatron Lite's real model on fake "
                 "tensors, with and without its FSDP2 wrapping (tests/test_activation_oracle.py holds every measured "
                 "architecture to it)")
APPROXIMATED = Known("approximated", (0.5, 2.0), "a formula no measurement checks: a factor of two either way (the "
                     "activation formula this replaced was 0.36-1.06x of the measured step)")


VLLM_SHARE = Known("vLLM's share: gpu_memory_utilization × the GPU", (1.0, 1.0),
                   "vLLM takes its share of the GPU at start and stays inside it (its weights, KV cache and reserve: "
                   "vrun/estimate/rollout.py)")


def rollout_sets_high(st: "Stage", rollout: float, states: Known) -> bool:
    """Whether the stage's band ends high at its rollout phase (vLLM's share and the residents) rather than its
    training step."""
    return rollout > 0 and st.high <= (rollout + st.residents * states.factors[1]) * (1 + 1e-12)


def terms_known(optimizer: str, shape) -> dict:
    """Each term of the training peak and how it is known."""
    state = EXACT if optimizer == "fsdp2" else READ
    act = MEASURED if shape is not None and shape.measured else APPROXIMATED
    # the FSDP2 transient is measured with the rest of the step where the step is (the whole FSDP2 step's peak,
    # tests/test_activation_oracle.py); dist_opt has none
    return {"params": state, "grads": state, "optimizer": state, "activations": act, "logits": act,
            "transient": act}


def fsdp2_shard_bytes(family: Optional[str]) -> int:
    return 2 if family in FSDP2_BF16_SHARDS else 4


class Stage(NamedTuple):
    """What one rank of one pipeline stage holds, bytes per GPU (a named tuple: the mesh search makes many)."""
    stage: int
    layers: int
    params: float
    grads: float
    optimizer: float            # on the GPU
    optimizer_host: float       # on the host (offloaded)
    activations: float          # what the stage's layers keep for backward (stored inputs under recompute)
    logits: float
    transient: float            # FSDP2's unsharded layers and the backward's gradient buffers
    train_peak: float
    residents: float            # what stays on the GPU while the rollout runs
    peak: float
    layer: float = 0.0          # one layer in its backward (recomputed, under full recompute), beyond `activations`
    low: float = 0.0            # the peak's band: each term at the low and the high end of how it is known
    high: float = 0.0

    def summary(self) -> dict:
        g = lambda b: round(b / GIB, 2)  # noqa: E731
        return {"stage": self.stage, "layers": self.layers, "params_gib": g(self.params), "grads_gib": g(self.grads),
                "optimizer_gib": g(self.optimizer), "optimizer_host_gib": g(self.optimizer_host),
                "activations_gib": g(self.activations), "layer_backward_gib": g(self.layer),
                "logits_gib": g(self.logits), "band_gib": [g(self.low), g(self.high)],
                "transient_gib": g(self.transient), "train_peak_gib": g(self.train_peak),
                "rollout_residents_gib": g(self.residents), "peak_gib": g(self.peak)}


@dataclass
class Estimate:
    stage: int                  # the busiest stage: the highest peak, then the highest training peak, then the last
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
    rollout_detail: Optional[object] = None     # vrun.estimate.rollout.RolloutEstimate (RL runs)
    assumptions: str = ""
    optimizer_host: float = 0.0
    transient: float = 0.0
    stages: tuple = ()          # Stage per pipeline stage
    layer: float = 0.0          # the busiest stage's layer in its backward (beside the stored activations)
    low: float = 0.0            # the peak's band over every stage (vrun.estimate.memory.KNOWN)
    high: float = 0.0
    known: dict = field(default_factory=dict)   # term -> Known

    @property
    def fits(self) -> bool:
        """Below the band: the GPU holds even the band's high end."""
        return self.high <= self.gpu_mem

    @property
    def may_fit(self) -> bool:
        """The GPU holds at least the band's low end (within the band: plans with a warning)."""
        return self.low <= self.gpu_mem

    def verdict(self) -> str:
        """The memory verdict in a few words, with the band: below it, inside it, above it."""
        band = f"band {self.low / GIB:.1f}–{self.high / GIB:.1f} GiB"
        if self.fits:
            return f"fits, {(self.gpu_mem - self.high) / GIB:.1f} GiB to spare; {band}"
        if self.may_fit:
            return f"MAY NOT FIT: the GPU lies inside the {band}"
        return f"DOES NOT FIT: {band}"

    def deciding(self) -> list:
        """The terms that set the band's high end, (term, GiB, Known): where the rollout phase sets it, vLLM's share
        and the actor's residents beside it (what shrinks it: gpu_memory_utilization, offload); else the training
        terms of the stage that sets it that widen its band, widest first."""
        if not self.stages:
            return []
        st = max(self.stages, key=lambda x: (x.high, x.stage == self.stage))
        if self.rollout and rollout_sets_high(st, self.rollout, self.known["params"]):
            held = [("rollout", self.rollout / GIB, VLLM_SHARE)]
            return held + ([("rollout residents", st.residents / GIB, self.known["params"])] if st.residents else [])
        held = {"params": st.params, "grads": st.grads, "optimizer": st.optimizer, "transient": st.transient,
                "activations": st.activations + (st.layer if st.layer >= st.logits else 0.0),
                "logits": st.logits if st.logits > st.layer else 0.0}
        out = [(t, v / GIB, self.known[t]) for t, v in held.items() if v and self.known[t].factors != (1.0, 1.0)]
        return sorted(out, key=lambda x: -x[1] * (x[2].factors[1] - x[2].factors[0]))

    def summary(self) -> dict:
        g = lambda b: round(b / GIB, 1)  # noqa: E731
        return {"stage": self.stage, "busiest_stage": self.stage, "layers_on_stage": self.layers_on_stage,
                "weights_gib": g(self.weights), "grads_gib": g(self.grads), "optimizer_gib": g(self.optimizer),
                "optimizer_host_gib": g(self.optimizer_host), "activations_gib": g(self.activations),
                "layer_backward_gib": g(self.layer), "logits_gib": g(self.logits), "transient_gib": g(self.transient),
                "train_peak_gib": g(self.train_peak), "rollout_gib": g(self.rollout),
                "rollout_residents_gib": g(self.rollout_residents), "peak_gib": g(self.peak),
                "band_gib": [g(self.low), g(self.high)], "verdict": self.verdict(),
                "terms": {t: k.summary() for t, k in self.known.items()},
                "gpu_mem_gib": g(self.gpu_mem), "fits": self.fits, "may_fit": self.may_fit,
                "params": self.params_source,
                "stages": [s.summary() for s in self.stages],
                "rollout_phase": self.rollout_detail.summary() if self.rollout_detail is not None else None,
                "assumptions": self.assumptions}


@functools.lru_cache(maxsize=4096)
def _stages(p: Params, pp: int) -> tuple:
    """Per stage: (dense params, expert params, decoder+MTP layers, holds the loss, biggest layer (dense, expert),
    the root's params: the embedding and output head it holds, outside every decoder layer)."""
    out = []
    for units in stage_layout(pp, len(p.dense_per_layer), p.mtp_layers):
        dense = expert = root = 0.0
        layers, loss, biggest = 0, False, (0.0, 0.0)
        for u in units:
            if u[0] == "emb":
                dense += p.embedding
                root += p.embedding
            elif u[0] == "loss":
                dense += p.output
                root += p.output
                loss = True
            else:
                if u[0] == "layer":
                    d, e = p.dense_per_layer[u[1]], p.expert_per_layer[u[1]]
                else:
                    d, e = p.mtp_dense / max(p.mtp_layers, 1), p.mtp_expert / max(p.mtp_layers, 1)
                dense, expert, layers = dense + d, expert + e, layers + 1
                biggest = max(biggest, (d, e), key=sum)
        out.append((dense, expert, layers, loss, biggest, root))
    return tuple(out)


def step_activations(shape: Optional[acts.Shape], layers: int, in_flight: int, T: float, mesh: Mesh, *, hidden: int,
                     top_k: int, residual_streams: int, recompute: bool, seq_len: int = 0) -> tuple:
    """(what the stage's layers keep for backward, one layer in its backward beyond that) on one rank, bytes.
    Without a layer count for the architecture (shape None): the older rule of thumb, T·h·(34 + 4k)/t per layer
    (Korthikanti et al. 2022 with k routed copies), an approximation."""
    if not layers:
        return 0.0, 0.0
    kept, layer = _per_layer(shape, T, mesh, hidden, top_k, residual_streams, recompute, seq_len)
    return in_flight * layers * kept, layer


def _per_layer(shape, T: float, mesh: Mesh, hidden: int, top_k: int, residual_streams: int, recompute: bool,
               seq_len: int) -> tuple:
    """(what one layer keeps for one micro-batch, one layer in its backward beyond what the stage keeps)."""
    stored = T * hidden * residual_streams * 2 / mesh.tp        # a layer's input, kept under full recompute
    if shape is None:
        per_layer = T * hidden * (34 + 4 * top_k) / mesh.tp
        return (stored, per_layer) if recompute else (per_layer, 0.0)
    big = shape.biggest
    squared = shape.squared * min(seq_len or T * mesh.cp, T * mesh.cp) ** 2   # whole, after the heads' sum
    big_kept = big.kept(T, mesh.tp, mesh.cp)
    big_back = big.in_backward(T, mesh.tp, mesh.cp)
    if recompute:
        return stored, max(big_back, big_kept + squared)
    return shape.mean.kept(T, mesh.tp, mesh.cp), max(big_back - big_kept, squared)


def cp_matters(layer_shapes: Optional[tuple], cp_group_tokens: bool = False) -> bool:
    """Whether the estimate changes with CP beyond DP·CP: an attention that gathers the CP group's sequence, or a
    micro-batch counted for the whole CP group (each rank holds a CP-th of it)."""
    return cp_group_tokens or (bool(layer_shapes) and layer_shapes[1] != layer_shapes[0])


def rank_tokens(tokens: float, cp: int, cp_group_tokens: bool) -> float:
    """The tokens one rank holds of a micro-batch, as Megatron Lite's engine packs it: the micro-batch is the CP
    group's (verl_mlite's sp_size = CP) and each rank takes a CP-th of every packed sequence (zigzag halves), so a
    micro-batch of n sequences of s tokens is n·s/CP per rank; a dynamic batch's budget (ppo_max_token_len_per_gpu,
    which verl multiplies by sp_size for the group) is per rank already."""
    return tokens / max(cp, 1) if cp_group_tokens else tokens


def estimate(p: Params, mesh: Mesh, *, optimizer: str, hidden: int, vocab: int, top_k: int, tokens_per_gpu: int,
             recompute: bool, param_offload: bool, grad_offload: bool, optimizer_offload: bool,
             offload_fraction: float, gpu_mem_gib: float, rollout_fraction: float = 0.0,
             cross_entropy_fusion: bool = False, residual_streams: int = 1, family: Optional[str] = None,
             layer_shapes: Optional[tuple] = None, seq_len: int = 0, cp_group_tokens: bool = False) -> Estimate:
    """tokens_per_gpu: the per-rank budget, or with cp_group_tokens (no dynamic batch size) the CP group's
    micro-batch (micro-batch × sequence), of which each rank holds a CP-th (rank_tokens)."""
    frac = 1.0 if optimizer_offload else min(max(offload_fraction or 0.0, 0.0), 1.0)
    dense_dp, edp, ept = mesh.dp * mesh.cp, mesh.edp, mesh.ep * mesh.etp
    T = rank_tokens(tokens_per_gpu, mesh.cp, cp_group_tokens)
    rollout = rollout_fraction * gpu_mem_gib * GIB
    sb = fsdp2_shard_bytes(family)
    # the layers' bytes at this CP (layer_shapes: at CP 1 and gathered, from vrun.estimate.activations.shape)
    shape = layer_shapes[mesh.cp > 1] if layer_shapes else None
    known = terms_known(optimizer, shape)
    fs, fa, fl, ft = (known[t].factors for t in ("params", "activations", "logits", "transient"))
    kept, one_layer = _per_layer(shape, T, mesh, hidden, top_k, residual_streams, recompute, seq_len)
    stages = []
    for s, (dense, expert, layers, loss, biggest, root) in enumerate(_stages(p, mesh.pp)):
        d_rank, e_rank = dense / mesh.tp, expert / ept
        sharded = d_rank / dense_dp + e_rank / edp
        big = biggest[0] / mesh.tp + biggest[1] / ept      # one layer, unsharded, on this rank
        if optimizer == "fsdp2":
            w, gr = sb * sharded, sb * sharded
            # fsdp2/adamw.py: with any offload_fraction > 0 (cpu_update) the fp32 masters are copied to the host
            # and the moments are made beside them: all of the optimizer on the host, none on the GPU
            host = ADAM_BYTES * sharded if frac > 0 else 0.0
            opt = ADAM_BYTES * sharded - host
            # FSDP2 (param_dtype bf16, prefetch depth 1) at the step's peak, the layer's backward: the unit in its
            # backward and the one prefetched, unsharded in bf16 (2·2 B per param of the biggest layer on the rank,
            # its routed experts / (EP·ETP) included); and the root's own params (the stage's embedding and output
            # head), which Megatron Lite's wrap leaves unsharded from the forward to the end of the backward
            # (fsdp2/optimizer.py root_reshard_after_forward=False), in bf16. A unit's unsharded bf16 gradients and
            # fp32 reduce-scatter input (6 B per param) live during that unit's own backward, before the
            # attention's gradients of the same layer: not at the peak (the FSDP2 step measured in
            # tests/test_activation_oracle.py holds the sum)
            transient = (2 * 2 * big if layers else 0.0) + 2 * root / mesh.tp
        else:
            w, gr = 2 * (d_rank + e_rank), 4 * (d_rank + e_rank)
            host = ADAM_BYTES * sharded * frac
            opt = ADAM_BYTES * sharded - host
            transient = 0.0
        # 1F1B: stage s of PP keeps PP − s micro-batches in flight (the first all PP, the last one)
        act, layer = ((mesh.pp - s) * layers * kept, one_layer) if layers else (0.0, 0.0)
        # the loss holds the bf16 logits and their fp32 copy (2 + 4 B); fused cross entropy only bf16 chunks
        logits = T * vocab * (2 if cross_entropy_fusion else 2 + 4) / mesh.tp if loss else 0.0
        residents = (0 if param_offload else w) + (0 if grad_offload else gr) + (0 if optimizer_offload else opt)
        states = w + gr + opt
        train = states + act + max(layer, logits) + transient
        # the band: each term at the ends of how it is known (one expression: the mesh search makes thousands)
        low = states * fs[0] + act * fa[0] + max(layer * fa[0], logits * fl[0]) + transient * ft[0]
        high = states * fs[1] + act * fa[1] + max(layer * fa[1], logits * fl[1]) + transient * ft[1]
        stages.append(Stage(s, layers, w, gr, opt, host, act, logits, transient, train, residents,
                            max(train, rollout + residents), layer, max(low, rollout + residents * fs[0]),
                            max(high, rollout + residents * fs[1])))
    b = max(stages, key=lambda x: (x.peak, x.train_peak, x.stage))
    return Estimate(stage=b.stage, layers_on_stage=b.layers, weights=b.params, grads=b.grads, optimizer=b.optimizer,
                    activations=b.activations, logits=b.logits, train_peak=b.train_peak, rollout=rollout,
                    rollout_residents=b.residents, peak=b.peak, gpu_mem=gpu_mem_gib * GIB, params_source=p.source,
                    optimizer_host=b.optimizer_host, transient=b.transient, stages=tuple(stages), layer=b.layer,
                    low=max(x.low for x in stages), high=max(x.high for x in stages), known=known)


def stage_split(p: Params, mesh: Mesh) -> list[dict]:
    """Per pipeline stage: its parameters, and what one rank of it holds (dense / TP, experts / (EP·ETP))."""
    out = []
    for s, (dense, expert, layers, loss, *_) in enumerate(_stages(p, mesh.pp)):
        out.append({"stage": s, "layers": layers, "dense": int(dense), "routed_expert": int(expert),
                    "per_rank": int(dense / mesh.tp + expert / (mesh.ep * mesh.etp)), "has_loss": loss})
    return out

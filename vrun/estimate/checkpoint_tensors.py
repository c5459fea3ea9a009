"""The tensors of one safetensors shard counted from its header, no tensor data: which are parameters, which
quantization scales, buffers or of unknown packing, and in which part of the model each sits.

Counts are LOGICAL parameters, not stored elements:
  float dtypes (BF16, F16, F32, F8_E4M3, F4, ...)   numel = prod(shape) (safetensors shapes are logical)
  quantization scales / zeros / metadata             not counted (`excluded_scale_tensors` says how many)
  packed integers (GPTQ/AWQ `qweight`, compressed-tensors `weight_packed`, MXFP4 `*_blocks`, integer `weight`)
                                                     prod(shape) · storage bits / weight bits, the weight bits
                                                     from quantization_config (or DeepSeek-V4's expert_dtype);
                                                     `qweight`/`weight_packed` without any quantization_config
                                                     are taken as INT4 (8 per I32, 2 per U8/I8)
  an integer weight whose packing is not determined  listed in `unknown`, not counted, complete = False
  other integer / bool tensors (position_ids, DeepSeek-V4's gate.tid2eid, ...): buffers, listed, not counted
Each counted tensor is vision, mtp, routed_expert or dense (in that order of precedence); dense includes the
embedding, lm_head, final norm, attention, norms, routers, shared experts and dense MLP layers.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from typing import Dict, List, Mapping, NamedTuple, Optional

from vrun.estimate.checkpoint_config import CheckpointError, no_constant, refused

# safetensors refuses headers above 100 MB; anything larger is not a safetensors file
MAX_HEADER = 100_000_000


# bits per stored element
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
              "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
              "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


FLOAT_DTYPES = {"F4", "F6_E2M3", "F6_E3M2", "F8_E4M3", "F8_E5M2", "F16", "BF16", "F32", "F64", "C64"}


INT_DTYPES = {"U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64"}


# E8M0 holds only power-of-two exponents: a block scale, never a weight
SCALE_DTYPES = {"F8_E8M0"}


# last name component of quantization side tensors (FP8 block scales, GPTQ/AWQ, compressed-tensors, ModelOpt,
# bitsandbytes, KV-cache scales)
SCALE_LEAVES = {
    "weight_scale", "weight_scale_2", "weight_scale_inv", "input_scale", "output_scale", "weight_global_scale",
    "input_global_scale", "k_scale", "v_scale", "q_scale", "prob_scale", "scales", "qzeros", "g_idx",
    "weight_g_idx", "weight_zero_point", "input_zero_point", "weight_shape", "absmax", "quant_map",
    "nested_absmax", "nested_quant_map", "SCB", "weight_format",
}


PACKED_LEAVES = {"qweight", "weight_packed"}


_VISION = re.compile(r"(?:^|\.)(?:visual|vision_tower|vision_model|vision_encoder|mm_projector|"
                     r"multi_modal_projector)(?:\.|$)")


_MTP = re.compile(r"(?:^|[._])(?:mtp|nextn)")


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


_ROUTED = re.compile(r"\.experts\.(?:\d+\.|(?:gate_up_proj|gate_proj|up_proj|down_proj|w1|w2|w3|w13)(?:[._]|$))")


_FUSED_EXPERTS = re.compile(r"\.experts\.(?:gate_up_proj|gate_proj|up_proj|down_proj)$")


_PER_EXPERT_WEIGHT = re.compile(r"\.experts\.\d+\.[^.]+\.(?:weight|qweight|weight_packed)$")


_EMBEDDING = re.compile(r"(?:^|\.)(?:embed_tokens|embed|tok_embeddings|word_embeddings|wte)\.weight$")


_OUTPUT = re.compile(r"(?:^|\.)(?:lm_head|head|output)\.weight$")


# dtypes that store a weight narrower than 16 bits: what a quantization_config promises the tensors hold
NARROW_DTYPES = INT_DTYPES | {"F8_E4M3", "F8_E5M2", "F4", "F6_E2M3", "F6_E3M2"}


class UnknownTensor(NamedTuple):
    name: str
    dtype: str
    shape: tuple


def read_safetensors_header(path: str) -> tuple[dict, int]:
    """The header's JSON and the byte length of the data section the file holds; reads nothing past the header."""
    import stat as _stat

    # opened without blocking: a FIFO named like a shard is refused, never waited on
    with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
        if not _stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise CheckpointError(f"{path}: not a regular file (a FIFO or device); not safetensors")
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors header")
        if head.startswith(b"version "):
            raise CheckpointError(f"{path}: a Git LFS pointer, not the weights (run `git lfs pull`)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or n > size - 8:
            raise CheckpointError(f"{path}: header length {n} does not fit a {size}-byte file; not safetensors")
        raw = f.read(n)
    try:
        header = json.loads(raw, parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    return header, size - 8 - n


class ShardCounter:
    """Accumulates one shard header after another."""

    def __init__(self, arch: dict, quantized: bool, qbits: Optional[set], expert_bits: Optional[int]):
        self.layers = arch.get("layers")
        self.hidden, self.moe_inter = arch.get("hidden"), arch.get("moe_intermediate_size")
        self.quantized, self.qbits, self.expert_bits = quantized, qbits, expert_bits
        self.totals = {"dense": 0, "routed_expert": 0, "mtp": 0, "vision": 0}
        self.per_layer_expert: Dict[int, int] = {}
        self.per_layer_dense: Dict[int, int] = {}
        self.embedding = self.output = self.excluded = self.mtp_routed_expert = 0
        self.unknown: List[UnknownTensor] = []
        self.buffers: List[str] = []
        self.dtypes: Dict[str, int] = {}
        self.problems: List[str] = []
        self.seen: set = set()
        self.odd_experts: List[str] = []
        self.weight_dtypes: set = set()   # dtypes of the tensors counted as parameters

    def add_shard(self, shard: str, header: dict, data_bytes: int) -> None:
        end, bad_size, seen, dtypes, add = 0, [], self.seen, self.dtypes, self._add
        for name, info in header.items():
            if name == "__metadata__":
                continue
            # JSON already holds ints: one type check on the products instead of int() on every number
            try:
                dtype, shape = info["dtype"], info["shape"]
                begin, stop = info["data_offsets"]
                numel, length = math.prod(shape), stop - begin
            except (KeyError, TypeError, ValueError):
                numel = length = None
            if type(numel) is not int or type(length) is not int or type(dtype) is not str:
                self.problems.append(f"{shard}: tensor {name} has no valid dtype/shape/data_offsets in the header")
                continue
            if not all(type(d) is int and d >= 0 for d in shape) or type(begin) is not int or not 0 <= begin <= stop:
                raise refused(shard, f"{name}.shape", shape, "a negative or non-integer dimension or byte "
                              "range: not a safetensors header", "download the shard again")
            if stop > end:
                end = stop
            bits = DTYPE_BITS.get(dtype)
            if bits is not None and length != (numel * bits + 7) // 8:
                bad_size.append(name)
            if name in seen:
                self.problems.append(f"warning: {shard}: tensor {name} appears in more than one shard; counted once")
                continue
            seen.add(name)
            dtypes[dtype] = dtypes.get(dtype, 0) + 1
            add(name, dtype, shape, numel, header)
        if bad_size:
            self.problems.append(f"warning: {shard}: {len(bad_size)} tensor(s) whose byte range does not match "
                                 f"dtype×shape, e.g. {bad_size[0]}")
        if end > data_bytes:
            self.problems.append(f"warning: {shard}: truncated: the header describes {end} data bytes, "
                                 f"the file holds {data_bytes} (counts come from the header)")

    def _add(self, name: str, dtype: str, shape: list, numel: int, siblings: Mapping) -> None:
        leaf = name.rpartition(".")[2]
        if _is_scale(name, leaf, dtype, siblings):
            self.excluded += 1
            return
        # substring tests first: the regexes run only on names that can match (100k names in a 671B checkpoint)
        vision = ("vis" in name or "mm_" in name or "multi_modal" in name) and bool(_VISION.search(name))
        m = None if vision else _LAYER.search(name)
        layer = int(m.group(1)) if m else None
        mtp = not vision and ((("mtp" in name or "nextn" in name) and bool(_MTP.search(name))) or (
            layer is not None and self.layers is not None and layer >= self.layers))
        routed = not vision and ".experts." in name and "shared_expert" not in name and bool(_ROUTED.search(name))
        if dtype in FLOAT_DTYPES:
            n = numel
        elif dtype in INT_DTYPES and _is_weight(name, leaf):
            n = self._unpacked(name, leaf, dtype, shape, numel, routed)
            if n is None:
                self.unknown.append(UnknownTensor(name, dtype, tuple(shape)))
                return
        elif dtype in INT_DTYPES or dtype == "BOOL":
            self.buffers.append(name)
            return
        else:
            self.unknown.append(UnknownTensor(name, dtype, tuple(shape)))
            return
        self.weight_dtypes.add(dtype)
        # a float shape is logical as stored; an unpacked integer weight is checked against the config's sizes
        if routed and dtype in INT_DTYPES and self.hidden and self.moe_inter and len(shape) == 2 \
                and n != self.hidden * self.moe_inter and _PER_EXPERT_WEIGHT.search(name):
            self.odd_experts.append(name)
        if vision:
            self.totals["vision"] += n
        elif mtp:
            self.totals["mtp"] += n
            if routed:
                self.mtp_routed_expert += n
        elif routed:
            self.totals["routed_expert"] += n
            if layer is not None:
                self.per_layer_expert[layer] = self.per_layer_expert.get(layer, 0) + n
        else:
            self.totals["dense"] += n
            if layer is not None:
                self.per_layer_dense[layer] = self.per_layer_dense.get(layer, 0) + n
            elif _EMBEDDING.search(name):
                self.embedding += n
            elif _OUTPUT.search(name):
                self.output += n

    def _unpacked(self, name: str, leaf: str, dtype: str, shape: list, numel: int, routed: bool) -> Optional[int]:
        """Logical values held by a packed integer weight; None when its packing is not determined."""
        if routed and self.expert_bits:
            bits = self.expert_bits
        elif self.qbits:
            if len(self.qbits) > 1:  # mixed precision: which group this tensor is in is not read here
                return None
            (bits,) = self.qbits
        elif leaf in PACKED_LEAVES and not self.quantized:
            bits = 4  # the GPTQ/AWQ/compressed-tensors naming convention, INT4 by default
        else:
            return None
        stored = numel * DTYPE_BITS[dtype]
        return stored // bits if bits and stored % bits == 0 else None


def _is_scale(name: str, leaf: str, dtype: str, siblings: Mapping) -> bool:
    if dtype in SCALE_DTYPES or leaf in SCALE_LEAVES or leaf.endswith(("_scale_inv", "_zero_point")):
        return True
    if ".quant_state." in name:
        return True
    # DeepSeek-V4: `<proj>.scale` beside `<proj>.weight`; gpt-oss MXFP4: `<proj>_scales` (U8) beside `_blocks`
    if leaf == "scale" and name[:-5] + "weight" in siblings:
        return True
    return leaf.endswith("_scales") and dtype in ("U8", "I8")


def _is_weight(name: str, leaf: str) -> bool:
    """An integer tensor that stands for a weight (packed or quantized), not a buffer."""
    return leaf in PACKED_LEAVES or leaf == "weight" or leaf.endswith("_blocks") or bool(_FUSED_EXPERTS.search(name))

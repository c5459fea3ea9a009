"""Facts read from a Hugging Face checkpoint directory: config.json and the safetensors headers, no tensor data.

Runs in the planning process, so it imports neither torch nor safetensors and reads only each shard's header
(8 bytes little-endian u64 N, then N bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__": ...}).

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
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional

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

ARCH_KEYS = {
    "layers": ("num_hidden_layers",),
    "routed_experts": ("n_routed_experts", "num_experts", "num_local_experts"),
    "experts_per_token": ("num_experts_per_tok", "experts_per_token"),
    "heads": ("num_attention_heads",),
    "kv_heads": ("num_key_value_heads",),
    "hidden": ("hidden_size",),
    "vocab": ("vocab_size",),
    # Qwen3-Next/3.5 write mtp_num_hidden_layers; GLM/DeepSeek num_nextn_predict_layers (or num_nextn_predict)
    "mtp_layers": ("num_nextn_predict_layers", "mtp_num_hidden_layers", "mtp_num_layers", "num_nextn_predict"),
    "dense_layers": ("first_k_dense_replace",),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "intermediate_size": ("intermediate_size",),
}
# the keys cross_check compares with the model group's arch facts
CHECKED_KEYS = ("layers", "routed_experts", "experts_per_token", "heads", "kv_heads", "hidden", "vocab",
                "mtp_layers", "dense_layers")

_VISION = re.compile(r"(?:^|\.)(?:visual|vision_tower|vision_model|vision_encoder|mm_projector|"
                     r"multi_modal_projector)(?:\.|$)")
_MTP = re.compile(r"(?:^|[._])(?:mtp|nextn)")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_ROUTED = re.compile(r"\.experts\.(?:\d+\.|(?:gate_up_proj|gate_proj|up_proj|down_proj|w1|w2|w3|w13)(?:[._]|$))")
_FUSED_EXPERTS = re.compile(r"\.experts\.(?:gate_up_proj|gate_proj|up_proj|down_proj)$")
_PER_EXPERT_WEIGHT = re.compile(r"\.experts\.\d+\.[^.]+\.(?:weight|qweight|weight_packed)$")
_EMBEDDING = re.compile(r"(?:^|\.)(?:embed_tokens|embed|tok_embeddings|word_embeddings|wte)\.weight$")
_OUTPUT = re.compile(r"(?:^|\.)(?:lm_head|head|output)\.weight$")
_BITS_IN_NAME = re.compile(r"(?:fp|int|nf|uint)(\d+)|w(\d+)a", re.I)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read (names the file and why). With a fix: the checkpoint's own facts
    disagree (a word for a number, a negative shape, no weights, a quantization its tensors do not hold), and the
    plan is refused rather than sized from them."""

    def __init__(self, message: str, fix: Optional[str] = None):
        super().__init__(message)
        self.fix = fix


def _refused(file: str, key: str, value: Any, why: str, fix: str) -> CheckpointError:
    return CheckpointError(f"{file} {key}={str(value)[:80]}: {why}", fix)


from vrun.estimate.rollout import CONFIG_JSON_LIMIT as JSON_LIMIT  # noqa: E402 - config.json, the index
# dtypes that store a weight narrower than 16 bits: what a quantization_config promises the tensors hold
NARROW_DTYPES = INT_DTYPES | {"F8_E4M3", "F8_E5M2", "F4", "F6_E2M3", "F6_E3M2"}


class UnknownTensor(NamedTuple):
    name: str
    dtype: str
    shape: tuple


@dataclass
class CheckpointFacts:
    path: str
    model_type: Optional[str]
    # config.json numbers (ARCH_KEYS), None where absent
    arch: Dict[str, Optional[int]]
    # logical parameters: dense, routed_expert, mtp, vision, total
    totals: Dict[str, int]
    # decoder layer index -> routed-expert / dense parameters (MTP and vision layers are not here)
    per_layer_expert: Dict[int, int]
    per_layer_dense: Dict[int, int]
    embedding: int
    output: int
    excluded_scale_tensors: int
    unknown: List[UnknownTensor]
    dtypes: Counter
    shards: int
    complete: bool
    # routed-expert part of totals["mtp"] (MTP layers are MoE layers)
    mtp_routed_expert: int = 0
    tied_embeddings: bool = False
    quant_method: Optional[str] = None
    # integer / bool tensors that are buffers, not parameters (not counted)
    buffers: List[str] = field(default_factory=list)
    # what could not be read or does not add up, one line each
    problems: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready (dtypes as a plain dict, unknown tensors as dicts)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["dtypes"] = dict(self.dtypes)
        d["unknown"] = [u._asdict() for u in self.unknown]
        return d


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
        header = json.loads(raw, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    return header, size - 8 - n


def read_checkpoint(path: str) -> Optional[CheckpointFacts]:
    """Facts of the checkpoint at `path`; None when it is not a directory with a config.json.

    Raises CheckpointError when config.json or the index is not valid JSON; a shard that is missing or unreadable
    is a line in `problems` instead (and `complete` is False), so a partial download still plans.
    """
    path = os.fspath(path)
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        return None
    top = load_json(cfg_path)
    text = top.get("text_config") if isinstance(top.get("text_config"), dict) else {}
    cfg = {**top, **text}
    _numbers_are_numbers(cfg_path, cfg)
    _quantization_shape(cfg_path, top, text)
    arch = {key: _first_int(cfg, names) for key, names in ARCH_KEYS.items()}
    qcfg = top.get("quantization_config") or text.get("quantization_config") or {}
    qbits, quant_method = _quant_bits(qcfg if isinstance(qcfg, dict) else {})
    counter = _Counter(arch, bool(qcfg), qbits, _bits_of(cfg.get("expert_dtype")))

    files, weight_map = _shard_files(path)
    problems: List[str] = []
    placed: Dict[str, List[str]] = {}
    for tensor, file in (weight_map or {}).items():
        placed.setdefault(file, []).append(tensor)
    for name in files:
        shard = os.path.join(path, name)
        try:
            header, data_bytes = read_safetensors_header(shard)
        except FileNotFoundError:
            problems.append(f"{shard}: listed in the index but missing")
            continue
        except CheckpointError as e:
            problems.append(str(e))
            continue
        except OSError as e:
            problems.append(f"{shard}: {e}")
            continue
        counter.add_shard(shard, header, data_bytes)
        lost = [t for t in placed.get(name, ()) if t not in header]
        if lost:
            problems.append(f"{shard}: {len(lost)} tensor(s) the index places here are not in its header, "
                            f"e.g. {lost[0]}")
    if not files:
        problems.append(f"{path}: no safetensors weights (model.safetensors[.index.json] or *.safetensors)")
    c = counter
    problems += c.problems
    _facts_agree(path, cfg_path, qcfg, cfg.get("expert_dtype"), c, problems, bool(files))
    if c.odd_experts:
        problems.append(f"warning: {len(c.odd_experts)} routed-expert weight(s) do not hold hidden_size × "
                        f"moe_intermediate_size = {c.hidden} × {c.moe_inter} values, e.g. {c.odd_experts[0]} "
                        "(packing or config mismatch)")
    complete = not c.unknown and not any(not p.startswith("warning:") for p in problems)
    return CheckpointFacts(
        path=path, model_type=top.get("model_type") or text.get("model_type"), arch=arch,
        totals={**c.totals, "total": sum(c.totals.values())},
        per_layer_expert=dict(sorted(c.per_layer_expert.items())),
        per_layer_dense=dict(sorted(c.per_layer_dense.items())),
        embedding=c.embedding, output=c.output, excluded_scale_tensors=c.excluded, unknown=c.unknown,
        dtypes=Counter(c.dtypes), shards=len(files), complete=complete, mtp_routed_expert=c.mtp_routed_expert,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), quant_method=quant_method, buffers=c.buffers,
        problems=problems)


def cross_check(facts: CheckpointFacts, arch: Any) -> List[str]:
    """One line per architecture number on which the model group's facts and the checkpoint's config.json differ."""
    if not isinstance(arch, Mapping):
        arch = {k: getattr(arch, k) for k in CHECKED_KEYS if hasattr(arch, k)}
    out = []
    for key in CHECKED_KEYS:
        group, ckpt = arch.get(key), facts.arch.get(key)
        if not _is_int(group) or not _is_int(ckpt) or group == ckpt:
            continue
        out.append(f"arch.{key}: model group says {group}, checkpoint config.json says {ckpt}")
    return out


# internals ---------------------------------------------------------------------------------------------

class _Counter:
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
                raise _refused(shard, f"{name}.shape", shape, "a negative or non-integer dimension or byte "
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


def _quant_bits(q: dict) -> tuple[Optional[set], Optional[str]]:
    """Weight bit widths quantization_config names (None if it names none) and its quant_method."""
    bits = set()
    for key in ("bits", "w_bit", "wbits", "nbits", "weight_bits", "num_bits"):
        if _is_int(q.get(key)):
            bits.add(q[key])
    groups = q.get("config_groups")
    if isinstance(groups, dict):
        for g in groups.values():
            w = g.get("weights") if isinstance(g, dict) else None
            if isinstance(w, dict) and _is_int(w.get("num_bits")):
                bits.add(w["num_bits"])
    inner = q.get("quantization") if isinstance(q.get("quantization"), dict) else {}
    for algo in (q.get("quant_algo"), inner.get("quant_algo")):
        b = _bits_of(algo)
        if b:
            bits.add(b)
    method = q.get("quant_method")
    if not bits:
        b = _bits_of(method)
        if b:
            bits.add(b)
        elif q.get("load_in_4bit"):
            bits.add(4)
        elif q.get("load_in_8bit"):
            bits.add(8)
    return (bits or None), (str(method) if method is not None else None)


def _bits_of(s: Any) -> Optional[int]:
    """4 from 'fp4'/'mxfp4'/'NVFP4'/'int4'/'W4A16', 8 from 'fp8'/'FP8_BLOCK'; None from anything else."""
    if not isinstance(s, str):
        return None
    m = _BITS_IN_NAME.search(s)
    return int(m.group(1) or m.group(2)) if m else None


def _shard_files(path: str) -> tuple[List[str], Optional[dict]]:
    """Shard file names, and the index's weight_map when there is one."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        weight_map = load_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no weight_map object")
        return sorted(set(weight_map.values())), weight_map
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        return ["model.safetensors"], None
    return sorted(f for f in os.listdir(path) if f.endswith(".safetensors")), None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a checkpoint holds")


def load_json(path: str) -> dict:
    """A checkpoint's JSON file: a regular file (a link to one, as the Hugging Face cache makes, is fine) of at
    most JSON_LIMIT bytes, read without blocking; NaN/Infinity refused."""
    from vrun.core import fs

    fix = f"restore {os.path.basename(path)} from the model's upstream repository (a regular JSON file)"
    text, why = fs.read_checked(path, JSON_LIMIT)
    if text is None:
        raise CheckpointError(f"{path}: {why}", fix)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})", fix) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a JSON object", fix)
    return data


def _quantization_shape(cfg_path: str, top: dict, text: dict) -> None:
    """quantization_config as its readers take it (transformers' and vLLM's quantization configs, _quant_bits,
    vrun.estimate.rollout.formats_from_config): null or a map; within it config_groups a map of maps whose
    `weights` is a map, and `quantization` a map. A list or a word where a map belongs is refused, naming it."""
    for where, cfg in (("", top), ("text_config.", text)):
        q = cfg.get("quantization_config")
        if q is None:
            continue
        parts = [(f"{where}quantization_config", q)]
        if isinstance(q, dict):
            groups = q.get("config_groups")
            parts += [(f"{where}quantization_config.config_groups", groups),
                      (f"{where}quantization_config.quantization", q.get("quantization"))]
            if isinstance(groups, dict):
                for name, g in groups.items():
                    parts.append((f"{where}quantization_config.config_groups.{name}", g))
                    if isinstance(g, dict):
                        parts.append((f"{where}quantization_config.config_groups.{name}.weights", g.get("weights")))
        for key, v in parts:
            if v is not None and not isinstance(v, dict):
                raise _refused(cfg_path, key, json.dumps(v)[:80], f"a {type(v).__name__} where a map belongs (its "
                               "readers, transformers' and vLLM's quantization configs, take a map)",
                               f"write {key} as its upstream config.json has it (a JSON object), or remove it")


def _numbers_are_numbers(cfg_path: str, cfg: dict) -> None:
    """Every architecture number config.json gives (ARCH_KEYS) is a positive integer (first_k_dense_replace and the
    MTP layer counts may be 0): a word, a float, a negative count is refused, never skipped for a guess."""
    zero_ok = set(ARCH_KEYS["mtp_layers"] + ARCH_KEYS["dense_layers"])
    for names in ARCH_KEYS.values():
        for n in names:
            v = cfg.get(n)
            if v is None:
                continue
            if not _is_int(v) or v < (0 if n in zero_ok else 1):
                raise _refused(cfg_path, n, v, f"not a {'non-negative' if n in zero_ok else 'positive'} integer "
                               f"({type(v).__name__})", f"write {n} as the model's integer in {cfg_path}, "
                               "as its upstream config.json has it")


def _facts_agree(path: str, cfg_path: str, qcfg: Any, expert_dtype: Any, c: "_Counter", problems: list,
                 has_shards: bool) -> None:
    """The checkpoint's facts checked against each other: shards hold some parameters, and a quantization
    config.json declares (quantization_config, expert_dtype) is one its weight tensors are stored in. (A dir with a
    config.json and no shard at all is not refused here: the plan counts from the model group's facts then.)"""
    if has_shards and not c.unknown and sum(c.totals.values()) == 0:
        first = next((p for p in problems if not p.startswith("warning:")), None)
        raise _refused(path, "weights", 0, f"no weight tensor read, 0 parameters ({first or 'the headers hold none'})",
                       "point at the checkpoint's directory with its *.safetensors weights (complete)")
    declared = []
    if isinstance(qcfg, dict) and qcfg:
        bits, method = _quant_bits(qcfg)
        if bits and min(bits) < 16:
            declared.append(("quantization_config", method or f"{min(bits)}-bit"))
    if _bits_of(expert_dtype) and _bits_of(expert_dtype) < 16:
        declared.append(("expert_dtype", expert_dtype))
    stored = set(c.weight_dtypes)
    if declared and stored and not stored & NARROW_DTYPES:
        key, said = declared[0]
        raise _refused(cfg_path, key, said, f"declares weights narrower than 16 bits, but every weight tensor is "
                       f"stored as {'/'.join(sorted(stored))}", f"remove {key} from {cfg_path}, or point at the "
                       "quantized checkpoint it describes")


def _first_int(cfg: dict, names: tuple) -> Optional[int]:
    for n in names:
        if _is_int(cfg.get(n)):
            return cfg[n]
    return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def params_from_checkpoint(facts, arch: dict):
    """The estimate's units from the checkpoint's counts; a vision tower sits with the embedding on stage 0,
    the final norm with the output layer."""
    from vrun.estimate.memory import Params

    layers = max(list(facts.per_layer_dense) + list(facts.per_layer_expert) + [-1]) + 1
    n = facts.arch.get("layers") or layers
    dense = tuple(facts.per_layer_dense.get(i, 0) for i in range(n))
    expert = tuple(facts.per_layer_expert.get(i, 0) for i in range(n))
    t = facts.totals
    rest = t.get("dense", 0) - sum(dense) - facts.embedding - facts.output
    mtp = t.get("mtp", 0)
    m = (facts.arch.get("mtp_layers") or arch.get("mtp_layers") or 1) if mtp else 0
    return Params(embedding=facts.embedding + t.get("vision", 0), output=facts.output + max(rest, 0),
                  dense_per_layer=dense, expert_per_layer=expert, mtp_dense=mtp - facts.mtp_routed_expert,
                  mtp_expert=facts.mtp_routed_expert, mtp_layers=m, source=f"checkpoint ({facts.shards} shard(s))")


@dataclass(frozen=True)
class CheckpointSummary:
    """What a plan records about the checkpoint it read (plan.json's checkpoint)."""
    path: str
    model_type: Optional[str]
    totals: Dict[str, int]                  # logical parameters: dense, routed_expert, mtp, vision, total
    complete: bool
    excluded_scale_tensors: int
    dtypes: Dict[str, int]                  # tensors per dtype
    per_layer_routed_expert: Dict[int, int]
    unknown: tuple                          # the first 10 UnknownTensor
    problems: tuple                         # the first 10 lines

    def summary(self) -> dict:
        return {"path": self.path, "model_type": self.model_type, "totals": self.totals, "complete": self.complete,
                "excluded_scale_tensors": self.excluded_scale_tensors, "dtypes": self.dtypes,
                "per_layer_routed_expert": self.per_layer_routed_expert,
                "unknown": [u._asdict() for u in self.unknown], "problems": list(self.problems)}


def checkpoint_summary(facts: CheckpointFacts) -> CheckpointSummary:
    return CheckpointSummary(
        path=facts.path, model_type=facts.model_type, totals=facts.totals, complete=facts.complete,
        excluded_scale_tensors=facts.excluded_scale_tensors, dtypes=dict(facts.dtypes),
        per_layer_routed_expert=facts.per_layer_expert, unknown=tuple(facts.unknown[:10]),
        problems=tuple(facts.problems[:10]))

"""Facts read from a Hugging Face checkpoint directory: config.json and the safetensors headers, no tensor data.

Runs in the planning process, so it imports neither torch nor safetensors and reads only each shard's header
(8 bytes little-endian u64 N, then N bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__": ...}).
The parts, each its own module: config.json read and checked (vrun.estimate.checkpoint_config), a shard's tensors
counted (vrun.estimate.checkpoint_tensors); here the directory's shards read one after another into CheckpointFacts,
the facts checked against each other, and what the estimate and plan.json take from them. Their names stay
importable from here.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from vrun.estimate.checkpoint_config import (  # noqa: F401 - config.json's reading; its names importable from here
    ARCH_KEYS, CHECKED_KEYS, JSON_LIMIT, CheckpointError, bits_of, first_int, is_int, load_json,
    numbers_are_numbers, quant_bits, quantization_shape, refused)
from vrun.estimate.checkpoint_tensors import (  # noqa: F401 - a shard's tensors counted; importable from here
    DTYPE_BITS, FLOAT_DTYPES, INT_DTYPES, MAX_HEADER, NARROW_DTYPES, PACKED_LEAVES, SCALE_DTYPES, SCALE_LEAVES,
    ShardCounter, UnknownTensor, read_safetensors_header)


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
    numbers_are_numbers(cfg_path, cfg)
    quantization_shape(cfg_path, top, text)
    arch = {key: first_int(cfg, names) for key, names in ARCH_KEYS.items()}
    qcfg = top.get("quantization_config") or text.get("quantization_config") or {}
    qbits, quant_method = quant_bits(qcfg if isinstance(qcfg, dict) else {})
    counter = ShardCounter(arch, bool(qcfg), qbits, bits_of(cfg.get("expert_dtype")))

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
        if not is_int(group) or not is_int(ckpt) or group == ckpt:
            continue
        out.append(f"arch.{key}: model group says {group}, checkpoint config.json says {ckpt}")
    return out


# internals ---------------------------------------------------------------------------------------------

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


def _facts_agree(path: str, cfg_path: str, qcfg: Any, expert_dtype: Any, c: "ShardCounter", problems: list,
                 has_shards: bool) -> None:
    """The checkpoint's facts checked against each other: shards hold some parameters, and a quantization
    config.json declares (quantization_config, expert_dtype) is one its weight tensors are stored in. (A dir with a
    config.json and no shard at all is not refused here: the plan counts from the model group's facts then.)"""
    if has_shards and not c.unknown and sum(c.totals.values()) == 0:
        first = next((p for p in problems if not p.startswith("warning:")), None)
        raise refused(path, "weights", 0, f"no weight tensor read, 0 parameters ({first or 'the headers hold none'})",
                      "point at the checkpoint's directory with its *.safetensors weights (complete)")
    declared = []
    if isinstance(qcfg, dict) and qcfg:
        bits, method = quant_bits(qcfg)
        if bits and min(bits) < 16:
            declared.append(("quantization_config", method or f"{min(bits)}-bit"))
    if bits_of(expert_dtype) and bits_of(expert_dtype) < 16:
        declared.append(("expert_dtype", expert_dtype))
    stored = set(c.weight_dtypes)
    if declared and stored and not stored & NARROW_DTYPES:
        key, said = declared[0]
        raise refused(cfg_path, key, said, f"declares weights narrower than 16 bits, but every weight tensor is "
                      f"stored as {'/'.join(sorted(stored))}", f"remove {key} from {cfg_path}, or point at the "
                      "quantized checkpoint it describes")


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

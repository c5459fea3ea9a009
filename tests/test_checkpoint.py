"""vrun.estimate.checkpoint: logical parameter counts and config facts from tiny checkpoints, read from the headers only."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from vrun.estimate.checkpoint import CheckpointError, cross_check, read_checkpoint

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

ROOT = Path(__file__).resolve().parents[1]
BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "I32": 4, "I64": 8}


def write_raw(path: Path, tensors: dict, data: str = "zeros") -> None:
    """A safetensors file written by hand (for dtypes numpy lacks): data is zeros, garbage, or none (truncated)."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = int(np.prod(shape)) * BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    body = {"zeros": bytes(offset), "garbage": os.urandom(offset), "none": b""}[data]
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def write_config(d: Path, **cfg) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


# DeepSeek-V3 / Kimi-K2 style: layer 0 dense MLP, layer 1 MoE (2 routed experts + shared expert), MLA attention
DSV3_CONFIG = dict(model_type="kimi_k2", num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=2,
                   num_experts_per_tok=1, num_attention_heads=2, num_key_value_heads=2, hidden_size=8,
                   moe_intermediate_size=4, intermediate_size=16, vocab_size=32, num_nextn_predict_layers=0)


def dsv3_tensors(dtype: str) -> dict:
    t = {
        "model.embed_tokens.weight": (dtype, (32, 8)),                          # 256
        "model.layers.0.input_layernorm.weight": (dtype, (8,)),                 # 8
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": (dtype, (6, 8)),  # 48
        "model.layers.0.mlp.gate_proj.weight": (dtype, (16, 8)),                # 128 (dense MLP)
        "model.layers.1.self_attn.kv_a_proj_with_mqa.weight": (dtype, (6, 8)),  # 48
        "model.layers.1.mlp.gate.weight": (dtype, (2, 8)),                      # 16 (router)
        "model.layers.1.mlp.shared_experts.gate_proj.weight": (dtype, (4, 8)),  # 32
        "model.norm.weight": (dtype, (8,)),                                     # 8
        "lm_head.weight": (dtype, (32, 8)),                                     # 256
    }
    for e in range(2):
        t[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"] = (dtype, (4, 8))
        t[f"model.layers.1.mlp.experts.{e}.up_proj.weight"] = (dtype, (4, 8))
        t[f"model.layers.1.mlp.experts.{e}.down_proj.weight"] = (dtype, (8, 4))
    return t


@pytest.fixture
def dsv3(tmp_path):
    d = write_config(tmp_path / "dsv3", **DSV3_CONFIG)
    write_raw(d / "model.safetensors", dsv3_tensors("BF16"))
    return d


# plain and sharded ---------------------------------------------------------------------------------------

def test_bf16_plain_totals(dsv3):
    """A single BF16 model.safetensors: dense and routed-expert totals, embedding and lm_head."""
    f = read_checkpoint(dsv3)
    # 2 experts × 3 projections × 4×8 = 192
    # dense: embed 256 + layer 0 (8 + 48 + 128) + layer 1 (48 + 16 + 32) + norm 8 + lm_head 256 = 800
    assert f.totals == {"dense": 800, "routed_expert": 192, "mtp": 0, "vision": 0, "total": 992}
    assert (f.embedding, f.output, f.shards, f.complete) == (256, 256, 1, True)
    assert f.dtypes == {"BF16": 15} and f.excluded_scale_tensors == 0 and f.unknown == []


def test_per_layer_counts(dsv3):
    """Routed-expert and dense params are kept per decoder layer; the dense layer has no expert entry."""
    f = read_checkpoint(dsv3)
    assert f.per_layer_expert == {1: 192}
    # layer 0: norm 8 + kv_a 48 + dense MLP 128 = 184; layer 1: kv_a 48 + router 16 + shared expert 32 = 96
    assert f.per_layer_dense == {0: 184, 1: 96}


def test_arch_numbers_from_config(dsv3):
    """The architecture numbers come from config.json, None where it has no such key."""
    f = read_checkpoint(dsv3)
    assert f.model_type == "kimi_k2"
    assert f.arch == {"layers": 2, "routed_experts": 2, "experts_per_token": 1, "heads": 2, "kv_heads": 2,
                      "hidden": 8, "vocab": 32, "mtp_layers": 0, "dense_layers": 1, "moe_intermediate_size": 4,
                      "intermediate_size": 16}


def test_qwen_moe_sharded_over_two_files(tmp_path):
    """Qwen-MoE names over two shards and an index (written with safetensors itself) are all counted once."""
    d = write_config(tmp_path / "qwen", model_type="qwen3_moe", num_hidden_layers=1, num_experts=4,
                     num_experts_per_tok=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=4,
                     moe_intermediate_size=2, vocab_size=16)
    a = np.zeros
    p = "model.layers.0.mlp"
    one = {"model.embed_tokens.weight": a((16, 4), np.float16),            # 64
           "model.layers.0.self_attn.q_proj.weight": a((4, 4), np.float16),  # 16
           f"{p}.gate.weight": a((4, 4), np.float32)}                        # 16 (router)
    two = {f"{p}.shared_expert.gate_proj.weight": a((2, 4), np.float16),     # 8
           "lm_head.weight": a((16, 4), np.float16)}                         # 64
    for e in range(4):  # experts 0-1 in the first shard, 2-3 in the second
        for proj, shape in (("gate_proj", (2, 4)), ("up_proj", (2, 4)), ("down_proj", (4, 2))):
            (one if e < 2 else two)[f"{p}.experts.{e}.{proj}.weight"] = a(shape, np.float16)
    save_file(one, str(d / "model-00001-of-00002.safetensors"))
    save_file(two, str(d / "model-00002-of-00002.safetensors"))
    weight_map = {**{k: "model-00001-of-00002.safetensors" for k in one},
                  **{k: "model-00002-of-00002.safetensors" for k in two}}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    f = read_checkpoint(d)
    # 4 experts × 3 projections × 2×4 = 96; dense 64 + 16 + 16 + 8 + 64 = 168
    assert f.totals == {"dense": 168, "routed_expert": 96, "mtp": 0, "vision": 0, "total": 264}
    assert (f.shards, f.complete, f.per_layer_expert, f.arch["routed_experts"]) == (2, True, {0: 96}, 4)
    assert f.dtypes == {"F16": 16, "F32": 1}


def test_fused_expert_tensors_are_routed(tmp_path):
    """Qwen3-VL-MoE style fused experts.gate_up_proj / experts.down_proj are routed experts; shared_expert is not."""
    d = write_config(tmp_path / "fused", num_hidden_layers=1)
    p = "model.language_model.layers.0.mlp"
    save_file({f"{p}.experts.gate_up_proj": np.zeros((4, 8, 4), np.float16),      # 4 experts × 8×4 = 128
               f"{p}.experts.down_proj": np.zeros((4, 2, 8), np.float16),         # 4 experts × 2×8 = 64
               f"{p}.shared_expert.down_proj.weight": np.zeros((8, 2), np.float16),  # 16 dense
               f"{p}.shared_expert_gate.weight": np.zeros((1, 8), np.float16)},       # 8 dense
              str(d / "model.safetensors"))
    f = read_checkpoint(d)
    assert (f.totals["routed_expert"], f.totals["dense"], f.per_layer_expert) == (192, 24, {0: 192})


def test_shard_missing_from_index(tmp_path):
    """A shard the index names but the directory lacks is reported and the count is incomplete."""
    d = write_config(tmp_path / "m", num_hidden_layers=1)
    save_file({"model.embed_tokens.weight": np.zeros((4, 2), np.float32)}, str(d / "model-00001-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    f = read_checkpoint(d)
    assert f.complete is False and f.totals["total"] == 8
    assert any("model-00002-of-00002.safetensors: listed in the index but missing" in p for p in f.problems)


# quantized layouts ---------------------------------------------------------------------------------------

def test_fp8_block_scaled_counts_weights_and_excludes_scales(tmp_path):
    """DeepSeek-V3 FP8: F8_E4M3 weights count prod(shape); their weight_scale_inv tensors are excluded and counted."""
    d = write_config(tmp_path / "fp8", **DSV3_CONFIG, quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"})
    t = dsv3_tensors("F8_E4M3")
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                 "model.layers.0.input_layernorm.weight"):
        t[name] = ("BF16", t[name][1])  # embeddings and norms stay BF16
    linears = [n for n, (dt, _) in t.items() if dt == "F8_E4M3"]
    for n in linears:
        t[n + "_scale_inv"] = ("F32", (1, 1))
    write_raw(d / "model.safetensors", t)
    f = read_checkpoint(d)
    # the same 992 logical params as the BF16 checkpoint; 6 expert + 5 dense linears carry a scale
    assert f.totals == {"dense": 800, "routed_expert": 192, "mtp": 0, "vision": 0, "total": 992}
    assert f.excluded_scale_tensors == 11 and f.complete
    assert f.dtypes == {"F8_E4M3": 11, "BF16": 4, "F32": 11} and f.quant_method == "fp8"


def test_gptq_int4_qweight_counted_times_eight(tmp_path):
    """GPTQ: an I32 qweight holds 8 INT4 values per element (bits 4); qzeros, scales and g_idx are excluded."""
    d = write_config(tmp_path / "gptq", num_hidden_layers=1, hidden_size=8, moe_intermediate_size=8,
                     quantization_config={"bits": 4, "group_size": 8, "quant_method": "gptq"})
    t = {}
    for proj in ("gate_proj", "up_proj", "down_proj"):  # each 8 in × 8 out, packed along in: qweight [8/8, 8]
        p = f"model.layers.0.mlp.experts.0.{proj}"
        t[f"{p}.qweight"] = np.zeros((1, 8), np.int32)
        t[f"{p}.qzeros"] = np.zeros((1, 1), np.int32)
        t[f"{p}.scales"] = np.zeros((1, 8), np.float16)
        t[f"{p}.g_idx"] = np.zeros((8,), np.int32)
    save_file(t, str(d / "model.safetensors"))
    f = read_checkpoint(d)
    # 3 projections × 8 stored int32 × 8 = 192 = 3 × 8×8
    assert f.totals["routed_expert"] == 192 and f.totals["total"] == 192
    assert (f.excluded_scale_tensors, f.complete, f.unknown, f.problems) == (9, True, [], [])


def test_compressed_tensors_weight_packed(tmp_path):
    """Kimi-K2 INT4 (compressed-tensors pack-quantized): weight_packed ×8; weight_scale and weight_shape excluded."""
    d = write_config(tmp_path / "kimi", **{**DSV3_CONFIG, "moe_intermediate_size": 8, "quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 8}}}}})
    t = {}
    for e in range(2):
        for proj in ("gate_proj", "up_proj", "down_proj"):  # each 8×8, packed along columns: [8, 8/8]
            p = f"model.layers.1.mlp.experts.{e}.{proj}"
            t[f"{p}.weight_packed"] = np.zeros((8, 1), np.int32)
            t[f"{p}.weight_scale"] = np.zeros((8, 1), np.float16)
            t[f"{p}.weight_shape"] = np.array([8, 8], np.int32)
    save_file(t, str(d / "model.safetensors"))
    f = read_checkpoint(d)
    # 2 experts × 3 projections × 8 stored int32 × 8 = 384 = 2 × 3 × 8×8
    assert f.totals["routed_expert"] == 384 and f.per_layer_expert == {1: 384}
    assert (f.excluded_scale_tensors, f.complete, f.problems) == (12, True, [])


def test_packed_names_without_quantization_config_are_int4(tmp_path):
    """With no quantization_config, qweight / weight_packed follow the INT4 convention: 8 per I32, 2 per U8."""
    d = write_config(tmp_path / "conv", num_hidden_layers=1)
    save_file({"model.layers.0.mlp.experts.0.gate_proj.qweight": np.zeros((1, 8), np.int32),       # 8 × 8 = 64
               "model.layers.0.mlp.experts.0.up_proj.weight_packed": np.zeros((8, 4), np.uint8)},  # 32 × 2 = 64
              str(d / "model.safetensors"))
    f = read_checkpoint(d)
    assert (f.totals["routed_expert"], f.complete) == (128, True)


def test_modelopt_nvfp4_weight_counted_times_two(tmp_path):
    """ModelOpt NVFP4: a U8 weight holds 2 FP4 values per byte; weight_scale, weight_scale_2, input_scale excluded."""
    d = write_config(tmp_path / "nvfp4", num_hidden_layers=1,
                     quantization_config={"quant_method": "modelopt", "quant_algo": "NVFP4"})
    p = "model.layers.0.mlp.experts.0.down_proj"
    write_raw(d / "model.safetensors", {f"{p}.weight": ("U8", (8, 4)),          # 8×8 FP4 = 64
                                        f"{p}.weight_scale": ("F8_E4M3", (8, 1)),
                                        f"{p}.weight_scale_2": ("F32", ()),
                                        f"{p}.input_scale": ("F32", ())})
    f = read_checkpoint(d)
    assert (f.totals["routed_expert"], f.excluded_scale_tensors, f.complete) == (64, 3, True)


def test_deepseek_v4_native_fp4_experts(tmp_path):
    """DeepSeek-V4 release layout: I8 FP4 experts (expert_dtype fp4) ×2, `.scale` excluded, tid2eid a buffer."""
    d = write_config(tmp_path / "ds4", model_type="deepseek_v4", num_hidden_layers=1, n_routed_experts=1,
                     hidden_size=8, moe_intermediate_size=4, vocab_size=16, num_nextn_predict_layers=1,
                     expert_dtype="fp4", quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    write_raw(d / "model.safetensors", {
        "embed.weight": ("BF16", (16, 8)),                         # 128 embedding
        "layers.0.attn.wq_a.weight": ("F8_E4M3", (4, 8)),          # 32
        "layers.0.attn.wq_a.scale": ("F8_E8M0", (1, 1)),
        "layers.0.ffn.gate.weight": ("BF16", (1, 8)),              # 8
        "layers.0.ffn.gate.tid2eid": ("I32", (16, 1)),             # buffer
        "layers.0.ffn.experts.0.w1.weight": ("I8", (4, 4)),        # 4×8 FP4 = 32
        "layers.0.ffn.experts.0.w1.scale": ("F8_E8M0", (4, 1)),
        "layers.0.ffn.experts.0.w2.weight": ("I8", (8, 2)),        # 8×4 FP4 = 32
        "layers.0.ffn.experts.0.w2.scale": ("F8_E8M0", (8, 1)),
        "layers.0.hc_attn_scale": ("F32", (3,)),                   # 3 (a parameter, not a quant scale)
        "mtp.0.e_proj.weight": ("BF16", (8, 8)),                   # 64 mtp
        "head.weight": ("BF16", (16, 8)),                          # 128 output
    })
    f = read_checkpoint(d)
    # routed 32 + 32 = 64; dense 128 + 32 + 8 + 3 + 128 = 299; mtp 64
    assert f.totals == {"dense": 299, "routed_expert": 64, "mtp": 64, "vision": 0, "total": 427}
    assert (f.embedding, f.output, f.excluded_scale_tensors, f.buffers) == (128, 128, 3, ["layers.0.ffn.gate.tid2eid"])
    assert f.complete and not f.problems


def test_unknown_integer_layout_is_reported_not_guessed(tmp_path):
    """An I8 weight with no quantization_config is listed in unknown, left out of the count, complete is False."""
    d = write_config(tmp_path / "int8", num_hidden_layers=1)
    save_file({"model.layers.0.mlp.down_proj.weight": np.zeros((4, 2), np.int8),
               "model.layers.0.input_layernorm.weight": np.zeros((4,), np.float32)}, str(d / "model.safetensors"))
    f = read_checkpoint(d)
    assert f.unknown == [("model.layers.0.mlp.down_proj.weight", "I8", (4, 2))]
    assert f.totals["total"] == 4 and f.complete is False


def test_mixed_bit_widths_are_unknown(tmp_path):
    """compressed-tensors groups of 4 and 8 bits: which group a packed weight is in is not guessed."""
    d = write_config(tmp_path / "mixed", num_hidden_layers=1, quantization_config={
        "quant_method": "compressed-tensors", "config_groups": {
            "a": {"weights": {"num_bits": 4}}, "b": {"weights": {"num_bits": 8}}}})
    save_file({"model.layers.0.mlp.down_proj.weight_packed": np.zeros((4, 1), np.int32)}, str(d / "model.safetensors"))
    f = read_checkpoint(d)
    assert [u.name for u in f.unknown] == ["model.layers.0.mlp.down_proj.weight_packed"] and not f.complete


def test_integer_buffer_is_not_a_weight(tmp_path):
    """An I64 position_ids buffer is listed in buffers, not counted, and leaves the count complete."""
    d = write_config(tmp_path / "buf", num_hidden_layers=1)
    save_file({"vision_model.embeddings.position_ids": np.zeros((1, 4), np.int64),
               "vision_model.embeddings.patch_embedding.weight": np.zeros((4, 3), np.float32)},
              str(d / "model.safetensors"))
    f = read_checkpoint(d)
    assert (f.totals["vision"], f.buffers, f.unknown, f.complete) == (
        12, ["vision_model.embeddings.position_ids"], [], True)


def test_expert_shape_mismatch_is_flagged(tmp_path):
    """An I8 expert read as 8-bit (fp8 config, no expert_dtype) holds half of hidden × moe_intermediate: warned."""
    d = write_config(tmp_path / "odd", num_hidden_layers=1, hidden_size=8, moe_intermediate_size=4,
                     quantization_config={"quant_method": "fp8"})
    save_file({"layers.0.ffn.experts.0.w1.weight": np.zeros((4, 4), np.int8)}, str(d / "model.safetensors"))
    f = read_checkpoint(d)
    assert f.totals["routed_expert"] == 16
    assert any(p.startswith("warning: 1 routed-expert weight(s) do not hold hidden_size × moe_intermediate_size = "
                            "8 × 4") for p in f.problems)


# MTP and vision ------------------------------------------------------------------------------------------

def test_glm_mtp_layer_at_num_hidden_layers(tmp_path):
    """GLM style: model.layers.N with N == num_hidden_layers is MTP (its experts too), not a decoder layer."""
    d = write_config(tmp_path / "glm", model_type="glm_moe_dsa", num_hidden_layers=1, num_nextn_predict_layers=1)
    save_file({"model.layers.0.self_attn.o_proj.weight": np.zeros((8, 8), np.float32),   # 64 dense
               "model.layers.0.mlp.experts.0.down_proj.weight": np.zeros((8, 4), np.float32),  # 32 routed
               "model.layers.1.eh_proj.weight": np.zeros((8, 16), np.float32),           # 128 mtp
               "model.layers.1.mlp.experts.0.down_proj.weight": np.zeros((8, 4), np.float32)},  # 32 mtp
              str(d / "model.safetensors"))
    f = read_checkpoint(d)
    assert f.totals == {"dense": 64, "routed_expert": 32, "mtp": 160, "vision": 0, "total": 256}
    assert (f.mtp_routed_expert, f.per_layer_expert, f.per_layer_dense) == (32, {0: 32}, {0: 64})
    assert f.arch["mtp_layers"] == 1


def test_qwen3_5_vision_and_mtp_by_name(tmp_path):
    """Qwen3.5 style: text_config holds the numbers; visual.* is vision and mtp.* is MTP, both apart from dense."""
    d = write_config(tmp_path / "q35", model_type="qwen3_5_moe", tie_word_embeddings=False,
                     text_config={"model_type": "qwen3_5_moe_text", "num_hidden_layers": 40, "num_experts": 256,
                                  "hidden_size": 2048, "mtp_num_hidden_layers": 1},
                     vision_config={"depth": 27, "hidden_size": 1152})
    save_file({"model.visual.blocks.0.attn.qkv.weight": np.zeros((24, 8), np.float16),    # 192 vision
               "model.visual.merger.linear_fc1.weight": np.zeros((8, 8), np.float16),     # 64 vision
               "mtp.fc.weight": np.zeros((8, 16), np.float16),                            # 128 mtp
               "mtp.layers.0.mlp.experts.0.up_proj.weight": np.zeros((2, 8), np.float16),  # 16 mtp
               "model.language_model.layers.0.linear_attn.in_proj_z.weight": np.zeros((4, 8), np.float16)},  # 32
              str(d / "model.safetensors"))
    f = read_checkpoint(d)
    assert f.totals == {"dense": 32, "routed_expert": 0, "mtp": 144, "vision": 256, "total": 432}
    assert (f.model_type, f.arch["layers"], f.arch["routed_experts"], f.arch["mtp_layers"]) == (
        "qwen3_5_moe", 40, 256, 1)
    assert f.per_layer_dense == {0: 32}


def test_kimi_k2_5_style_prefixes(tmp_path):
    """language_model.model.layers / language_model.lm_head are the text model; vision_tower and mm_projector vision."""
    d = write_config(tmp_path / "k25", model_type="kimi_k25", text_config={"model_type": "kimi_k2",
                                                                           "num_hidden_layers": 1})
    save_file({"language_model.model.embed_tokens.weight": np.zeros((16, 4), np.float16),                # 64
               "language_model.model.layers.0.mlp.experts.0.gate_proj.weight": np.zeros((2, 4), np.float16),  # 8
               "language_model.model.layers.0.self_attn.o_proj.weight": np.zeros((4, 4), np.float16),    # 16
               "language_model.lm_head.weight": np.zeros((16, 4), np.float16),                           # 64
               "vision_tower.encoder.blocks.0.wqkv.weight": np.zeros((12, 4), np.float16),               # 48
               "mm_projector.proj.0.weight": np.zeros((4, 4), np.float16)},                              # 16
              str(d / "model.safetensors"))
    f = read_checkpoint(d)
    assert f.totals == {"dense": 144, "routed_expert": 8, "mtp": 0, "vision": 64, "total": 216}
    assert (f.embedding, f.output, f.per_layer_expert, f.per_layer_dense) == (64, 64, {0: 8}, {0: 16})


# reading only the header ---------------------------------------------------------------------------------

def test_truncated_data_section_still_counts(dsv3):
    """A shard cut off right after its header is counted from the header; the truncation is a warning."""
    write_raw(dsv3 / "model.safetensors", dsv3_tensors("BF16"), data="none")
    f = read_checkpoint(dsv3)
    assert f.totals["total"] == 992 and f.complete
    assert any(p.startswith("warning:") and "truncated" in p for p in f.problems)


def test_garbage_data_section_is_never_parsed(dsv3):
    """Random bytes after the header change nothing."""
    write_raw(dsv3 / "model.safetensors", dsv3_tensors("BF16"), data="garbage")
    f = read_checkpoint(dsv3)
    assert (f.totals["total"], f.complete, f.problems) == (992, True, [])


def test_header_read_stops_at_the_header(dsv3, monkeypatch):
    """The shard is opened once and read for exactly 8 + N bytes."""
    import builtins

    shard = str(dsv3 / "model.safetensors")
    (n,) = struct.unpack("<Q", open(shard, "rb").read(8))
    read = []
    real_open = builtins.open

    def spy(file, mode="r", *a, **k):
        fh = real_open(file, mode, *a, **k)
        if str(file) == shard:
            orig = fh.read
            fh.read = lambda size=-1: read.append(len(b := orig(size))) or b
        return fh

    monkeypatch.setattr(builtins, "open", spy)
    read_checkpoint(dsv3)
    assert sum(read) == 8 + n and all(size > 0 for size in read)


def test_git_lfs_pointer_is_reported(tmp_path):
    """A checkpoint whose only shard is a Git LFS pointer holds no weights: refused, saying why and how to fix."""
    d = write_config(tmp_path / "lfs", num_hidden_layers=1)
    (d / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n")
    with pytest.raises(CheckpointError, match="Git LFS pointer") as e:
        read_checkpoint(d)
    assert e.value.fix


def test_hand_written_files_are_real_safetensors(dsv3):
    """The hand-written test shards open in safetensors itself with the dtypes and shapes written."""
    with safe_open(str(dsv3 / "model.safetensors"), framework="numpy") as f:
        s = f.get_slice("model.layers.1.mlp.experts.1.down_proj.weight")
        assert (s.get_dtype(), s.get_shape(), len(list(f.keys()))) == ("BF16", [8, 4], 15)


# cross_check, absence, imports ---------------------------------------------------------------------------

def test_cross_check_reports_a_mismatch(dsv3):
    """A model group number the checkpoint's config.json contradicts gives one line with both numbers."""
    f = read_checkpoint(dsv3)
    group = {"layers": 2, "routed_experts": 256, "experts_per_token": 1, "hidden": 8}
    assert cross_check(f, group) == ["arch.routed_experts: model group says 256, checkpoint config.json says 2"]


def test_cross_check_silent_on_matches_and_absent_keys(dsv3):
    """Matching numbers, a group kv_heads of None (MLA) and keys the config lacks give no line."""
    f = read_checkpoint(dsv3)
    f.arch["vocab"] = None
    group = {"layers": 2, "dense_layers": 1, "routed_experts": 2, "kv_heads": None, "vocab": 163840, "mtp_layers": 0}
    assert cross_check(f, group) == []


def test_no_config_json_returns_none(tmp_path):
    """A directory without config.json (or a path that is no directory) gives None."""
    save_file({"w": np.zeros((2,), np.float32)}, str(tmp_path / "model.safetensors"))
    assert read_checkpoint(tmp_path) is None and read_checkpoint(tmp_path / "absent") is None


def test_to_dict_is_json_ready(dsv3):
    """to_dict keeps the dtype counts and goes through json.dumps."""
    d = json.loads(json.dumps(read_checkpoint(dsv3).to_dict()))
    assert d["dtypes"] == {"BF16": 15} and d["per_layer_expert"] == {"1": 192} and d["totals"]["total"] == 992


def test_import_pulls_in_no_torch_or_safetensors():
    """Importing vrun.estimate.checkpoint loads neither torch, safetensors nor numpy (the planning process stays light)."""
    code = ("import sys, vrun.estimate.checkpoint; "
            "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'safetensors', 'numpy')])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

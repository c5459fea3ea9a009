"""What a decoder layer keeps for backward (vrun/estimate/activations.py), on small hand-written architectures: the
terms as the module's docstring lists them, and where the CP group's sequence is gathered. The real model's step
holds these counts (tests/test_activation_oracle.py)."""
import pytest

from vrun.estimate import activations
from vrun.estimate.activations import LayerBytes

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

MOE = dict(hidden=100, routed_experts=8, experts_per_token=2, expert_ffn_hidden=30, shared_experts=1)


def test_the_moe_block_counts_each_saved_tensor():
    """Norm input 2h, fp32 router input 4h, router logits and scores 8E, ids and probs 16k, permutation 8k; per routed
    copy 2h + 4f + 2f; the shared expert 2h + 8 f_s."""
    h, e, k, f = 100, 8, 2, 30
    want = 2 * h + 4 * h + 8 * e + 16 * k + 8 * k + k * (2 * h + 6 * f) + (2 * h + 8 * f)
    arch = dict(MOE, attention="gqa", layers=1, heads=4, kv_heads=2, head_dim=16)
    s = activations.shape(arch, 1)
    gqa = 4 * h + 4 * 16 * 12 + 12 * 2 * 16
    assert s.mean.local == pytest.approx(want + gqa)
    assert s.mean.gathered == 0 and not s.measured        # plain GQA: counted, not measured


def test_mla_gathers_under_cp_only_when_the_value_head_differs():
    """Kimi-K2's MLA runs torch's attention on the CP-gathered q, k, v when v ≠ nope + rope (Megatron Lite mla.py);
    with equal heads TE's ring attention keeps them local."""
    base = dict(MOE, attention="mla", layers=2, heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8,
                qk_rope_head_dim=4)
    core = 4 * (4 * 12 + 4 * 8 + 4)
    unequal = dict(base, v_head_dim=8)
    assert activations.shape(unequal, 1).mean.gathered == 0
    assert activations.shape(unequal, 2).mean.gathered == pytest.approx(core)
    assert activations.shape(unequal, 2).measured
    equal = dict(base, v_head_dim=12)
    assert activations.shape(equal, 2).mean.gathered == 0


def test_kept_and_in_backward_scale_by_tp_and_cp():
    """Local bytes per own token / TP; gathered bytes × CP / TP; the backward's gradients on top."""
    b = LayerBytes(local=10.0, gathered=3.0, backward_local=1.0, backward_gathered=2.0)
    assert b.kept(100, 2, 4) == pytest.approx(100 * (10 + 3 * 4) / 2)
    assert b.in_backward(100, 2, 4) == pytest.approx(b.kept(100, 2, 4) + 100 * (1 + 2 * 4) / 2)


def test_dsa_scores_each_sequence_whole():
    """GLM-5's DSA indexer holds fp32 scores [seq, seq] for one packed sequence at a time: 4 B per (sequence
    length)², not per token."""
    glm = dict(MOE, attention="mla_dsa", layers=1, heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8,
               qk_rope_head_dim=4, v_head_dim=8, index_heads=2, index_head_dim=8, index_topk=16)
    s = activations.shape(glm, 2)
    assert s.squared == 4.0 and s.mean.gathered > 0 and s.measured
    assert activations.shape(dict(glm, attention="mla"), 2).squared == 0.0


def test_the_hybrid_interleaves_full_attention():
    """Qwen3.5: every full_attention_interval-th layer is full attention, the rest Gated DeltaNet; the mean weighs
    them by count and the biggest is the larger in its backward."""
    arch = dict(MOE, attention="gdn_hybrid", layers=8, full_attention_interval=4, heads=4, kv_heads=2, head_dim=16,
                gdn_k_heads=2, gdn_v_heads=4, gdn_head_dim=16, attn_output_gate=True)
    s = activations.shape(arch, 1)
    gqa = activations.shape(dict(arch, attention="gqa"), 1).mean.local         # a layer of each kind alone
    gdn = activations.shape(dict(arch, full_attention_interval=arch["layers"] + 1), 1).mean.local
    assert s.mean.local == pytest.approx((2 * gqa + 6 * gdn) / 8)
    assert s.biggest.local == max(gqa, gdn)


def test_missing_facts_give_no_count():
    """Without the facts a count needs, no shape (the estimate falls back to its rule of thumb, approximated)."""
    assert activations.shape({"attention": "mla", "layers": 2}, 1) is None


def test_csa_layers_count_their_compression_and_the_clamped_moe():
    """DeepSeek-V4: per layer the CSA terms by its compress ratio (0 window only; 4 compressed, overlapping, with the
    indexer; 128 compressed), the mHC streams around both sub-blocks, and the MoE's fp32 clamped SwiGLU (24f + 2f per
    routed copy beside the token's 2h, 22·f_s shared, 18E router); backward the query's gradient 2·qd."""
    h, m, d, heads, ql, ol, og, w = 64, 4, 16, 4, 32, 8, 2, 8
    k, f, e, idx, topk = 2, 30, 8, 4, 16
    arch = dict(MOE, attention="csa", layers=3, heads=heads, head_dim=d, hidden=h, q_lora_rank=ql, o_lora_rank=ol,
                o_groups=og, sliding_window=w, hc_mult=m, index_head_dim=idx, index_topk=topk,
                compress_ratios=[0, 4, 128, 0])
    qd = heads * d
    mhc = 2 * (2 * m * h + 20 * (4 * m * m + 8 * m)) + 8 * h
    base = 2 * h + 4 * ql + 14 * qd + 4 * d + 4 * w + 2 * og * ol + mhc
    moe = 2 * h + 18 * e + k * (2 * h + 26 * f) + 22 * f
    layers = [base, base + 2 * h + 16 * d + 16 * idx + 4 * topk, base + 2 * h + 8 * d]
    s = activations.shape(arch, 2)
    assert s.mean.local == pytest.approx(sum(layers) / 3 + moe) and s.mean.gathered == 0
    assert s.biggest.local == pytest.approx(layers[1] + moe) and s.biggest.backward_local == 2 * qd
    assert s.measured and s.kind == "csa"

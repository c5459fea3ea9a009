"""Megatron Lite's real model as the judge of the plan's activations + logits (tests/support/mlite_activation_oracle.py
measures them): the busiest stage of a model at its default mesh, built as the memory oracle builds it, runs one
micro-batch of the plan's per-GPU token budget forward and backward on fake tensors under torch's MemTracker, with
the launchers' recompute and without it. What has no CPU path and stands in for it is listed in the oracle's
docstring.

What is compared: the measured peak above the training state (activations and temporaries) against the plan's
activations + logits for that stage (the plan's FSDP2 transient is the unsharded layers and their gradients, which
this step does not build: no FSDP2 wrapping here). Models whose step does not run here are in BLOCKED, with what
blocks them.

Needs a Megatron-LM checkout (MLITE_ROOT or VRUN_TEST_MLITE_ROOT), torch and megatron-core; skips saying which is
missing.
"""
from __future__ import annotations

import functools
import json
import subprocess

import pytest

from conftest import PY, ROOT, needs_real_mlite, real_mlite_root
from test_memory_oracle import cases_for, overrides
from test_mlite_oracle import _has_megatron_core
from vrun.estimate.memory import GIB
from vrun.planning.phases import memory_inputs

pytestmark = [needs_real_mlite, pytest.mark.skipif(
    not _has_megatron_core(),
    reason="megatron-core is not installed: Megatron Lite's model code imports it "
           "(pip install --no-deps megatron-core==0.16.1; the a6ef5009 CI leg has it)")]

TOLERANCE = 0.20
MEASURED = ["qwen3_5_35b"]
# not measured yet, and what stops each (tried once, full recompute, the busiest stage)
BLOCKED = {
    "glm5_1": "DSA indexer: dsa_kernels._indexer_topk_bshd needs cudnn-frontend's DSA namespace (CUDA); "
              "no stand-in yet",
    "kimi_k2_6": "the step runs but measures ~12 TB above the state (TEMP 8.8 TB): some attention path "
                 "materialises T x T scores outside te.DotProductAttention; not traced",
    "deepseek_v4_flash": "the oracle passes MRoPE-style (3, B, S) position ids; csa.build_rope_cos_sin wants (B, S)",
    "deepseek_v4_pro": "as deepseek_v4_flash",
}


def run_oracle(cases: list[dict]) -> list[dict]:
    lite = real_mlite_root() / "experimental" / "lite"
    proc = subprocess.run([PY, "-W", "ignore", str(ROOT / "tests" / "support" / "mlite_activation_oracle.py")],
                          input=json.dumps(cases), capture_output=True, text=True, timeout=1200, cwd=ROOT,
                          env={"PYTHONPATH": str(lite), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@functools.lru_cache(maxsize=None)
def measured(model: str) -> tuple:
    p, cases = cases_for(model)
    inputs = memory_inputs(p.config, p.entrypoint, p.verl)
    busiest = p.memory.stage
    case = dict(cases[busiest], tokens_per_gpu=int(inputs["tokens_per_gpu"]))
    runs = run_oracle([dict(case, recompute=["full"]), dict(case, recompute=[])])
    return p, p.memory.summary()["stages"][busiest], runs


@pytest.mark.parametrize("model", MEASURED)
def test_the_step_runs_and_recompute_is_applied(model):
    """Both steps run on the real model; the launchers' full recompute keeps a fraction of what no recompute
    keeps (Qwen3.5-35B, 40 layers: 6.4 against 45 GiB), so the recompute spec reached Megatron Lite's layers."""
    _, _, runs = measured(model)
    assert all(r["ok"] for r in runs), [r.get("error") for r in runs]
    full, none = runs
    assert 0 < 4 * full["above_state_bytes"] < none["above_state_bytes"], (full, none)


@pytest.mark.parametrize("model", MEASURED)
def test_plan_activations_and_logits_agree_with_the_measured_step(model):
    """With the launchers' full recompute: the plan's activations + logits within 20% of the measured peak above
    the training state."""
    _, stage, runs = measured(model)
    full = runs[0]
    assert full["ok"], full.get("error")
    assert difference(stage, full) is None, difference(stage, full)


def difference(stage: dict, run: dict):
    """The plan's activations + logits against the measured peak above the training state; None within 20%."""
    ours, real = (stage["activations_gib"] + stage["logits_gib"]) * GIB, run["above_state_bytes"]
    if abs(ours - real) <= TOLERANCE * max(ours, real):
        return None
    return f"plan {ours / GIB:.2f} GiB, measured {real / GIB:.2f} GiB ({run['above_state_by_category']})"


def test_a_planted_mistake_is_named():
    """A plan that forgot the logits (the loss's bf16 logits and fp32 copy) is named."""
    _, stage, runs = measured(MEASURED[0])
    assert difference(dict(stage, logits_gib=0.0), runs[0]) is not None

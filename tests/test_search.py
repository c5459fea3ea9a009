"""mesh=auto returns only meshes the plan accepts, includes the launchers' presets, and is fast enough."""
import random

import pytest

from conftest import MODELS, compose, plan, problems_of, runner
from vrun.estimate import meshes, search
from vrun.entrypoints import PPO
from vrun.entrypoints.ppo import ppo_batch_problems
from vrun.estimate.mesh import Mesh, Rules, mesh_problems
from vrun.config.schema import Arch

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml


def model_facts(model):
    m = compose([f"model={model}"])["model"]
    return m, Arch.of(m["arch"])


def rules_of(model, m, arch, use_deepep=False):
    return Rules(model, arch, tuple(m["tp_allowed"]), tuple(m["etp_allowed"]), use_deepep)


# DeepSeek-V4-Pro under RL on its default 512 GPUs: the launcher's rollout TP8 cannot hold its weights and the
# training estimate is over 80 GiB; planned with a replica that fits and run.allow_memory_overrun
FITTED = {"deepseek_v4_pro": ["verl.actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                              "+verl.actor_rollout_ref.rollout.data_parallel_size=16", "run.allow_memory_overrun=true"]}


def not_memory(lines: list[str]) -> list[str]:
    """The errors other than the memory verdicts (a mesh that plans may still not hold the model)."""
    return [x for x in lines if not x.startswith("error: memory=")]


@pytest.mark.parametrize("model", MODELS)
def test_every_result_passes_the_plan_checks(model):
    """Property: for random GPU counts each mesh returned passes mesh_problems and the batch checks."""
    m, arch = model_facts(model)
    verl = plan([f"model={model}", "mode=plan"] + FITTED.get(model, [])).verl
    rnd = random.Random(model)
    for nnodes in rnd.sample([1, 2, 3, 4, 6, 8, 16, 32], 4):
        for mesh in meshes.valid_meshes(rules_of(model, m, arch), nnodes, 8, verl, PPO()):
            assert mesh_problems(mesh, arch, m["tp_allowed"], m["etp_allowed"], model) == [], mesh
            assert ppo_batch_problems(verl, mesh) == [], mesh


def test_results_plan_end_to_end():
    """A sample of auto's results plans through the runner's own path."""
    m, arch = model_facts("qwen3_5_35b")
    verl = plan(["model=qwen3_5_35b", "mode=plan"]).verl
    found = meshes.valid_meshes(rules_of("qwen3_5_35b", m, arch), 1, 8, verl, PPO())
    for mesh in random.Random(1).sample(found, min(6, len(found))):
        ov = [f"mesh.{k}={getattr(mesh, k)}" for k in ("tp", "pp", "ep", "cp", "etp")]
        assert problems_of(["model=qwen3_5_35b", "mode=plan"] + ov) == [], ov


@pytest.mark.parametrize("model,preset", [("glm5_1", Mesh(32, 8, pp=8, ep=8, cp=8)),
                                          ("kimi_k2_6", Mesh(32, 8, pp=8, ep=8, cp=8)),
                                          ("qwen3_5_35b", Mesh(1, 8, ep=8, cp=8)),
                                          ("deepseek_v4_flash", Mesh(16, 8, pp=4, ep=8, cp=4)),
                                          ("deepseek_v4_pro", Mesh(64, 8, pp=8, ep=16, cp=4))])
def test_launcher_presets_are_among_the_results(model, preset):
    """The launchers' own meshes are found where they are valid."""
    m, arch = model_facts(model)
    assert preset in meshes.valid_meshes(rules_of(model, m, arch), preset.nnodes, 8)


def test_auto_prints_choice_alternatives_and_memory(tmp_path):
    """model=kimi_k2_6 mesh=auto mesh.nnodes=32: a chosen mesh, alternatives and a memory breakdown."""
    proc = runner("model=kimi_k2_6", "mesh=auto", "mesh.nnodes=32", "algo=grpo", "mode=plan",
                  f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "valid meshes searched in" in out and "chosen mesh.tp=" in out and out.count("alternative ") == 5
    assert "memory  per GPU, " in out and "GiB training" in out and "of 80.0 GiB" in out  # one stage or more


def test_auto_refuses_when_nothing_fits_with_the_lowest_peak_and_the_gpus_that_fit(tmp_path):
    """Kimi-K2.6 on 64 GPUs: no mesh fits; one line says so, shows the lowest-peak mesh as pasteable overrides and
    how many GPUs would fit. On 96 GPUs (nothing fits either) run.allow_memory_overrun plans the lowest-peak mesh
    the refusal named, the alternatives in order of peak."""
    from vrun.core.problems import PlanError

    proc = runner("model=kimi_k2_6", "mesh=auto", "mesh.nnodes=8", "algo=grpo", "mode=plan",
                  f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert "no mesh of 8×8=64 GPUs fits kimi_k2_6" in line and "the lowest band is" in line
    assert "mesh.nnodes=16 (128 GPUs" in line.split("; fix: ")[1]
    ov = ["model=kimi_k2_6", "mesh=auto", "mesh.nnodes=12", "mode=plan"]
    with pytest.raises(PlanError) as e:
        plan(ov)
    lowest = e.value.problems[-1].why.split(" GiB with ")[1].split()
    allowed = plan(ov + ["run.allow_memory_overrun=true"])
    assert not allowed.memory.fits and allowed.search.chosen["overrides"].split() == lowest
    peaks = [a["peak_gib"] for a in [allowed.search.chosen, *allowed.search.alternatives]]
    assert peaks == sorted(peaks)


def test_ranking_is_one_list():
    """mesh=auto's ranking keys are one list, in order, and the plan's objective names them."""
    names = [n for n, _ in search.RANKING]
    assert names[:3] == ["fits in memory", "when it does not fit, the lower peak (band high end)",
                         "lower predicted step time"]
    assert all(n in search.MeshSearch.objective for n in names)


@pytest.mark.parametrize("model", ["qwen3_5_35b", "kimi_k2_6"])
def test_auto_equals_a_plan_of_its_choice(model, tmp_path):
    """mesh=auto sets the chosen mesh's keys (and the rollout TP·DP chosen beside it) in the tree it already built:
    verl's config and the overrides equal those of a plan given that mesh and rollout."""
    nodes = ["mesh.nnodes=32"] if model == "kimi_k2_6" else []   # no mesh of one node holds Kimi
    auto = plan([f"model={model}", "mesh=auto", "mode=plan"] + nodes, run_dir=str(tmp_path / "r"))
    chosen = plan([f"model={model}", "mesh=auto", "mesh.search=false", "mode=plan"] + nodes
                  + auto.search.chosen["overrides"].split(), run_dir=str(tmp_path / "r"))
    assert auto.verl == chosen.verl
    assert sorted(o.cli() for o in auto.request.overrides) == sorted(o.cli() for o in chosen.request.overrides)


def test_auto_prefers_what_fits():
    """With less GPU memory than the roomy choice's band needs, the choice moves to a mesh whose band fits (a GPU part
    without a time estimate: the memory and communication ranking alone chooses, whose first mesh is the roomiest)."""
    base = ["model=kimi_k2_6", "mesh=auto", "mesh.nnodes=32", "mode=plan", "cluster.gpu=X9",
            "verl.actor_rollout_ref.rollout.gpu_memory_utilization=0.6"]
    roomy = plan(base + ["cluster.gpu_mem_gib=80"])
    assert roomy.memory.fits and roomy.memory.high > roomy.memory.rollout   # the training band decides here
    limit = int(roomy.memory.high / 2 ** 30) - 1
    tight = plan(base + [f"cluster.gpu_mem_gib={limit}"])
    assert tight.memory.fits and tight.memory.high <= limit * 2 ** 30
    assert tight.mesh != roomy.mesh


def test_mesh_error_lists_valid_neighbours(tmp_path):
    """An invalid mesh's error is followed by valid meshes one and two knobs away, as overrides."""
    proc = runner("model=glm5_1", "mesh.cp=3", "mode=plan", f"hydra.run.dir={tmp_path}/r")
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("error: mesh.cp=3")
    one = next(line for line in lines if line.startswith("valid meshes, one change: "))
    two = next(line for line in lines if line.startswith("valid meshes, two changes: "))
    for option in one.split(": ", 1)[1].split(" | ") + two.split(": ", 1)[1].split(" | "):
        assert not_memory(problems_of(["model=glm5_1", "mode=plan"] + option.split())) == [], option


def test_deepep_hints_keep_etp_one(tmp_path):
    """With use_deepep the hints after a bad ETP offer only meshes deepep allows (ETP 1), and each plans."""
    ov = ["model=kimi_k2_6", "mesh.etp=3", "engine.impl_cfg.use_deepep=true", "mode=plan"]
    proc = runner(*ov, f"hydra.run.dir={tmp_path}/r")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and any("use_deepep excludes expert tensor parallelism" in line for line in lines)
    options = [o for line in lines if line.startswith("valid meshes, ") for o in line.split(": ", 1)[1].split(" | ")]
    assert options and all("mesh.etp=1" in o for o in options), options
    for option in options:
        assert not_memory(problems_of(ov + option.split())) == [], option


def test_search_under_100ms_for_512_gpus():
    """All valid meshes for 512 GPUs with estimates: the plan records the search time (bench reports it)."""
    p = plan(["model=kimi_k2_6", "mesh=auto", "mesh.nnodes=64", "mode=plan"])
    assert p.search.valid_meshes > 1000 and p.search.search_ms > 0


def tiny_kimi_checkpoint(tmp_path):
    import json

    import numpy as np
    from safetensors.numpy import save_file

    d = tmp_path / "kimi"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "kimi_k2", "num_hidden_layers": 2, "hidden_size": 8,
                                               "n_routed_experts": 4, "num_experts_per_tok": 2,
                                               "num_attention_heads": 64, "vocab_size": 16,
                                               "first_k_dense_replace": 1}))
    t = {"model.embed_tokens.weight": np.zeros((16, 8), np.float32),              # 128
         "lm_head.weight": np.zeros((16, 8), np.float32),                         # 128
         "model.layers.0.mlp.down_proj.weight": np.zeros((8, 32), np.float32),    # dense layer: 256
         "model.layers.1.mlp.gate.weight": np.zeros((4, 8), np.float32)}          # router: 32
    for e in range(4):                                                            # 4 experts × 3 × 8×4 = 384
        for proj in ("gate_proj", "up_proj", "down_proj"):
            t[f"model.layers.1.mlp.experts.{e}.{proj}.weight"] = np.zeros((8, 4), np.float32)
    save_file(t, str(d / "model.safetensors"))
    return d


def test_plan_reports_exact_counts_from_a_checkpoint(tmp_path, monkeypatch):
    """With a checkpoint on disk the plan reads its headers: exact counts, the estimate from them, and the
    model group's facts cross-checked (here the tiny checkpoint differs on purpose)."""
    monkeypatch.setenv("KIMI_K2_6_MODEL_PATH", str(tiny_kimi_checkpoint(tmp_path)))
    p = plan(["model=kimi_k2_6", "mesh=8gpu", "mesh.cp=1", "mode=plan"], run_dir=str(tmp_path / "r"))
    assert p.checkpoint.totals["routed_expert"] == 384
    assert p.checkpoint.totals["dense"] == 128 + 128 + 256 + 32
    assert p.memory.params_source.startswith("checkpoint")
    assert any("arch.routed_experts: model group says 384, checkpoint config.json says 4" in w.why
               for w in p.warnings)


@pytest.mark.parametrize("mesh", [["mesh=8gpu", "mesh.cp=1"], ["mesh=auto", "mesh.nnodes=1"]])
def test_checkpoint_counts_without_a_kv_fact_plan_without_the_rollout_estimate(tmp_path, monkeypatch, mesh):
    """Counts from a checkpoint but a KV fact unset in the model group: the plan (fixed mesh and mesh=auto) has
    its training estimate, no rollout KV estimate, and a warning naming the fact, not a Python error."""
    monkeypatch.setenv("KIMI_K2_6_MODEL_PATH", str(tiny_kimi_checkpoint(tmp_path)))
    p = plan(["model=kimi_k2_6", "model.arch.kv_lora_rank=null", *mesh, "mode=plan"], run_dir=str(tmp_path / "r"))
    assert p.memory is not None and p.memory.rollout_detail is None
    assert any(w.key == "model.arch.kv_lora_rank" and "no rollout estimate" in w.why for w in p.warnings)


# ---------------------------------------------------------------- ranked by the predicted step time

def memory_only(p):
    """The meshes of a plan's search ranked without the time entry (the memory estimate alone)."""
    from vrun.estimate import memory
    from vrun.planning import phases
    from vrun.planning import plan as planning

    config, ep = p.config, p.entrypoint
    rules = planning.rules_of(config, ep, p.verl)
    mesh = Mesh(config.mesh.nnodes, config.mesh.gpus_per_node)
    from vrun.estimate import rollout

    tps = rollout.choices(mesh.world, mesh.gpus_per_node, config.model.arch.facts(), phases.rollout_ep(p.verl) > 1)
    params, _, _, _ = planning.model_params(config, ep, None, [], p.verl)
    params = planning.with_built_mtp(params, config, ep, p.verl)
    inputs = phases.memory_inputs(config, ep, p.verl)
    valid = meshes.valid_meshes(rules, mesh.nnodes, mesh.gpus_per_node, p.verl, ep, tps)
    return search.rank(valid, lambda m: memory.estimate(params, m, **inputs))


def test_a_faster_predicted_mesh_that_fits_wins():
    """Kimi-K2.6 on 256 GPUs at verl's default token budget (16384 per GPU): the memory and communication ranking
    alone puts a 2-stage pipeline first (smaller TP and CP before fewer stages); its pipeline bubble makes it slower
    by the step-time estimate than a 1-stage mesh that fits too, and mesh=auto takes the faster one, saying so."""
    p = plan(["model=kimi_k2_6", "mesh=auto", "mesh.nnodes=32", "mode=plan",
              "verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384"])
    alone = memory_only(p)[0]
    assert alone.fits and alone.mesh.pp == 2, alone.mesh
    assert p.memory.fits and p.mesh.pp == 1 and p.mesh != alone.mesh
    from vrun.planning import steptime_plan

    timer, why = steptime_plan.mesh_timer(p.config, p.entrypoint, p.verl, p.mesh, p.params)
    assert timer is not None, why
    # the plan's own step time for its mesh is the search's, and lower than the memory ranking's first
    assert p.search.chosen["step_middle_s"] == pytest.approx(p.time.central, abs=0.06)
    slower = timer(alone.mesh, alone.estimate).central
    assert p.time.central < slower / (1 + search.TIME_RESOLUTION)
    s = p.search.summary()
    assert s["chosen_by"].startswith("lower predicted step time (≈ ") and alone.mesh.overrides() in s["chosen_by"]
    assert s["time"] == "estimated"
    assert s["decided_by"] == {"entry": search.TIME_AT + 1, "of": len(search.RANKING),
                               "prefers": "lower predicted step time"}
    rows = p.search.rows()
    assert rows[1].startswith(f"        chosen by ranking entry {search.TIME_AT + 1} of {len(search.RANKING)}, "
                              "lower predicted step time (≈ ")


def test_alternatives_carry_their_step_time():
    """The printed table (the plan's own, not only plan.json) gives the chosen mesh and each alternative its step
    time, the middle and the low–high band, and names the ranking entry that chose the mesh."""
    from vrun.planning import report

    p = plan(["model=glm5_1", "mesh=auto", "mesh.nnodes=32", "algo=grpo", "mode=plan"])
    s = p.search.summary()
    for row in [s["chosen"], *s["alternatives"]]:
        assert row["fits"] and 0 < row["step_low_s"] < row["step_middle_s"] < row["step_high_s"], row
    printed = report.table(p).splitlines()
    alts = [r for r in printed if r.startswith("        alternative ")]
    assert len(alts) == 5, alts
    for row, line in zip(s["alternatives"], alts):
        text = search.step_text(row, "  ")
        assert line.endswith(" GiB" + search.band_text(row) + text) and text.startswith("  step ≈ ") \
            and text.endswith(")"), line
        middle, band = text[len("  step ≈ "):].split(" s (")
        low, high = band[:-1].split("–")
        assert float(middle.replace(",", "")) == pytest.approx(row["step_middle_s"], rel=0.05)
        assert float(low.replace(",", "")) <= float(middle.replace(",", "")) <= float(high.replace(",", ""))
    chosen = [r for r in printed if r.startswith("        chosen by ")]
    assert len(chosen) == 1 and chosen[0] == "        chosen by " + search.entry_place(p.search.decided_by) + \
        s["chosen_by"], chosen
    assert s["chosen_by"]   # one of the ranking's entries, named
    assert s["chosen_by"].startswith(s["decided_by"]["prefers"]), (s["chosen_by"], s["decided_by"])
    assert any(s["chosen_by"].startswith(name) for name, _ in search.RANKING), s["chosen_by"]


def test_without_a_time_estimate_the_memory_ranking_is_unchanged():
    """An unknown GPU part (no FLOP/s or bandwidth): no step times; the choice and the alternatives are the memory
    ranking's, in its order, and chosen_by names the memory/communication entry and why no time ranked."""
    p = plan(["model=kimi_k2_6", "mesh=auto", "mesh.nnodes=32", "mode=plan", "cluster.gpu=X9",
              "cluster.gpu_mem_gib=80"])
    s = p.search.summary()
    alone = memory_only(p)
    assert p.mesh == alone[0].mesh
    ranked = [s["chosen"], *s["alternatives"]]
    assert [r["overrides"].split(" verl.")[0] for r in ranked] == [c.mesh.overrides() for c in alone[:6]]
    assert all(r["step_middle_s"] is None for r in ranked)
    assert "no step-time estimate: cluster.gpu=X9" in s["chosen_by"] and s["time"].startswith("cluster.gpu=X9")
    assert not s["chosen_by"].startswith("lower predicted step time")
    assert s["decided_by"] is None or s["decided_by"]["prefers"] != search.TIME
    assert all("step ≈" not in r for r in p.search.rows())


def test_step_times_are_asked_only_for_meshes_that_fit():
    """The search asks the step-time estimate only for meshes whose memory estimate fits (Kimi-K2.6 on 256 GPUs at
    60 GiB: some do not), and once per mesh it cannot tell apart."""
    from vrun.estimate import memory
    from vrun.planning import phases, steptime_plan

    p = plan(["model=kimi_k2_6", "mesh=auto", "mesh.nnodes=32", "mode=plan", "cluster.gpu_mem_gib=60",
              "verl.actor_rollout_ref.rollout.gpu_memory_utilization=0.5"])
    timer, _ = steptime_plan.mesh_timer(p.config, p.entrypoint, p.verl, p.mesh, p.params)
    asked = []
    meshes = [c.mesh for c in memory_only(p)]
    from vrun.planning import plan as planning

    params = planning.with_built_mtp(planning.model_params(p.config, p.entrypoint, None, [], p.verl)[0], p.config,
                                     p.entrypoint, p.verl)
    inputs = phases.memory_inputs(p.config, p.entrypoint, p.verl)
    ranked = search.rank(meshes, lambda m: memory.estimate(params, m, **inputs),
                         lambda m, e: asked.append((m, e.fits)) or timer(m, e))
    assert asked and all(fits for _, fits in asked), "a mesh that does not fit was timed"
    assert any(not c.fits for c in ranked) and len(asked) < sum(c.fits for c in ranked)
    assert all(c.time is None for c in ranked if not c.fits)
    # the first meshes are timed exactly (the rest keep the lower bound's order) and ordered by their times
    head = ranked[:search.HEAD]
    assert all(c.fits and c.time is not None for c in head)
    assert [c.key() for c in head] == sorted(c.key() for c in head)
    timed_all = search.rank(meshes, lambda m: memory.estimate(params, m, **inputs), lambda m, e: timer(m, e))
    assert [c.mesh for c in head] == [c.mesh for c in timed_all[:search.HEAD]]


def test_step_times_keep_expert_parallel_meshes_apart():
    """mesh=auto's step-time memo keys whether expert parallelism splits the experts (the MoE balance): an EP1 mesh
    timed after an EP8 mesh of the same pipeline and micro-batches gets its own figure, the one it gets alone."""
    import dataclasses

    from vrun.planning import steptime_plan

    p = plan(["model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan"])
    assert p.mesh.ep > 1
    one = dataclasses.replace(p.mesh, ep=1, etp=1)

    def timer():
        t, why = steptime_plan.mesh_timer(p.config, p.entrypoint, p.verl, p.mesh, p.params)
        assert t is not None, why
        return t

    first = timer()
    wide, narrow = first(p.mesh, p.memory).central, first(one, p.memory).central
    second = timer()
    assert second(one, p.memory).central == narrow and second(p.mesh, p.memory).central == wide
    assert narrow != wide


def _timed(times: dict):
    """A step-time function for rank(): a mesh's middle from `times` (by TP, PP), with its lower bound."""
    import types

    def step_time(m, e):
        return types.SimpleNamespace(central=times[(m.tp, m.pp)])

    step_time.bound = lambda m, e: times[(m.tp, m.pp)] * (1 - 1e-9)
    return step_time


def test_times_within_the_resolution_of_the_fastest_tie():
    """Two meshes 0.2% apart on either side of a step boundary of the absolute log scale: counted from the fastest
    they tie, and the entries after the time entry decide (the smaller TP), as the printed line says."""
    import math

    step = math.log1p(search.TIME_RESOLUTION)
    edge = math.exp((search.step_bucket(180.0) - search.BUCKET_BASE + 0.5) * step)
    times = {(4, 1): edge * 0.999, (2, 1): edge * 1.001, (8, 1): edge * 1.3}
    assert search.step_bucket(times[(4, 1)]) != search.step_bucket(times[(2, 1)])
    # near a second too (the steps of the absolute scale must not read as "no time" there)
    one = {(1, 1): 1.0101, **{(tp, 1): 1.0099 for tp in (2, 4, 8)}}
    ranked = search.rank([Mesh(1, 8, tp=tp) for tp in (1, 2, 4, 8)], step_time=_timed(one))
    assert [c.mesh.tp for c in ranked] == [1, 2, 4, 8], [c.mesh.tp for c in ranked]
    meshes = [Mesh(1, 8, tp=tp) for tp in (4, 2, 8)]
    for fn in (_timed(times), lambda m, e: _timed(times)(m, e)):
        ranked = search.rank(meshes, step_time=fn)
        assert [c.mesh.tp for c in ranked] == [2, 4, 8], [c.mesh.tp for c in ranked]
        assert ranked[0].step == ranked[1].step == 1.0 and ranked[2].step > 1.0
        by, why = search.decision(ranked)
        assert by == [n for n, _ in search.RANKING].index("smaller TP")
        assert why.startswith("smaller TP (than ") and why.endswith("the step times equal within 2%"), why


def test_the_bound_leaves_untimed_only_meshes_that_cannot_enter_the_first():
    """With a lower bound, rank() times exactly only while a mesh can still enter the first HEAD: its first HEAD
    equal those of ranking every mesh exactly, over random times (some within the resolution of each other, some
    of a second or less)."""
    rng = random.Random(7)
    shapes = [(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8, 16)]
    meshes = [Mesh(16, 8, tp=tp, pp=pp) for tp, pp in shapes]
    assert search.step_bucket(1.0) > 0 and search.step_bucket(0.01) > 0 and search.step_bucket(0.0) == 0.0
    for i in range(300):
        base = rng.uniform(50, 500) if i % 3 else rng.uniform(0.5, 1.5)
        times = {s: base * (1 + rng.choice([0.0, 0.005, 0.015, 0.03, 0.08, 0.3]) * rng.random() * 3) for s in shapes}
        fn = _timed(times)
        pruned = search.rank(meshes, step_time=fn)
        full = search.rank(meshes, step_time=lambda m, e: fn(m, e))
        head = search.HEAD
        assert [c.mesh for c in pruned[:head]] == [c.mesh for c in full[:head]]
        assert [c.key() for c in pruned[:head]] == [c.key() for c in full[:head]]

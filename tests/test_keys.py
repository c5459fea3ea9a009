"""Typos are errors, not silent new keys: in overrides, in the pass-through, in impl_cfg, in group files."""
import shutil

import pytest

from conftest import ROOT, compose, problems_of, runner
from vrun.planning.plan import make_plan
from vrun.core.problems import PlanError
from vrun.config.schema import typed


def one_error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    return lines


def test_run_config_typo_is_one_line(tmp_path):
    """mesh.ppp=4 fails at composition: one line naming the key and the nearest knob."""
    (line,) = one_error_line(runner("mesh.ppp=4", "mode=plan", f"hydra.run.dir={tmp_path}/r"))
    assert line.startswith("error: mesh.ppp=4:") and "mesh.pp" in line
    assert not (tmp_path / "r").exists()


def test_unknown_group_option_is_one_line(tmp_path):
    """model=glm5 names the option and the nearest existing one."""
    (line,) = one_error_line(runner("model=glm5", "mode=plan", f"hydra.run.dir={tmp_path}/r"))
    assert line.startswith("error: model=glm5:") and "model=glm5_1" in line


def test_wrong_type_is_one_line(tmp_path):
    """mesh.tp=two is a type error on a typed knob."""
    (line,) = one_error_line(runner("mesh.tp=two", "mode=plan", f"hydra.run.dir={tmp_path}/r"))
    assert line.startswith("error: mesh.tp=two:")


@pytest.mark.parametrize("bad,fix", [("mode=bogus", "mode=plan or mode=preflight or mode=train"),
                                     ("optimizer.name=adam", "optimizer.name=fsdp2 or optimizer.name=dist_opt"),
                                     ("algo.entrypoint=rl", "algo.entrypoint=ppo or algo.entrypoint=sft"),
                                     ("cluster.name=k8s", "cluster.name=local or cluster.name=slurm or cluster.name=ray or "
                                      "cluster.name=kuberay")])
def test_closed_choice_is_rejected_at_composition(bad, fix, tmp_path):
    """A value outside a closed choice fails while Hydra composes: one line with the choices as the fix."""
    (line,) = one_error_line(runner(bad, "mode=plan", f"hydra.run.dir={tmp_path}/r"))
    assert line.startswith(f"error: {bad}: Invalid value") and line.endswith(f"fix: {fix}")


def test_passthrough_typo_names_nearest_verl_key():
    """verl.trainer.save_frq=10 is not in verl's tree: the nearest key is suggested."""
    lines = problems_of(["model=glm5_1", "verl.trainer.save_frq=10", "mode=plan"])
    assert len(lines) == 1 and lines[0].startswith("error: verl.trainer.save_frq=10:") and "fix: verl.trainer.save_freq" in lines[0]


def test_passthrough_known_key_applies():
    """A real verl key through the pass-through reaches the verl config."""
    from conftest import plan

    assert plan(["model=glm5_1", "verl.trainer.save_freq=10", "mode=plan"]).verl["trainer"]["save_freq"] == 10


def test_impl_cfg_typo_that_mlite_would_drop():
    """engine.impl_cfg.recompte is not a field of GLM5's ImplConfig: Megatron Lite would drop it silently."""
    lines = problems_of(["model=glm5_1", "+engine.impl_cfg.recompte=[full]", "mode=plan"])
    assert any(line.startswith("error: engine.impl_cfg.recompte=") and "recompute" in line for line in lines)


def test_impl_cfg_field_of_another_model():
    """gdn_cp_mode exists for Qwen3.5 only: on GLM5 it would be dropped."""
    assert problems_of(["model=qwen3_5_35b", "engine.impl_cfg.gdn_cp_mode=replicated", "mode=plan"]) == []
    lines = problems_of(["model=glm5_1", "engine.impl_cfg.gdn_cp_mode=replicated", "mode=plan"])
    assert any("gdn_cp_mode" in line and "drop it silently" in line for line in lines)


def test_optimizer_override_the_engine_ignores():
    """optim.override_optimizer_config keys the mlite engine does not read are errors."""
    lines = problems_of(["model=glm5_1", "optim.override_optimizer_config.offload_fractoin=0.5", "mode=plan"])
    assert any("offload_fractoin" in line and "offload_fraction" in line for line in lines)


def test_owned_key_through_passthrough():
    """Mesh knobs have one source: the pass-through cannot set the engine's TP."""
    lines = problems_of(["model=glm5_1", "verl.actor_rollout_ref.actor.engine.tp=2", "mode=plan"])
    assert any("engine.tp" in line and "mesh.tp" in line for line in lines)


def planted_conf(tmp_path, rel, old, new):
    """A copy of conf/ with one line of one group file changed."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    p = conf / rel
    assert old in p.read_text()
    p.write_text(p.read_text().replace(old, new))
    return conf


def test_group_file_typo(tmp_path):
    """A misspelled key inside a group file fails composition, naming it."""
    conf = planted_conf(tmp_path, "mesh/8gpu.yaml", "gpus_per_node: 8", "gpu_per_node: 8")
    with pytest.raises(Exception) as e:
        compose(["model=qwen3_5_35b"], conf_dir=conf)
    assert "gpu_per_node" in str(e.value) or "gpu_per_node" in str(e.value.__cause__)


def test_recipe_typo_in_group_file(tmp_path):
    """A misspelled verl key inside a group file's recipe is caught against verl's tree."""
    conf = planted_conf(tmp_path, "launcher/kimi_k2_6_glm5_1.yaml", "gpu_memory_utilization: 0.8",
                        "gpu_memory_utilisation: 0.8")
    with pytest.raises(PlanError) as e:
        make_plan(typed(compose(["model=glm5_1"], conf_dir=conf)), str(tmp_path / "r"))
    assert "gpu_memory_utilisation" in str(e.value) and "gpu_memory_utilization" in str(e.value)


def test_plan_error_exits_nonzero_without_traceback(tmp_path):
    """A plan error from the runner: one line per problem, exit 2, nothing submitted."""
    proc = runner("model=glm5_1", "mesh.cp=3", "mode=plan", f"hydra.run.dir={tmp_path}/r")
    lines = one_error_line(proc)
    assert proc.returncode == 2 and lines[0].startswith("error: mesh.cp=3:")
    assert not (tmp_path / "r" / "plan.json").exists()


def test_secret_in_env_block_is_rejected():
    """A token value in env.* would be written into the plan: rejected, pointing at pass_env."""
    lines = problems_of(["model=glm5_1", "+env.WANDB_API_KEY=abc123", "mode=plan"])
    assert any("env.WANDB_API_KEY=<hidden>" in line and "pass_env" in line for line in lines)
    assert not any("abc123" in line for line in lines)

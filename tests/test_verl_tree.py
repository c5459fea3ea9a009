"""The fast path (verl's tree composed once, overrides applied, interpolations resolved) equals Hydra's own
override path on verl's tree, and the CLI rendering of every override reads back as the same value."""
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from conftest import needs_dapo, plan
from vrun.compose import verl_tree


def hydra_compose(config_name, overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_tree.verl_config_dir()), version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    GlobalHydra.instance().clear()
    out = OmegaConf.to_container(cfg, resolve=True)
    out.pop("hydra", None)
    return out


@pytest.mark.parametrize("overrides", [["model=glm5_1"], ["model=qwen3_5_35b", "algo=dapo"],
                                       ["model=deepseek_v4_flash", "algo=sft", "optimizer=dist_opt"],
                                       ["model=kimi_k2_6", "verl.actor_rollout_ref.actor.use_kl_loss=true"]])
def test_fast_path_equals_hydra(overrides, tmp_path):
    """Same verl config through Hydra's compose with the plan's groups and rendered overrides."""
    if "algo=dapo" in overrides:
        needs_dapo()
    p = plan(overrides + ["mode=plan"], run_dir=str(tmp_path / "r"))
    via_hydra = hydra_compose(p.request.config_name, list(p.request.groups) + [o.cli() for o in p.request.overrides])
    assert via_hydra == p.verl


def test_kl_selects_mlite_reference():
    """A KL term needs a reference policy on the mlite engine (the launchers would hit FSDPEngineConfig.tp)."""
    p = plan(["model=kimi_k2_6", "verl.actor_rollout_ref.actor.use_kl_loss=true", "mode=plan"])
    assert "ref@actor_rollout_ref.ref=mlite_ref" in p.request.groups
    assert p.verl["actor_rollout_ref"]["ref"]["engine"]["pp"] == p.mesh.pp
    assert "ref@actor_rollout_ref.ref=mlite_ref" not in plan(["model=kimi_k2_6", "mode=plan"]).request.groups


def test_fast_resolver_equals_omegaconf():
    """The small resolver gives OmegaConf's answer on the composed tree."""
    t = verl_tree.base_tree("ppo_trainer", ("hydra.searchpath=[pkg://vrun.compose.mlite_record.config]",
                                            "actor@actor_rollout_ref.actor=mlite_actor"))
    t["actor_rollout_ref"]["rollout"]["name"] = "vllm"
    assert verl_tree.resolve_fast(t) == OmegaConf.to_container(OmegaConf.create(t), resolve=True)


@pytest.mark.parametrize("value", ["~/data/x.parquet", "a b", "null", "True", "1e-5", "x=y", "[full]", "${a.b}",
                                   1, 1.0e-06, True, None, [1, "two"], "it's"])
def test_render_round_trips(value):
    """Each value renders to override text Hydra's parser reads back as that value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([f"k={verl_tree.render(value)}"])[0]
    got = parsed.value()
    if isinstance(value, str) and "${" in value:
        assert got == value
    else:
        assert got == value, (value, got)

"""The fast path (verl's tree composed once, overrides applied, interpolations resolved) equals Hydra's own
override path on verl's tree, and the CLI rendering of every override reads back as the same value."""
import json

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


def test_a_composed_tree_is_kept_after_a_written_plan_and_read_back(own_state_dir, tmp_path):
    """The next plan reads verl's composed tree from the state dir (keyed by the tree's fingerprint) instead of
    composing it: a key planted in the kept tree is one the next plan may set; the same file under another key
    (verl's files changed) is not read. What is kept equals Hydra's composition; a refused plan keeps nothing."""
    from conftest import runner

    groups = ("model=glm5_1", "mode=plan")
    refused = runner(*groups, "mesh.tp=3", f"hydra.run.dir={tmp_path / 'bad'}")
    assert refused.returncode != 0 and not (own_state_dir / "cache").exists()
    ok = runner(*groups, f"hydra.run.dir={tmp_path / 'r'}")
    assert ok.returncode == 0, ok.stderr
    kept = list((own_state_dir / "cache").iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("verl-tree-")
    record = json.loads(kept[0].read_text())
    assert record["key"]["tree"] == verl_tree.fingerprint()
    assert record["tree"] == hydra_tree(record["key"]["config_name"], record["key"]["groups"])
    # read back, the same verl_config.yaml byte for byte (the kept tree keeps Hydra's key order)
    again = runner(*groups, f"hydra.run.dir={tmp_path / 'again'}")
    assert again.returncode == 0, again.stderr
    texts = [(tmp_path / d / "verl_config.yaml").read_text().replace(str(tmp_path / d), "<run dir>")
             for d in ("r", "again")]
    assert texts[0] == texts[1]

    record["tree"]["trainer"]["kept_tree_probe"] = 1  # verl's composition has no such key: only the kept tree
    kept[0].write_text(json.dumps(record))  # edited, its fingerprint not: composed again, saying so
    probe = ("verl.trainer.kept_tree_probe=2", f"hydra.run.dir={tmp_path / 'read'}")
    edited = runner(*groups, probe[0], f"hydra.run.dir={tmp_path / 'edited'}")
    assert edited.returncode == 2 and "no longer matches its fingerprint" in edited.stderr, edited.stderr
    record["digest"] = verl_tree.content_digest(record["tree"])
    kept[0].write_text(json.dumps(record))
    read = runner(*groups, *probe)
    assert read.returncode == 0, read.stderr
    assert "kept_tree_probe: 2" in (tmp_path / "read" / "verl_config.yaml").read_text()
    record["key"]["tree"] = "0" * 16
    kept[0].write_text(json.dumps(record))
    stale = runner(*groups, probe[0], f"hydra.run.dir={tmp_path / 'stale'}")
    assert stale.returncode == 2 and "verl.trainer.kept_tree_probe" in stale.stderr, stale.stderr


def hydra_tree(config_name, groups):
    """verl's tree as Hydra composes it, interpolations unresolved."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_tree.verl_config_dir()), version_base=None):
        cfg = compose(config_name=config_name, overrides=list(groups))
    GlobalHydra.instance().clear()
    out = OmegaConf.to_container(cfg, resolve=False)
    out.pop("hydra", None)
    return out

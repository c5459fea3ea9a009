"""The project's record of verl_mlite.config, and what preflight says about the real package.

The real verl_mlite lives in a Megatron-LM checkout (not on PyPI): the drift tests run when MLITE_ROOT points
at one and skip otherwise. The record is read, never imported as `verl_mlite`.
"""
import ast
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import PY, ROOT, plan, runner
from vrun import mlite, preflight

RECORD = ROOT / "vrun" / "mlite_record"
MLITE_ROOT = os.environ.get("MLITE_ROOT")
needs_real = pytest.mark.skipif(not MLITE_ROOT, reason="MLITE_ROOT is not set: no Megatron-LM checkout to compare")
MODELS = {"deepseek_v4": "deepseek_v4", "glm5": "glm5", "kimi_k2": "kimi_k2", "qwen3_5": "qwen3_5"}


def real(rel):
    return Path(MLITE_ROOT) / "experimental" / "lite" / rel


def ann_fields(path, cls):
    tree = ast.parse(Path(path).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)]


@needs_real
@pytest.mark.parametrize("rel", ["actor/mlite_actor.yaml", "engine/mlite.yaml", "ref/mlite_ref.yaml"])
def test_record_keys_and_defaults_equal_real(rel):
    """Each recorded group file has the real file's keys, defaults and defaults list."""
    got = yaml.safe_load((RECORD / "config" / rel).read_text())
    want = yaml.safe_load(real(f"examples/verl/verl_mlite/config/{rel}").read_text())
    assert got == want


@needs_real
@pytest.mark.parametrize("name", sorted(MODELS))
def test_impl_cfg_fields_equal_real(name):
    """The recorded ImplConfig fields (what the runtime keeps) equal each model's dataclass."""
    fields = set(ann_fields(real(f"megatron/lite/model/{name}/lite/protocol.py"), "ImplConfig")) - {"parallel"}
    assert set(mlite.impl_cfg_fields(name)) == fields


@needs_real
def test_engine_fields_and_required_verl_equal_real():
    """MegatronLiteEngineConfig's own fields, the extra ones, the optimizer keys read, REQUIRED_VERL."""
    cfg = real("examples/verl/verl_mlite/engine/config.py")
    fields = set(ann_fields(cfg, "MegatronLiteEngineConfig"))
    assert fields == set(preflight.RECORD_ENGINE_FIELDS)
    engine_yaml = yaml.safe_load((RECORD / "config" / "engine" / "mlite.yaml").read_text())
    assert sorted(fields - set(engine_yaml)) == sorted(mlite.record()["engine_extra_fields"])
    src = real("examples/verl/verl_mlite/engine/mlite_engine.py").read_text()
    assert set(re.findall(r'override\.get\(\s*"(\w+)"', src)) == set(mlite.record()["override_optimizer_config_keys"])
    assert mlite.record()["required_verl"] in real("examples/verl/REQUIRED_VERL.txt").read_text()


@needs_real
def test_plan_with_real_package_equals_plan_with_record(tmp_path):
    """Planned against the real package (MLITE_ROOT) the verl config is the one the record gives."""
    env_real = dict(os.environ)
    env_rec = {k: v for k, v in os.environ.items() if not k.startswith("MLITE")}
    a = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/real", env=env_real)
    b = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/rec", env=env_rec)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert "verl_mlite from verl_mlite" in a.stdout and "verl_mlite from record" in b.stdout
    ca = yaml.safe_load((tmp_path / "real" / "verl_config.yaml").read_text())
    cb = yaml.safe_load((tmp_path / "rec" / "verl_config.yaml").read_text())
    for c in (ca, cb):  # the two differ only in where they run and which paths they put on PYTHONPATH
        c["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"].pop("PYTHONPATH")
        c["trainer"].pop("default_local_dir")
    assert ca == cb


def test_record_is_not_named_verl_mlite():
    """The record cannot shadow the real package."""
    assert not list(ROOT.rglob("verl_mlite/__init__.py"))
    assert mlite.RECORD_PKG == "vrun.mlite_record"


def test_plan_says_which_it_used(tmp_path):
    """Without MLITE_ROOT the plan composes against the record and says so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLITE")}
    proc = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/r", env=env)
    assert proc.returncode == 0 and "verl_mlite from record" in proc.stdout
    assert "warning: verl_mlite=null: not importable" in proc.stdout


def test_preflight_reports_incompatible_verl_and_missing_package(tmp_path):
    """On PyPI verl 0.9.1 preflight names the missing EngineConfig field and verl_mlite's verl commit, and the
    absent real package, each in one line (not Hydra's "could not find mlite_actor")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLITE")}
    proc = runner("model=glm5_1", "mode=preflight", f"hydra.run.dir={tmp_path}/r", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    (compat,) = [line for line in lines if line.startswith("error: verl=")]
    assert "['grad_offload']" in compat and "a6ef5009" in compat
    assert any(line.startswith("error: MLITE_ROOT=") and "verl_mlite is not importable" in line for line in lines)
    assert "mlite_actor" not in proc.stderr


def test_compat_check_reads_installed_verl():
    """The missing fields are what verl 0.9.1's EngineConfig lacks and the engine yaml sets."""
    from importlib import metadata

    p = plan(["model=glm5_1", "mode=plan"])
    missing = preflight.verl_compat(p)
    if metadata.version("verl").startswith("0.9."):
        assert missing == {"grad_offload"}
    else:
        assert "grad_offload" not in missing

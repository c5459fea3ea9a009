"""The project's record of verl_mlite.config, and what preflight says about the real package.

The real verl_mlite lives in a Megatron-LM checkout (not on PyPI): the drift tests run when MLITE_ROOT (or
VRUN_TEST_MLITE_ROOT) points at one and skip otherwise. The record is read, never imported as `verl_mlite`.
"""
import ast
import re
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, needs_real_mlite, plan, real_mlite_root, runner, verl_has, without_mlite
from vrun.compose import mlite
from vrun.launch import preflight

RECORD = ROOT / "vrun" / "compose" / "mlite_record"
MLITE_ROOT = real_mlite_root()
needs_real = needs_real_mlite
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
    env_rec = without_mlite()
    env_real = {**env_rec, "MLITE_ROOT": str(MLITE_ROOT)}
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
    # the project's own folders (a Megatron-LM checkout the user unpacked inside the repo is not the project's)
    own = [ROOT / d for d in ("vrun", "hooks", "hydra_plugins", "tests", "conf", "bench")]
    assert not [p for d in own for p in d.rglob("verl_mlite/__init__.py")] and not (ROOT / "verl_mlite").exists()
    assert mlite.RECORD_PKG == "vrun.compose.mlite_record"


def test_plan_says_which_it_used(tmp_path):
    """Without MLITE_ROOT the plan composes against the record and says so."""
    proc = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/r", env=without_mlite())
    assert proc.returncode == 0 and "verl_mlite from record" in proc.stdout
    assert "warning: verl_mlite=null: not importable" in proc.stdout


def test_preflight_reports_incompatible_verl_and_missing_package(tmp_path):
    """Without verl_mlite preflight says so in one line (not Hydra's "could not find mlite_actor"); on a verl whose
    EngineConfig lacks grad_offload (PyPI 0.9.1) it also names that field and the commit verl_mlite pins."""
    proc = runner("model=glm5_1", "mode=preflight", f"hydra.run.dir={tmp_path}/r", env=without_mlite())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    compat = [line for line in lines if line.startswith("error: verl=")]
    if verl_has("grad_offload"):
        assert compat == []
    else:
        (line,) = compat
        assert "['grad_offload']" in line and "a6ef5009" in line
    assert any(line.startswith("error: MLITE_ROOT=") and "verl_mlite is not importable" in line for line in lines)
    assert "mlite_actor" not in proc.stderr


@needs_real
def test_preflight_with_real_verl_mlite_names_the_verl_to_install(tmp_path):
    """With the real verl_mlite, preflight on a verl that cannot build its engine config (PyPI 0.9.1) refuses in
    one line naming grad_offload and the verl to install; on the verls that can, no such line."""
    env = {**without_mlite(), "MLITE_ROOT": str(MLITE_ROOT)}
    proc = runner("model=glm5_1", "mode=preflight", f"hydra.run.dir={tmp_path}/r", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert not any(line.startswith("error: MLITE_ROOT=") for line in lines)
    compat = [line for line in lines if line.startswith("error: verl=")]
    if verl_has("grad_offload"):
        assert compat == []
    else:
        (line,) = compat
        assert "['grad_offload']" in line and "install verl from source at commit a6ef5009" in line


def test_compat_check_reads_installed_verl():
    """The missing fields are what the installed verl's EngineConfig lacks and the engine yaml sets."""
    p = plan(["model=glm5_1", "mode=plan"])
    missing = preflight.verl_compat(p)
    assert missing == (set() if verl_has("grad_offload") else {"grad_offload"})


@needs_real
def test_interface_read_from_the_real_source_equals_the_record():
    """What the plan checks against (ImplConfig fields and MTP defaults per model, engine extra fields, optimizer
    override keys, router replay modes, optimizer names) read from the real package equals the record."""
    import dataclasses

    real = mlite.interface_from_source(str(MLITE_ROOT / "experimental/lite/examples/verl/verl_mlite"))
    rec = mlite.interface_from_record()
    for f in dataclasses.fields(real):
        if f.name == "source":
            continue
        a, b = getattr(real, f.name), getattr(rec, f.name)
        if isinstance(a, dict):
            a = {k: sorted(v) if isinstance(v, tuple) else v for k, v in a.items()}
            b = {k: sorted(v) if isinstance(v, tuple) else v for k, v in b.items()}
        else:
            a, b = sorted(a, key=str), sorted(b, key=str)
        assert a == b, f.name


def test_interface_comes_from_where_verl_mlite_comes_from(tmp_path):
    """One place decides: the real package's source when it is in reach, else the record."""
    assert mlite.interface().source == mlite.find_source().kind

"""verl_config.yaml's writer (vrun/core/yaml_text.py) reads back as exactly what it was given, through PyYAML and
OmegaConf (what verl loads it with), on every plan's verl config and on values chosen to trip a YAML writer."""
import math

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import plan
from vrun.core import yaml_text

TRICKY = {
    "words": ["yes", "No", "ON", "off", "y", "n", "null", "Null", "~", "true", "False", "", " ", "-", "?", ":", "#"],
    "numbers_as_text": ["1", "1.0", "1e3", "0x10", "0o7", "1_000", "12:30", "+1", ".5", ".inf", "-.inf", ".nan", "1e-06"],
    "syntax": ["a: b", "a #b", "a:b", "'q'", '"q"', "[x]", "{x}", "&a", "*a", "!t", "%p", "@x", "`x`", "a,b", "${x.y}",
               "line\nbreak", "tab\there", "trailing ", " leading", "back\\slash", "ctrl\x01", "\x7f"],
    "unicode": ["é", "日本", "\u2028", "\x85", "😀"],
    "floats": [0.0, -0.0, 1e-06, 1e16, 1.5, -2.25e-10, float("inf"), float("-inf"), 3.0],
    "ints": [0, -1, 2 ** 63, True, False, None],
    "nested": {"empty_map": {}, "empty_list": [], "lists": [[1, [2, []]], [{"a": {}}], {"k": [{"x": [1]}]}],
               "keys": {"a.b": 1, "y": 2, "on": 3, "a b": 4, "1": 5, "": 6, "ref@actor.ref": 7}},
}


def same(a, b) -> bool:
    """Equal, with NaN equal to itself and -0.0 told from 0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def reads_back(tree, tmp_path) -> str:
    text = yaml_text.dump(tree)
    assert same(yaml.safe_load(text), tree), text
    f = tmp_path / "t.yaml"
    f.write_text(text, encoding="utf-8")
    assert same(OmegaConf.to_container(OmegaConf.load(f)), tree), text
    return text


@pytest.mark.parametrize("key", sorted(TRICKY))
def test_tricky_values_read_back(key, tmp_path):
    if key == "numbers_as_text":  # OmegaConf reads 1e3 as a float when written bare: these must be quoted
        text = reads_back({key: TRICKY[key]}, tmp_path)
        assert "- 1e3" not in text
    else:
        reads_back({key: TRICKY[key]}, tmp_path)


def test_the_fast_path_takes_plain_words_bare_and_other_types_to_pyyaml(tmp_path):
    assert yaml_text.dump({"a": {"b": ["x", 1, 1e-06, None]}}) == "a:\n  b:\n  - x\n  - 1\n  - 1.0e-06\n  - null\n"
    assert yaml_text.dump({}) == "{}\n" and yaml_text.dump([]) == "[]\n"
    reads_back({1: "int key"}, tmp_path)
    assert yaml_text.dump({"t": ("tuple",)}) != ""  # PyYAML's own answer for a type the fast path leaves


@pytest.mark.parametrize("overrides", [["model=glm5_1", "mesh=256gpu"], ["model=kimi_k2_6", "algo=dapo"],
                                       ["model=deepseek_v4_flash", "algo=sft"], ["model=qwen3_5_35b"]])
def test_every_plans_verl_config_reads_back(overrides, tmp_path):
    from conftest import needs_dapo

    if "algo=dapo" in overrides:
        needs_dapo()
    p = plan(overrides + ["mode=plan", "run.allow_memory_overrun=true"], run_dir=str(tmp_path / "r"))
    text = reads_back(p.verl, tmp_path)
    assert yaml.safe_load(yaml.dump(p.verl, Dumper=yaml.SafeDumper)) == yaml.safe_load(text)


def test_resume_takes_the_same_config_written_by_pyyaml(tmp_path):
    """A run dir whose verl_config.yaml an earlier version wrote with PyYAML is the same plan (run.resume=true);
    a changed value is not."""
    from vrun.checks import paths as check_paths

    p = plan(["model=qwen3_5_35b", "mode=plan"], run_dir=str(tmp_path / "r"))
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "verl_config.yaml").write_text(yaml.dump(p.verl, Dumper=yaml.SafeDumper, sort_keys=False))
    assert check_paths.same_plan(str(tmp_path / "r"), yaml_text.dump(p.verl)) == []
    changed = dict(p.verl, trainer={**p.verl["trainer"], "total_epochs": 99})
    assert check_paths.same_plan(str(tmp_path / "r"), yaml_text.dump(changed))[0].key == "run.resume"

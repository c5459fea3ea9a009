"""Every error is a fix: each error the project can raise names its key and a change that differs from the input.

Walked two ways: statically, every error site in the code (each Problem(...) and each hand-made "error: " line)
carries a fix and no catch-all is left; and through the real command line, every kind of error Hydra and OmegaConf
can raise on an override (grammar, type, delete, append, defaults, an option, an interpolation, an empty sweep)
comes out as `error: KEY=VALUE: why; fix: change`, where the change is not the input repeated.
"""
import ast
import re

import pytest

from conftest import ROOT, assert_a_fix, runner

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

SOURCES = sorted([*(ROOT / "vrun").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py"), ROOT / "runner.py"])
CATCH_ALL = re.compile(r"run with mode=plan and the same overrides|give a value of the right type|see the error above",
                       re.I)

# hand-made "error: " lines that are not an input's refusal, each with why it carries no fix of its own
NOT_INPUT_ERRORS = {
    ("vrun/launch/local.py", "error: the run exited {}; see the output above and {}"):
        "the run's own exit, after it started: its output above is the cause",
    ("vrun/launch/slurm/submit.py", "error: {}: {}"):
        "the node-side resubmit's unexpected failure, written to the job's log for `status` to show",
    ("hydra_plugins/vrun_sweeper/vrun_sweeper.py", "error: {}"):
        "workers.count's ValueError, whose text is `VRUN_SWEEP_WORKERS=...: why; fix: ...` (asserted below)",
    ("vrun/checks/composed.py", "error: "):
        "a prefix removed from describe()'s line, not a line",
}


def _text(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _strings(tree):
    """The module's whole string expressions (an f-string's pieces are not strings of their own)."""
    inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in ast.walk(node) if v is not node}
    return [(node, _text(node)) for node in ast.walk(tree) if id(node) not in inner and _text(node) is not None]


def test_every_error_site_carries_a_fix():
    problems, lines, seen_exceptions = 0, 0, set()
    for path in SOURCES:
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Problem":
                problems += 1
                kw = {k.arg: k.value for k in node.keywords}
                fix = node.args[3] if len(node.args) > 3 else kw.get("fix")
                assert fix is not None, f"{rel}:{node.lineno}: a Problem without a fix"
                text = _text(fix)
                assert text is None or text.strip(), f"{rel}:{node.lineno}: an empty fix"
                assert text is None or not CATCH_ALL.search(text), f"{rel}:{node.lineno}: a catch-all fix: {text}"
        for node, text in _strings(tree):
            assert not CATCH_ALL.search(text) or "CATCH_ALL" in text, f"{rel}:{node.lineno}: a catch-all: {text[:120]}"
            if not text.startswith("error: "):
                continue
            lines += 1
            if (rel, text) in NOT_INPUT_ERRORS:
                seen_exceptions.add((rel, text))
                continue
            assert "; fix: " in text, f"{rel}:{node.lineno}: an error line without a fix: {text[:160]}"
    assert problems > 200 and lines > 40, (problems, lines)  # the walk saw the code, not an empty tree
    assert seen_exceptions == set(NOT_INPUT_ERRORS), set(NOT_INPUT_ERRORS) - seen_exceptions  # none is stale


def test_the_worker_count_error_is_a_fix(monkeypatch):
    from hydra_plugins.vrun_sweeper import workers

    monkeypatch.setenv(workers.ENV, "many")
    with pytest.raises(ValueError) as e:
        workers.count(10)
    assert str(e.value).startswith(f"{workers.ENV}='many': ") and "; fix: " in str(e.value)


# one override per kind of error Hydra's grammar, OmegaConf's types and the defaults list can raise
DOORS = [
    ("~verl.nonexist", "~verl.nonexist", "drop ~verl.nonexist"),
    ("+mesh.tp=2", "+mesh.tp", "mesh.tp=2 (no +)"),
    ("model=[a,b]", "model", "model=<option>"),
    ("optimizer@foo=fsdp2", "optimizer@foo", "optimizer=fsdp2"),
    ("mesh.tp=abc", "mesh.tp", "mesh.tp=<an integer>"),
    ("mesh.tp=1e999", "mesh.tp", "mesh.tp=<an integer>"),
    ("run.resume=maybe", "run.resume", "run.resume=<true or false>"),
    ("mesh.tp=${oc.select:x}", "mesh.tp", "mesh.tp=<an integer>"),
    ("mesh.tp=${oc.decode:1/0}", "mesh.tp", "mesh.tp=<an integer>"),
    ("mesh.tp=${oc.create:[}", "mesh.tp", "braces balanced"),
    ("mesh.tp=${mesh.nope}", "mesh.tp", "interpolate an existing key"),
    ("model=${x}", "model", "model=<option>"),
    ("model=nosuch", "model", "model="),
    ("mesh.zz=1", "mesh.zz", None),
    ("trainer.save_freq=5", "trainer.save_freq", "verl.trainer.save_freq=5"),
    ("verl.trainer.foo=[", "verl.trainer.foo=[", "verl.trainer.foo='['"),
    ("x=y'z", "x=y'z", "x='y\\'z'"),
    ("mesh", "mesh", "mesh=<value>"),
    ("hydra.launcher.partion=gpu", "hydra.launcher.partion", None),
    ("+model.env.A.B=1", "+model.env.A.B=1", "+model.env.A_B=1"),
]
SWEEP_DOORS = [
    ("mesh.nnodes=choice()", "mesh.nnodes", "at least one value"),
    ("mesh.nnodes=range(8,0)", "mesh.nnodes", "mesh.nnodes=range(8,0,-1)"),
    ("model=glob(zz*)", "model", "glob(*)"),
]


@pytest.mark.parametrize("door", DOORS + SWEEP_DOORS, ids=[d[0] for d in DOORS + SWEEP_DOORS])
def test_every_kind_of_override_error_is_one_line_with_a_fix(tmp_path, door):
    override, key, fix = door
    sweep = door in SWEEP_DOORS
    slurm = ["cluster=slurm"] if override.startswith("hydra.launcher") else []
    dirs = [f"hydra.sweep.dir={tmp_path}/s"] if sweep else [f"hydra.run.dir={tmp_path}/r"]
    proc = runner(*(["-m"] if sweep else []), "model=qwen3_5_35b", "mode=plan", *slurm, override, *dirs, cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and errors and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert errors[0].startswith(f"error: {key}"), errors[0]
    assert_a_fix(errors[0], override)
    assert not CATCH_ALL.search(errors[0]), errors[0]
    if fix:
        assert fix in errors[0].split("; fix: ", 1)[1], errors[0]
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()

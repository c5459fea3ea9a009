"""The code's shape: the packages are layers and imports only go down; no cycles; no module reaches into another
project module's private names."""
import ast
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

PROJECT = ("vrun", "hooks", "hydra_plugins", "tests", "bench")


def project_files() -> list[Path]:
    files = [ROOT / "runner.py"]
    for top in PROJECT:
        files += sorted((ROOT / top).rglob("*.py"))
    return files


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_project(module: str) -> bool:
    return module.split(".")[0] in PROJECT or module == "runner"


def private_uses(path: Path) -> list[str]:
    """`from <project module> import _name` and `<project module alias>._name`, outside the module itself."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    aliases: dict[str, str] = {}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and is_project(node.module):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if a.name.startswith("_") and not a.name.startswith("__") and node.module != me:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {a.name}")
                aliases[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if is_project(a.name):
                    aliases[a.asname or a.name.split(".")[0]] = a.asname and a.name or a.name.split(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            chain = []
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                target = ".".join([aliases[base.id]] + chain[::-1])
                if target != me and is_project(target) and _is_module(target):
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {target}.{node.attr}")
    return out


def _is_module(dotted: str) -> bool:
    p = ROOT.joinpath(*dotted.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def test_no_module_imports_another_modules_private_names():
    """Every project module uses only the public names of the others."""
    found = [line for f in project_files() for line in private_uses(f)]
    assert found == [], "\n".join(found)


def test_the_check_sees_a_private_import():
    """The check itself fires on both spellings (a check that cannot fail is no check)."""
    bad = ROOT / "vrun" / "_structure_probe_tmp.py"
    bad.write_text("from vrun.checks.plan_checks import _gone\nfrom vrun.planning import plan\nplan._private_helper\n")
    try:
        found = private_uses(bad)
    finally:
        bad.unlink()
    assert len(found) == 2 and "_gone" in found[0] and "vrun.planning.plan._private_helper" in found[1]


def test_no_module_is_named_after_a_standard_library_module():
    """`import inspect` inside the project must mean the standard library's (vrun/inspect.py once shadowed it)."""
    import sys

    clashes = [f"{f.relative_to(ROOT)}" for f in project_files() if f.stem in sys.stdlib_module_names]
    assert clashes == [], clashes


# The stages a run passes through, lowest first (each package's docstring says what it owns). A module may import
# its own package and the packages before it, never one after it; `vrun/__init__.py` and `vrun/__main__.py` sit
# on top.
LAYERS = ("core", "config", "rundir", "estimate", "entrypoints", "compose", "checks", "planning", "launch", "runs")


def vrun_modules() -> dict[str, Path]:
    return {module_name(f): f for f in sorted((ROOT / "vrun").rglob("*.py"))}


def layer(module: str) -> int:
    """The layer's index; `vrun` itself (a docstring, no code) is below all, `vrun.__main__` above all."""
    parts = module.split(".")
    if len(parts) == 1:
        return 0
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else len(LAYERS)


def imports_of(path: Path, known: dict) -> set[str]:
    """Every project module `path` imports, at module level or inside a function (`from vrun.x import y` counts
    as the module vrun.x.y when that is a module, else vrun.x)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "vrun":
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "vrun"}
    return {m for m in out if m in known}


def import_graph() -> dict[str, set[str]]:
    known = vrun_modules()
    return {m: imports_of(f, known) - {m} for m, f in known.items()}


def upward(graph: dict) -> list[str]:
    name = lambda m: LAYERS[layer(m)] if layer(m) < len(LAYERS) else "top"  # noqa: E731
    return sorted(f"{a} imports {b} ({name(a)} < {name(b)})"
                  for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def cycles(graph: dict) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_lives_in_a_layer_package():
    """No flat modules under vrun/ besides the package's own __init__ and __main__."""
    files = vrun_modules()
    flat = [m for m, f in files.items() if f.parent == ROOT / "vrun" and f.name not in ("__init__.py", "__main__.py")]
    assert flat == [], f"modules outside the layer packages {LAYERS}: {flat}"
    packages = {f.parent.name for f in files.values() if f.parent.parent == ROOT / "vrun" and f.name == "__init__.py"}
    assert packages == set(LAYERS)


def test_every_package_says_what_it_owns():
    """Each package's docstring says what it owns; each layer package says what it may import."""
    code_packages = [ROOT / "vrun", *(d for d in (ROOT / "vrun").iterdir() if (d / "__init__.py").is_file()),
                     ROOT / "vrun" / "launch" / "slurm"]
    for init in (d / "__init__.py" for d in sorted(code_packages)):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 80, f"{init.relative_to(ROOT)}: no docstring saying what the package owns"
        if init.parent.parent.name == "vrun" and init.parent.name in LAYERS[1:]:
            assert "import" in doc, f"{init.relative_to(ROOT)}: the docstring does not say what it may import"


def test_imports_only_go_down():
    """No module imports a package of a later stage, at module level or inside a function."""
    assert upward(import_graph()) == []


def test_no_import_cycles():
    """No two project modules import each other, directly or through others (lazy imports included)."""
    assert cycles(import_graph()) == []


def test_the_layer_checks_fire():
    """Both checks see what they are for (a check that cannot fail is no check)."""
    graph = {"vrun.core.a": {"vrun.launch.b"}, "vrun.launch.b": {"vrun.core.a"}, "vrun.estimate.c": set()}
    assert upward(graph) == ["vrun.core.a imports vrun.launch.b (core < launch)"]
    assert cycles(graph) == [["vrun.core.a", "vrun.launch.b"]]
    probe = ROOT / "vrun" / "core" / "_layer_probe_tmp.py"
    probe.write_text("def f():\n    from vrun.launch import local\n")
    try:
        known = vrun_modules()
        assert imports_of(probe, known) == {"vrun.launch.local"}
    finally:
        probe.unlink()


# the one module that may import pickle, and why: it copies a composed config in memory (pickle.loads of bytes
# pickle.dumps made in the same process), never reading a file
IN_MEMORY_PICKLE = {"hydra_plugins/vrun_sweeper/vrun_sweeper.py"}
# the one module that may talk to other processes through multiprocessing (pickle underneath): the sweep's forked
# workers send their points over a pipe to the process that forked them, never through a file
FORKED_WORKERS = {"hydra_plugins/vrun_sweeper/workers.py"}


def test_no_run_dir_payload_is_unpickled():
    """The plan travels as plan.json (one reader: vrun.rundir.record); nothing in the project's code imports pickle
    (submitit pickles its own job callable, which holds no plan of ours to load back), except the sweeper's
    in-memory copy of a composed config, which only ever loads what it dumped (no pickle.load, no Unpickler), and
    the sweep's forked workers, which send planned points to their parent over a pipe (multiprocessing)."""
    found = []
    for f in project_files():
        if f.parts[len(ROOT.parts)] not in ("vrun", "hydra_plugins") and f.name != "runner.py":
            continue
        tree = ast.parse(f.read_text(), filename=str(f))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{f.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                      if n.split(".")[0] == "multiprocessing" and str(f.relative_to(ROOT)) not in FORKED_WORKERS]
            found += [f"{f.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in
                      ("pickle", "cloudpickle", "dill") and
                      not (n == "pickle" and isinstance(node, ast.Import) and
                           str(f.relative_to(ROOT)) in IN_MEMORY_PICKLE)]
        if str(f.relative_to(ROOT)) in IN_MEMORY_PICKLE:
            uses = [(n.lineno, n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and
                    isinstance(n.value, ast.Name) and n.value.id == "pickle"]
            loads = [line for line, attr in uses if attr == "loads"]
            found += [f"{f.relative_to(ROOT)}:{line}: pickle.{attr}" for line, attr in uses
                      if attr not in ("dumps", "loads")]
            # each pickle.loads reads bytes kept from a pickle.dumps of the same module
            assert len(loads) <= len([1 for _, attr in uses if attr == "dumps"]), uses
    assert found == [], "\n".join(found)


# the probes of a path that raise on a name too long, a NUL byte or ~nosuchuser (pathlib's methods, os.stat,
# os.access, os.path.getsize, ...); every other module asks vrun.core.fs, which answers "not there, because ..."
RAISING_PROBES = {"exists", "is_file", "is_dir", "is_symlink", "is_mount", "is_fifo", "is_socket", "is_block_device",
                  "is_char_device", "samefile", "expanduser", "stat", "lstat", "access", "getsize", "getmtime",
                  "getatime", "getctime"}
# os.path's own that never raise (they answer False, or the path unchanged)
SAFE_ON_OS_PATH = {"exists", "expanduser"}
FS_HOME = "vrun/core/fs.py"


def probes(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls of a raising probe: `<anything>.exists()` and friends with no arguments (a pathlib method),
    `Path.exists(p)`, the os and os.path functions by name, and those names imported from os or os.path."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module in ("os", "os.path"):
            out += [(n.lineno, a.name) for a in n.names if a.name in RAISING_PROBES]
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in RAISING_PROBES):
            continue
        base, attr = n.func.value, n.func.attr
        on_os = isinstance(base, ast.Name) and base.id == "os" or \
            isinstance(base, ast.Attribute) and base.attr == "path" and isinstance(base.value, ast.Name) and \
            base.value.id == "os"
        on_class = isinstance(base, ast.Name) and base.id in ("Path", "PurePath", "PosixPath")
        if on_os and attr not in SAFE_ON_OS_PATH or on_class or not on_os and not n.args:
            out.append((n.lineno, attr))
    return out


def test_every_path_probe_goes_through_fs():
    """A path a user typed can be anything a string can be: `Path(p).is_file()` raises on a 5,000-character name
    (OSError: File name too long) and on a NUL byte, `Path(p).expanduser()` on ~nosuchuser, and a plan that meets
    one crashes instead of saying so."""
    found = []
    for f in project_files():
        if f.parts[len(ROOT.parts)] not in ("vrun", "hydra_plugins") and f.name != "runner.py":
            continue
        if str(f.relative_to(ROOT)) == FS_HOME:
            continue
        found += [f"{f.relative_to(ROOT)}:{line}: {attr}" for line, attr in probes(ast.parse(f.read_text()))]
    assert found == [], "\n".join(found)


def test_the_probe_check_sees_these_spellings():
    """The spellings the check knows (a getattr by name would pass it: none is written in the project)."""
    flagged = ["Path('a').exists()", "os.stat('a')", "os.path.getsize('a')", "(p / 'x').is_file()", "os.access('a', 4)",
               "Path.is_file(p)", "p.is_fifo()", "Path(s).expanduser()", "os.lstat(s)"]
    fine = ["os.path.exists('a')", "os.path.expanduser(s)", "d.get('a')", "os.fstat(3)", "self.path.exists(x)",
            "m.group()"]
    for src in flagged:
        assert probes(ast.parse(src)), src
    for src in fine:
        assert not probes(ast.parse(src)), src
    assert [a for _, a in probes(ast.parse("from os import stat\nfrom os.path import getsize, join\n"))] == \
        ["stat", "getsize"]


def test_one_caller_of_make_plan():
    """Every run, a single one too, is planned by the sweeper: make_plan has one caller in the project's code."""
    callers = []
    for f in project_files():
        if f.parts[len(ROOT.parts)] in ("tests", "bench"):
            continue
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == \
                    "make_plan":
                callers.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert callers == ["hydra_plugins/vrun_sweeper/vrun_sweeper.py:" + callers[0].rsplit(":", 1)[1]] if callers \
        else False, callers


def target_matching(tree: ast.AST) -> list[int]:
    """Lines that read a config's _target_ (`x["_target_"]`, `x.get("_target_")`, `select(x, "…_target_")`) or
    look for a launcher's name in a string (`"Launcher" in …`, `"submitit" in …`)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "_target_":
            out.append(node.lineno)
        elif isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and
                                                a.value.endswith("_target_") for a in node.args):
            out.append(node.lineno)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                isinstance(node.left.value, str) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) and \
                (node.left.value == "submitit" or any(w in node.left.value.lower() for w in ("launcher", "_target_"))):
            out.append(node.lineno)
    return out


def test_no_class_name_or_target_matching():
    """Launchers are told apart by type (hydra_plugins/vrun_launcher: PlannedLauncher) and the group choice, never
    by their class name or _target_ string."""
    found = [f"{f.relative_to(ROOT)}:{n}" for f in project_files() if f.parts[len(ROOT.parts)] not in ("tests", "bench")
             for n in target_matching(ast.parse(f.read_text(), filename=str(f)))]
    assert found == [], "\n".join(found)
    probe = ast.parse('a = cfg.get("_target_", "")\nb = "SlurmLauncher" in str(a)\nc = x["_target_"]\n')
    assert target_matching(probe) == [1, 2, 3] or sorted(target_matching(probe)) == [1, 2, 3]


def key_literals(path: Path, prefix: str) -> list[str]:
    """String constants in `path` (f-string parts included, docstrings not) that are verl keys under `prefix`."""
    import re

    shape = re.compile(rf"^{re.escape(prefix)}(\.[A-Za-z0-9_]+)*\.?$")
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [f"{path.relative_to(ROOT)}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs and shape.match(n.value)]


# verl's PPO sections, spelled once each: the rollout (and its replica's sizes) where the lowest layer that reads
# it is (the mesh rules, mesh=auto), the actor and the model in the PPO record
KEY_HOMES = {"actor_rollout_ref.rollout": "vrun/estimate/rollout.py", "actor_rollout_ref.actor": "vrun/entrypoints/ppo.py",
             "actor_rollout_ref.model": "vrun/entrypoints/ppo.py"}


def test_verl_sections_are_spelled_in_one_module():
    """Every other module reads ROLLOUT, ROLLOUT_TP/DP/EP, ACTOR or the record's `model` (one home per fact)."""
    found = [line for f in sorted((ROOT / "vrun").rglob("*.py")) for prefix, home in KEY_HOMES.items()
             if str(f.relative_to(ROOT)) != home for line in key_literals(f, prefix)]
    assert found == [], "\n".join(found)


def test_the_key_check_sees_a_literal():
    """The check fires on a plain literal and on an f-string's part, not on a docstring."""
    probe = ROOT / "vrun" / "_keys_probe_tmp.py"
    probe.write_text('"""actor_rollout_ref.rollout.n"""\nK = "actor_rollout_ref.rollout.tensor_model_parallel_size"\n'
                     'J = f"actor_rollout_ref.rollout.{K}"\n')
    try:
        found = key_literals(probe, "actor_rollout_ref.rollout")
    finally:
        probe.unlink()
    assert [x.split(": ", 1)[1] for x in found] == ["'actor_rollout_ref.rollout.tensor_model_parallel_size'",
                                                      "'actor_rollout_ref.rollout.'"]

"""The code's shape: no module reaches into another project module's private names."""
import ast
from pathlib import Path

from conftest import ROOT

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
    bad.write_text("from vrun.checks.plan_checks import _gone\nfrom vrun import plan\nplan._private_helper\n")
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

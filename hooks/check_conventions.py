"""Repository conventions for conf/: option names, required fields, and that every default actually works.

    python -m hooks.check_conventions [--root DIR]

Exits 0 when clean, 1 with one line per violation (`<file>: <rule broken, with the numbers>`). Reads the YAML
with PyYAML only (no Hydra, no verl) so it runs as a pre-commit hook in well under a second; the mesh rules
are vrun.estimate.mesh's own pure functions, so a preset passes here exactly when a plan would accept it.

Rules:
  1. mesh presets are named <N>gpu or <N>gpu_<suffix> with N == nnodes × gpus_per_node (`auto` is exempt
     from the name rule) and hold exactly the fields nnodes, gpus_per_node, tp, pp, vpp, ep, etp, cp,
     all positive integers
  2. every mesh preset passes vrun.estimate.mesh.mesh_problems for at least one model option
  3. model options: `# @package _global_`, model.name == stem, a known mlite_name, path_env, tp_allowed,
     etp_allowed, the arch numbers the rules need (o_groups for deepseek_v4), exactly one
     `override /mesh: X` with conf/mesh/X.yaml present, and that mesh passes mesh_problems for the model
     (and rollout_problems where the model or its launcher sets the rollout TP)
  4. every launcher file is included by some model, and every model includes exactly one existing launcher
  5. algo/optimizer/cluster/data options carry their own name (and algo a known entrypoint, optimizer a
     Megatron Lite optimizer)
  6. every option file is named [a-z0-9_]+.yaml
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Optional

import yaml

if __package__ in (None, ""):  # run as a file path (python hooks/check_conventions.py): put the repo root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vrun.core import dotted
from vrun.compose import mlite  # noqa: E402
from vrun.entrypoints import PPO, ROLLOUT  # noqa: E402
from vrun.estimate.mesh import SIZES, Mesh, mesh_problems, rollout_problems  # noqa: E402
from vrun.config.schema import Arch, EntrypointName, OptimizerName  # noqa: E402

MESH_FIELDS = SIZES
MESH_NAME = re.compile(r"([1-9][0-9]*)gpu(?:_[a-z0-9_]+)?")
MESH_EXEMPT = {"auto"}
OPTION_NAME = re.compile(r"[a-z0-9_]+\.yaml")
# the model families Megatron Lite's record lists ImplConfig fields for
MLITE_NAMES = tuple(sorted(set(mlite.record()["impl_cfg_fields"]) - {"common"}))
ARCH_REQUIRED = ("layers", "routed_experts", "experts_per_token", "heads", "hidden")
# read by vrun.estimate.mesh's rules when present: null or a positive integer
ARCH_OPTIONAL = ("kv_heads", "o_groups", "gdn_k_heads", "gdn_v_heads")
ENTRYPOINTS = tuple(e.value for e in EntrypointName)
OPTIMIZERS = tuple(o.value for o in OptimizerName)
ROLLOUT_TP = f"recipe.{PPO.name.value}.{ROLLOUT}.tensor_model_parallel_size"
MESH_OVERRIDE = "override /mesh"
LAUNCHER_PREFIX = "/launcher/"

_MISSING = dotted.MISSING


def check(root: Path) -> list[str]:
    """Every convention conf/ under `root` breaks, one line each, grouped by file."""
    root = Path(root)
    conf = root / "conf"
    if not conf.is_dir():
        return [f"{conf.as_posix()}: no conf/ directory"]
    out: list[str] = []
    rel = lambda p: p.relative_to(root).as_posix()  # noqa: E731

    out += _file_names(conf, rel)
    meshes = _meshes(conf, rel, out)
    launchers = {p.stem: _load(p, rel, out) for p in _options(conf, "launcher")}
    models, included = _models(conf, rel, meshes, launchers, out)
    out += _meshes_used(meshes, models)
    for stem in sorted(set(launchers) - included):
        out.append(f"conf/launcher/{stem}.yaml: included by no model file (add `- {LAUNCHER_PREFIX}{stem}` "
                   f"to a model's defaults, or delete it)")
    out += _named_options(conf, rel)
    return sorted(out, key=lambda line: line.split(": ", 1)[0])


# rule 6 ---------------------------------------------------------------------------------------------------

def _file_names(conf: Path, rel) -> list[str]:
    out = []
    for group in sorted(d for d in conf.iterdir() if d.is_dir() and not d.name.startswith((".", "__"))):
        for p in sorted(group.rglob("*")):
            if p.is_file() and not p.name.startswith(".") and "__pycache__" not in p.parts \
                    and not OPTION_NAME.fullmatch(p.name):
                out.append(f"{rel(p)}: option file name must match [a-z0-9_]+\\.yaml")
    return out


# rule 1 ---------------------------------------------------------------------------------------------------

def _meshes(conf: Path, rel, out: list[str]) -> dict[str, Optional[Mesh]]:
    """Each mesh preset by stem: its Mesh, or None when its fields are broken (reported)."""
    meshes: dict[str, Optional[Mesh]] = {}
    for p in _options(conf, "mesh"):
        f = rel(p)
        data = _load(p, rel, out)
        meshes[p.stem] = None
        if data is None:
            continue
        name_ok = p.stem in MESH_EXEMPT or MESH_NAME.fullmatch(p.stem)
        if not name_ok:
            out.append(f"{f}: mesh preset name must be <N>gpu or <N>gpu_<suffix> (suffix [a-z0-9_]+), "
                       f"N = nnodes×gpus_per_node")
        missing = [k for k in MESH_FIELDS if k not in data]
        # only mesh=auto carries `search: true` (it asks the plan to search the mesh)
        allowed = MESH_FIELDS + (("search",) if p.stem in MESH_EXEMPT else ())
        extra = [str(k) for k in data if k not in allowed]
        if p.stem in MESH_EXEMPT and data.get("search") is not True:
            out.append(f"{f}: mesh=auto must set search: true")
        if missing:
            out.append(f"{f}: mesh preset lacks {', '.join(missing)} (a preset sets exactly "
                       f"{', '.join(MESH_FIELDS)})")
        if extra:
            out.append(f"{f}: mesh preset has unknown field(s) {', '.join(extra)} (a preset sets exactly "
                       f"{', '.join(MESH_FIELDS)})")
        bad = [k for k in MESH_FIELDS if k in data and not _pos_int(data[k])]
        for k in bad:
            out.append(f"{f}: {k} must be a positive integer, got {data[k]!r}")
        n, g = data.get("nnodes"), data.get("gpus_per_node")
        m = MESH_NAME.fullmatch(p.stem)
        if m and _pos_int(n) and _pos_int(g) and int(m.group(1)) != n * g:
            out.append(f"{f}: name says {m.group(1)} GPUs but nnodes×gpus_per_node = {n}×{g} = {n * g}")
        if not missing and not extra and not bad:
            meshes[p.stem] = Mesh.of(data)
    return meshes


# rule 2 ---------------------------------------------------------------------------------------------------

def _meshes_used(meshes: dict[str, Optional[Mesh]], models: dict[str, dict]) -> list[str]:
    if not models:  # no usable model option: rule 3 has reported why; every mesh would fail here as noise
        return []
    out = []
    for stem, mesh in meshes.items():
        if mesh is None:
            continue
        by_why: dict[str, list[str]] = {}  # the first error each model finds, models sharing one grouped
        for name, mod in models.items():
            errs = _errors(mesh_problems(mesh, mod["arch"], mod["tp_allowed"], mod["etp_allowed"], name))
            if not errs:
                break
            by_why.setdefault(f"{errs[0].key}={errs[0].value}: {errs[0].why}", []).append(name)
        else:
            why = "; ".join(f"{'every model' if len(names) == len(models) else ', '.join(names)}: {w}"
                            for w, names in by_why.items())
            out.append(f"conf/mesh/{stem}.yaml: valid for no model option ({why})")
    return out


# rules 3 and 4 --------------------------------------------------------------------------------------------

def _models(conf: Path, rel, meshes: dict[str, Optional[Mesh]], launchers: dict[str, Any],
            out: list[str]) -> tuple[dict[str, dict], set[str]]:
    """Model options whose rule inputs are usable (by stem), and the launcher stems some model includes."""
    usable: dict[str, dict] = {}
    included: set[str] = set()
    for p in _options(conf, "model"):
        f, stem = rel(p), p.stem
        data = _load(p, rel, out)
        if data is None:
            continue
        pkg = _package(p.read_text(encoding="utf-8"))
        if pkg != "_global_":
            out.append(f"{f}: must start with `# @package _global_` (found "
                       f"{'no @package header' if pkg is None else '@package ' + pkg})")
        model = data.get("model")
        if not isinstance(model, dict):
            out.append(f"{f}: has no `model:` mapping")
            model = {}
        name = model.get("name", _MISSING)
        if name is _MISSING:
            out.append(f"{f}: model.name is missing (it must be {stem!r}, the file stem)")
        elif name != stem:
            out.append(f"{f}: model.name is {name!r} but the file is {stem}.yaml (they must match)")
        mlite = model.get("mlite_name", _MISSING)
        if mlite not in MLITE_NAMES:
            out.append(f"{f}: model.mlite_name is {_show(mlite)}, not one of {', '.join(MLITE_NAMES)}")
        if not isinstance(model.get("path_env"), str) or not model.get("path_env"):
            out.append(f"{f}: model.path_env must name the environment variable holding the checkpoint path, "
                       f"got {_show(model.get('path_env', _MISSING))}")
        ok = True
        for key in ("tp_allowed", "etp_allowed"):
            v = model.get(key, _MISSING)
            if not (isinstance(v, list) and v and all(_pos_int(x) for x in v)):
                out.append(f"{f}: model.{key} must be a non-empty list of positive integers, got {_show(v)}")
                ok = False
        arch = model.get("arch")
        if not isinstance(arch, dict):
            out.append(f"{f}: has no model.arch mapping (it needs {', '.join(ARCH_REQUIRED)})")
            arch, ok = {}, False
        need = ARCH_REQUIRED + (("o_groups",) if mlite == "deepseek_v4" else ())
        for key in need:
            if not _pos_int(arch.get(key)):
                why = " (deepseek_v4: rollout TP must divide it)" if key == "o_groups" else ""
                out.append(f"{f}: model.arch.{key} must be a positive integer{why}, "
                           f"got {_show(arch.get(key, _MISSING))}")
                ok = False
        for key in ARCH_OPTIONAL:
            if key not in need and arch.get(key) is not None and not _pos_int(arch.get(key)):
                out.append(f"{f}: model.arch.{key} must be null or a positive integer, got {arch[key]!r}")
                ok = False

        defaults = data.get("defaults", [])
        if not isinstance(defaults, list):
            out.append(f"{f}: defaults must be a list")
            defaults = []
        mesh_names = [d[MESH_OVERRIDE] for d in defaults if isinstance(d, dict) and MESH_OVERRIDE in d]
        mesh_name = None
        if len(mesh_names) != 1:
            out.append(f"{f}: defaults must hold exactly one `{MESH_OVERRIDE}: <preset>`, found {len(mesh_names)}")
        elif str(mesh_names[0]) not in meshes:
            out.append(f"{f}: default mesh {mesh_names[0]}: conf/mesh/{mesh_names[0]}.yaml does not exist")
        else:
            mesh_name = str(mesh_names[0])

        incl = [d[len(LAUNCHER_PREFIX):] for d in defaults if isinstance(d, str) and d.startswith(LAUNCHER_PREFIX)]
        launcher = None
        if len(incl) != 1:
            out.append(f"{f}: defaults must include exactly one launcher file (`- {LAUNCHER_PREFIX}<stem>`), "
                       f"found {len(incl)}")
        for s in incl:
            if s in launchers:
                included.add(s)
            else:
                out.append(f"{f}: includes {LAUNCHER_PREFIX}{s} but conf/launcher/{s}.yaml does not exist")
        if len(incl) == 1 and incl[0] in launchers:
            launcher = incl[0]

        if not ok:
            continue
        usable[stem] = mod = {"arch": Arch.of(arch), "tp_allowed": model["tp_allowed"],
                              "etp_allowed": model["etp_allowed"]}
        mesh = meshes.get(mesh_name) if mesh_name else None
        if mesh is None:  # absent, or its own fields are broken (reported against the mesh file)
            continue
        errs = _errors(mesh_problems(mesh, mod["arch"], mod["tp_allowed"], mod["etp_allowed"], stem))
        for prob in errs:
            out.append(f"{f}: default mesh {mesh_name} fails for {stem}: {prob.key}={prob.value}: {prob.why}; "
                       f"fix: {prob.fix}")
        # the model's own value wins over its launcher's (_self_ comes after the launcher in its defaults)
        rtp, where = dotted.get(data, ROLLOUT_TP, _MISSING), f"{p.stem}.yaml"
        if rtp in (None, _MISSING) and launcher is not None and isinstance(launchers[launcher], dict):
            rtp, where = dotted.get(launchers[launcher], ROLLOUT_TP, _MISSING), f"launcher/{launcher}.yaml"
        if not errs and rtp not in (None, _MISSING):
            for prob in _errors(rollout_problems(mesh, rtp, mod["arch"], stem)):
                out.append(f"{f}: default mesh {mesh_name} with rollout TP {rtp} (from {where}) fails for "
                           f"{stem}: {prob.why}; fix: {prob.fix}")
    return usable, included


# rule 5 ---------------------------------------------------------------------------------------------------

def _named_options(conf: Path, rel) -> list[str]:
    out: list[str] = []
    # group -> the key holding the option's name (algo/data are `_global_` files, the others are packaged)
    for group, packaged in (("algo", "algo.name"), ("optimizer", "name"), ("cluster", "name"), ("data", "data.name")):
        for p in _options(conf, group):
            key = packaged
            f, stem = rel(p), p.stem
            data = _load(p, rel, out)
            if data is None:
                continue
            name = dotted.get(data, key, _MISSING)
            if name is _MISSING and "." not in key:
                # an option may be a `_global_` file (cluster=slurm also selects the launcher): group.name
                key = f"{group}.{key}"
                name = dotted.get(data, key, _MISSING)
            if name is _MISSING:
                out.append(f"{f}: {key} is missing (it must be {stem!r}, the file stem)")
            elif name != stem:
                out.append(f"{f}: {key} is {name!r} but the file is {stem}.yaml (they must match)")
            if group == "algo" and dotted.get(data, "algo.entrypoint", _MISSING) not in ENTRYPOINTS:
                out.append(f"{f}: algo.entrypoint is {_show(dotted.get(data, 'algo.entrypoint', _MISSING))}, "
                           f"not one of {', '.join(ENTRYPOINTS)}")
            if group == "optimizer" and name is not _MISSING and name not in OPTIMIZERS:
                out.append(f"{f}: name {name!r} is not a Megatron Lite optimizer ({', '.join(OPTIMIZERS)})")
    return out


# helpers --------------------------------------------------------------------------------------------------

def _options(conf: Path, group: str) -> list[Path]:
    d = conf / group
    return sorted(p for p in d.glob("*.yaml") if p.is_file()) if d.is_dir() else []


def _load(p: Path, rel, out: list[str]) -> Optional[dict]:
    """The file's top-level mapping (an empty file is {}), or None with the reason appended to `out`."""
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        out.append(f"{rel(p)}: not valid YAML: {' '.join(str(e).split())}")
        return None
    if data is None:
        return {}
    if not isinstance(data, dict):
        out.append(f"{rel(p)}: must be a YAML mapping, got {type(data).__name__}")
        return None
    return data


def _package(text: str) -> Optional[str]:
    """The `# @package` value as Hydra reads it: only from the header, the lines before any other line."""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not re.match(r"#\s*@", line):
            return None
        parts = line.lstrip("#").split()
        if len(parts) == 2 and parts[0] == "@package":
            return parts[1]
    return None


def _pos_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _errors(problems: list) -> list:
    return [p for p in problems if not p.warning]


def _show(v: Any) -> str:
    return "nothing" if v is _MISSING else repr(v)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hooks.check_conventions", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="repository root holding conf/ (default: .)")
    args = ap.parse_args(argv)
    problems = check(args.root)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""verl's own config tree, composed from the installed verl package, and overrides applied to it.

The tree is composed once per (config name, group choices) with Hydra's config loader against
`<verl>/trainer/config` — the installed package's files, never a copy — and kept as plain dicts. A composed tree
is also kept in the state dir (`<state dir>/cache/`, JSON), keyed by the config name, the group choices, Hydra's
version and the fingerprint of every YAML file of the installed tree, so the next plan reads it back instead of
composing again: a changed file, another verl or another Hydra is another key. It is written only once a plan
was written (`keep_composed`, called by vrun.planning.report), so a refused plan leaves nothing there. Value
overrides are then applied with Hydra's semantics (a key must exist; `+` adds, and only where it may) and
interpolations resolved (vrun.compose.interpolation: a small resolver for the grammar verl's tree uses; anything
else goes to OmegaConf; `resolve` importable from here). `tests/test_verl_tree.py` checks both against Hydra's own override path.
Imports nothing of verl: only `importlib.util.find_spec` locates it.
"""
from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from vrun.compose.interpolation import resolve, resolve_fast  # noqa: F401 - the resolver; importable from here
from vrun.core import digest, writer
from vrun.core.hydra_text import render
from vrun.core.dotted import MISSING
from vrun.core.problems import Problem
from vrun.rundir import records

# 2: the tree kept in Hydra's key order (1 sorted it, so a kept tree wrote verl_config.yaml in another order than
# a composed one)
CACHE_FORMAT = 3  # 3: the kept tree carries its content's digest
KEPT_LIMIT = 32 << 20  # bytes: a kept tree is ~100 kB


@dataclass(frozen=True)
class Override:
    key: str
    value: Any
    # "set": the key must exist; "add": `+key`, the key must not exist
    mode: str = "set"

    def cli(self) -> str:
        return ("+" if self.mode == "add" else "") + f"{self.key}={render(self.value)}"


def verl_config_dir() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed in this Python")
    return Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """The installed verl config tree's fingerprint: every YAML file under it, by path and content."""
    root = verl_config_dir()
    return digest.files(root, sorted(root.rglob("*.yaml")))


# the trees this process composed with Hydra (not read back from the state dir), each as {"key", "tree"}
_COMPOSED: list[dict] = []


def _key(config_name: str, groups: tuple[str, ...]) -> dict:
    import hydra

    return {"format": CACHE_FORMAT, "config_name": config_name, "groups": list(groups), "hydra": hydra.__version__,
            "tree": fingerprint()}


def _cache_file(key: dict) -> Optional[Path]:
    import hashlib

    d = records.state_dir()
    if d is None:
        return None
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return d / "cache" / f"verl-tree-{name}.json"


def content_digest(tree: dict) -> str:
    """The kept tree's own fingerprint: its content, so a tree edited after it was kept is composed again."""
    import hashlib

    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()


def kept_tree(path: Optional[Path], key: dict) -> Optional[dict]:
    """The tree kept for `key`, or None: not kept, or refused (not the user's own file, a link, a FIFO, too large,
    not JSON, kept for another key, or its content no longer what its fingerprint says), said in one line."""
    from vrun.core import fs

    if path is None:
        return None
    text, why = fs.read_checked(path, KEPT_LIMIT, own=True)
    if text is None:
        if why != "no such file":
            fs.ignored(path, why, "composed again")
        return None
    try:
        kept = json.loads(text)
    except (ValueError, RecursionError):
        kept = None
    if not (isinstance(kept, dict) and kept.get("key") == key and isinstance(kept.get("tree"), dict)):
        fs.ignored(path, "not a tree kept for this verl and these groups", "composed again")
        return None
    if kept.get("digest") != content_digest(kept["tree"]):
        fs.ignored(path, "its content no longer matches its fingerprint (edited after it was kept)",
                   "composed again")
        return None
    return kept["tree"]


@functools.lru_cache(maxsize=32)
def _base(config_name: str, groups: tuple[str, ...], config_dir: str) -> dict:
    key = _key(config_name, groups)
    path = _cache_file(key)
    kept = kept_tree(path, key)
    if kept is not None:
        return kept
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(config_dir))
    cfg = loader.load_configuration(config_name=config_name, overrides=list(groups), run_mode=RunMode.RUN)
    out = OmegaConf.to_container(cfg, resolve=False)
    out.pop("hydra", None)
    _COMPOSED.append({"key": key, "tree": out})
    return out


def composed_here() -> list:
    """The trees this process composed and has not kept yet, handed over (a sweep's worker hands them to the parent,
    which keeps them once a plan is written)."""
    out = list(_COMPOSED)
    _COMPOSED.clear()
    return out


def adopt(trees: list) -> None:
    """Trees another process composed for this one (composed_here there), kept with this process's own."""
    _COMPOSED.extend(trees)


def keep_composed() -> None:
    """Keep the trees this process composed in the state dir for the next plans; never fails the caller."""
    while _COMPOSED:
        kept = _COMPOSED.pop()
        path = _cache_file(kept["key"])
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            kept = {**kept, "digest": content_digest(kept["tree"])}
            writer.write_text(path, json.dumps(kept) + "\n", root=str(path.parent),
                              verbatim=True)
        except (OSError, ValueError):
            pass


def base_tree(config_name: str, groups: Iterable[str]) -> dict:
    """A private copy of verl's composed tree (interpolations unresolved)."""
    return _copy(base_view(config_name, groups))


def base_view(config_name: str, groups: Iterable[str]) -> dict:
    """verl's composed tree, shared and cached: read it, never change it (base_tree gives a copy to change)."""
    return _base(config_name, tuple(groups), str(verl_config_dir()))


def _copy(x: Any) -> Any:
    """Copy of a tree of dicts, lists and scalars (several times faster than copy.deepcopy)."""
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy(v) for v in x]
    return x


def apply(tree: dict, overrides: Iterable[Override], open_maps: Iterable[str] = ()) -> list[Problem]:
    """Apply overrides in place. Returns a problem for each key verl's tree does not have."""
    problems = []
    for ov in overrides:
        parts = ov.key.split(".")
        node, missing_at = tree, None
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part, MISSING) if isinstance(node, dict) else MISSING
            if nxt is MISSING or nxt is None and ov.mode == "add":
                if ov.mode != "add":
                    missing_at = i
                    break
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                missing_at = i
                break
            node = nxt
        leaf = parts[-1]
        if missing_at is None and ov.mode == "set" and leaf not in node:
            missing_at = len(parts) - 1
        if missing_at is not None:
            problems.append(unknown_key(tree, ov.key, ov.value))
            continue
        if ov.mode == "add" and leaf in node:
            problems.append(Problem(ov.key, ov.value, "an item is already there; `+` only adds",
                                    f"set it without `+`: {ov.key}={render(ov.value)}"))
            continue
        node[leaf] = _copy(ov.value)
    return problems


def unknown_key(tree: dict, key: str, value: Any) -> Problem:
    import difflib

    parts = key.split(".")
    node, known = tree, []
    for part in parts:
        if isinstance(node, dict) and part in node:
            known.append(part)
            node = node[part]
        else:
            break
    prefix = ".".join(known)
    options = sorted(node.keys()) if isinstance(node, dict) else []
    bad = parts[len(known)]
    near = difflib.get_close_matches(bad, options, n=3, cutoff=0.6)
    where = f"under '{prefix}'" if prefix else "at the top level"
    fix = (" or ".join(".".join(known + [n] + parts[len(known) + 1:]) for n in near)) if near else \
        f"one of {options[:12]}{' …' if len(options) > 12 else ''}"
    return Problem(key, value, f"verl's config has no '{bad}' {where} (it would be ignored or rejected)", fix)

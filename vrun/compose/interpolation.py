"""Interpolations resolved in a plain-dict config tree: a small resolver for the grammar verl's tree uses (`${a.b}`,
relative `${..x}`, `oc.select` and `oc.env` with their defaults, interpolations inside strings), OmegaConf for
anything beyond it. `tests/test_verl_tree.py` checks the small one against OmegaConf's own resolution.
"""
from __future__ import annotations

import re
from typing import Any


class _Unsupported(Exception):
    pass


def resolve(tree: dict) -> dict:
    """Resolve every interpolation; the fast resolver handles verl's grammar, OmegaConf the rest."""
    try:
        return resolve_fast(tree)
    except _Unsupported:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)


def resolve_fast(tree: dict) -> dict:
    """Resolve with the small resolver only (raises when the tree uses grammar beyond verl's)."""
    return _Resolver(tree).run()


class _Resolver:
    def __init__(self, tree: dict):
        self.tree = tree
        self.done: dict[tuple, Any] = {}
        self.busy: set[tuple] = set()

    def run(self) -> dict:
        return self._walk(self.tree, ())

    def _walk(self, node: Any, path: tuple) -> Any:
        if isinstance(node, dict):
            return {k: self._walk(v, path + (k,)) for k, v in node.items()}
        if isinstance(node, list):
            return [self._walk(v, path + (i,)) for i, v in enumerate(node)]
        if isinstance(node, str) and "${" in node:
            return self._value(path)
        return node

    def _value(self, path: tuple) -> Any:
        if path in self.done:
            return self.done[path]
        node = self._raw(path)
        if isinstance(node, str) and "${" in node:
            if path in self.busy:
                raise _Unsupported("cycle")
            self.busy.add(path)
            node = self._string(node, path[:-1])
            self.busy.discard(path)
        elif isinstance(node, (dict, list)):
            node = self._walk(node, path)
        self.done[path] = node
        return node

    def _raw(self, path: tuple) -> Any:
        node: Any = self.tree
        for p in path:
            if isinstance(node, dict) and p in node:
                node = node[p]
            elif isinstance(node, list) and isinstance(p, int) and p < len(node):
                node = node[p]
            else:
                raise KeyError(path)
        return node

    def _string(self, s: str, parent: tuple) -> Any:
        pieces, i = [], 0
        while i < len(s):
            j = s.find("${", i)
            if j < 0:
                pieces.append(s[i:])
                break
            if j > i:
                pieces.append(s[i:j])
            end = _match(s, j)
            pieces.append(self._expr(s[j + 2:end], parent))
            i = end + 1
        if len(pieces) == 1:
            return pieces[0]
        return "".join("null" if p is None else str(p) for p in pieces)

    def _expr(self, body: str, parent: tuple) -> Any:
        body = body.strip()
        if body.startswith("oc.select:"):
            args = _split_args(body[len("oc.select:"):])
            key = args[0].strip()
            default = self._literal(args[1], parent) if len(args) > 1 else None
            try:
                return self._value(self._path(key, parent))
            except KeyError:
                return default
        if body.startswith("oc.env:"):
            import os

            args = _split_args(body[len("oc.env:"):])
            name = args[0].strip()
            if name in os.environ:
                return os.environ[name]
            if len(args) > 1:
                v = self._literal(args[1], parent)
                return None if v is None else str(v)
            raise _Unsupported(f"unset env {name}")
        if ":" in body or not re.fullmatch(r"\.*[\w.\-]+", body):
            raise _Unsupported(body)
        try:
            return self._value(self._path(body, parent))
        except KeyError:
            raise _Unsupported(body)

    def _path(self, key: str, parent: tuple) -> tuple:
        if key.startswith("."):
            dots = len(key) - len(key.lstrip("."))
            base = parent[: len(parent) - (dots - 1)] if dots > 1 else parent
            rest = key[dots:]
            return base + tuple(rest.split(".")) if rest else base
        return tuple(key.split("."))

    def _literal(self, text: str, parent: tuple) -> Any:
        t = text.strip()
        if "${" in t:
            return self._string(t, parent)
        low = t.lower()
        if low == "null":
            return None
        if low in ("true", "false"):
            return low == "true"
        if t == "[]":
            return []
        if t == "{}":
            return {}
        if re.fullmatch(r"[-+]?\d+", t):
            return int(t)
        if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", t):
            return float(t)
        if re.fullmatch(r"[\w.\-/]+", t):
            return t
        raise _Unsupported(t)


def _match(s: str, start: int) -> int:
    depth, i = 0, start
    while i < len(s):
        if s.startswith("${", i):
            depth += 1
            i += 2
            continue
        if s[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise _Unsupported(s)


def _split_args(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out

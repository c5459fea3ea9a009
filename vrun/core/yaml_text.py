"""Block YAML for plain data (dicts with string keys, lists, strings, ints, floats, bools, None): verl_config.yaml,
written at every sweep point, where PyYAML's representer costs more than the rest of the point's writing.

`dump(tree)` reads back (yaml.safe_load, OmegaConf.load) as exactly `tree`: strings are written bare only when
they are plain ASCII words no YAML resolver turns into another type, otherwise double-quoted with JSON's escapes
(a subset of YAML's); floats as PyYAML writes them (always with a '.', so YAML 1.1 reads them back as floats).
Anything else (another type, a non-string key, a string outside printable ASCII) goes to PyYAML for the whole
document, so the fast path never has to be right about the rare cases. tests/test_yaml_text.py holds it to that.
"""
from __future__ import annotations

import json
import math
import re

# bare: starts with a letter, '_' or '/', then word characters and . / - + @ (no ': ', ' #', quotes or flow
# characters), and none of YAML 1.1's booleans or nulls (PyYAML's resolvers; OmegaConf adds only floats, which
# cannot start with a letter except .inf/.nan, which start with '.')
_BARE = re.compile(r"[A-Za-z_/][A-Za-z0-9_./+@-]*\Z")
_WORDS = frozenset({"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"})
_PRINTABLE = re.compile(r"[ -~]*\Z")


class _Other(Exception):
    """A value the fast path leaves to PyYAML."""


def dump(tree) -> str:
    try:
        if _empty(tree) is not None:
            return _empty(tree) + "\n"
        lines: list[str] = []
        _node(tree, 0, lines)
        return "\n".join(lines) + "\n"
    except _Other:
        import yaml

        return yaml.dump(tree, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False,
                         default_flow_style=False, allow_unicode=True)


def _scalar(v) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    t = type(v)
    if t is int:
        return str(v)
    if t is float:
        if math.isnan(v):
            return ".nan"
        if math.isinf(v):
            return ".inf" if v > 0 else "-.inf"
        s = repr(v).lower()
        if "." not in s and "e" in s:  # 1e-06 → 1.0e-06 (YAML 1.1 needs the dot)
            s = s.replace("e", ".0e", 1)
        return s
    if t is str:
        return _string(v)
    raise _Other


def _string(s: str) -> str:
    if _BARE.match(s) and s.lower() not in _WORDS:
        return s
    if not _PRINTABLE.match(s):
        raise _Other
    return json.dumps(s)


def _empty(v) -> str | None:
    if type(v) is dict and not v:
        return "{}"
    if type(v) is list and not v:
        return "[]"
    return None


def _nested(v) -> bool:
    return type(v) in (dict, list) and len(v) > 0


def _node(v, indent: int, lines: list) -> None:
    """A non-empty mapping or list (or a scalar document) at `indent` spaces."""
    pad = " " * indent
    if type(v) is dict:
        for k, x in v.items():
            if type(k) is not str:
                raise _Other
            key = _string(k)
            if _nested(x):
                lines.append(f"{pad}{key}:")
                _node(x, indent + 2 if type(x) is dict else indent, lines)
            else:
                lines.append(f"{pad}{key}: {_empty(x) or _scalar(x)}")
    elif type(v) is list:
        for x in v:
            if _nested(x):
                sub: list[str] = []
                _node(x, 0, sub)
                lines.append(f"{pad}- {sub[0]}")
                lines.extend(f"{pad}  {line}" for line in sub[1:])
            else:
                lines.append(f"{pad}- {_empty(x) or _scalar(x)}")
    else:
        lines.append(_scalar(v))

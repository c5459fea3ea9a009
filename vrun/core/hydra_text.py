"""Values as text for Hydra's override grammar: what the project writes on a command line Hydra parses (verl's
overrides, verl's own SFT command line) and reads back unchanged.

`render(value)` keeps `${...}` an interpolation (a value meant to resolve); `literal(s)` is the string itself,
whatever it holds (spaces, quotes, backslashes, non-ASCII, `${`), and `reads_back(s)` says whether Hydra's parser
and OmegaConf's resolution give `s` back from `key=<literal(s)>` (tests/test_legal_inputs.py runs a Hydra app on it).
"""
from __future__ import annotations

import functools
import re
from typing import Any

_PLAIN = re.compile(r"[A-Za-z0-9_./\-]+")


def _numeric(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _quoted(s: str) -> str:
    """s in single quotes: in Hydra's quoted strings a backslash is literal except in a run before a quote, so
    only those runs (before an inner quote or the closing one) are doubled."""
    out = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", s)
    out = re.sub(r"(\\+)\Z", lambda m: m.group(1) * 2, out)
    return "'" + out + "'"


def render(value: Any) -> str:
    """A value as Hydra's override grammar reads it back; a string holding `${...}` stays an interpolation."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{render(v)}" for k, v in value.items()) + "}"
    s = str(value)
    if "${" in s and _PLAIN.fullmatch(s.replace("${", "").replace("}", "").replace(",", "")):
        return s
    if _PLAIN.fullmatch(s) and s.lower() not in ("null", "true", "false") and not _numeric(s):
        return s
    return _quoted(s)


def literal(s: str) -> str:
    """The string s itself as an override value: plain when it is a plain word, else quoted with `${` escaped
    (never resolved)."""
    if _PLAIN.fullmatch(s) and s.lower() not in ("null", "true", "false") and not _numeric(s):
        return s
    return _quoted(s.replace("${", "\\${"))


@functools.lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def reads_back(s: str, key: str = "hydra.run.dir") -> bool:
    """Whether `key=<literal(s)>` on a Hydra command line is `s` again once parsed and resolved."""
    from omegaconf import OmegaConf

    try:
        o = _parser().parse_override(f"{key}={literal(s)}")
        if o.is_sweep_override():
            return False
        return OmegaConf.create({"v": o.value()}).v == s
    except Exception:  # noqa: BLE001 - a parse or resolution error: it does not read back
        return False

"""The composed run config (Hydra's node, before the typed config is built), checked before anything is written:
keys the typed groups lack, control characters, secrets (vrun.checks.secret), names (vrun.checks.paths) and sbatch
values (vrun.checks.sbatch).

Entry points: `config_problems(cfg, environ, choices)`, called once per point (a run is a sweep of one point) by
the sweeper, before anything is written; `sweep_size_problems(parsed)` before the sweep is expanded.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import typing
from typing import Any, Optional

from vrun.checks import paths as check_paths, sbatch as check_sbatch, secret as check_secrets
from vrun.checks.paths import short
from vrun.checks.secret import leaves
from vrun.core.problems import CONTROL, Problem

# typed groups whose maps are open (any key): the pass-through and verl's own key spaces, env names
OPEN = ("verl", "recipe", "engine", "optim", "env", "model.env", "cluster.additional_parameters")


def containers(cfg: Any) -> tuple:
    """(raw, resolved) plain containers of the run config without the hydra node; resolved is the exception when
    an interpolation fails (composition reports that one, masked)."""
    from omegaconf import DictConfig, OmegaConf, open_dict

    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    raw = OmegaConf.to_container(cfg, resolve=False)
    raw.pop("hydra", None)
    try:
        c = cfg
        if "hydra" in cfg:  # resolved without it (a copy: the caller's config keeps its node)
            c = cfg.copy()
            with open_dict(c):
                c.pop("hydra", None)
        resolved = OmegaConf.to_container(c, resolve=True)
    except Exception as e:  # noqa: BLE001 - reported as one line below
        resolved = e
    return raw, resolved


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def unknown_keys(raw: dict) -> list:
    """Keys under a typed group that its schema lacks (`+mesh.foo=1`): Hydra's `+` adds them, nothing reads them."""
    from vrun.config.schema import RunConfig

    out = []

    def walk(node: Any, cls: Any, prefix: str) -> None:
        if not isinstance(node, dict) or not dataclasses.is_dataclass(cls) or prefix in OPEN:
            return
        hints = _hints(cls)
        for k, v in node.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if k not in hints:
                near = difflib.get_close_matches(str(k), list(hints), n=1, cutoff=0.5)
                out.append(Problem(key, short(v), f"no such key in the run config's {prefix or 'top level'} "
                                   "(nothing would read it)", f"drop +{key}" + (f"; did you mean {prefix}.{near[0]}"
                                                                               if near else "")))
            elif key not in OPEN:
                walk(v, hints[k], key)

    walk(raw, RunConfig, "")
    return out


def schema_type(key: str):
    """The schema's type of a dotted run-config key (Optional[...] unwrapped), or None: not a typed key (an open
    map's entry, a key the schema lacks)."""
    from vrun.config.schema import RunConfig

    cls: Any = RunConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        hint = _hints(cls).get(part)
        if hint is None:
            return None
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        cls = args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint
    return cls


def bool_word_problems(given: list) -> list:
    """Booleans of the project's own knobs typed as another word (`run.resume=no`, `cluster.yes='on'`,
    `cluster.detach=1`): OmegaConf turns yes/no/on/off/y/n/1/0 into a boolean silently, where verl's keys given
    so are refused (vrun.checks.values.type_problems): one spelling, true or false, for both. given: (key, value
    as Hydra parsed it) of each value override typed."""
    out = []
    for key, v in given:
        if isinstance(v, bool) or v is None or schema_type(str(key).lstrip("+~")) is not bool:
            continue
        if isinstance(v, str) and (v.strip().lower() in ("true", "false") or "${" in v):
            continue  # an interpolation: what it resolves to is the schema's to convert
        word = str(v).strip().lower()
        meant = "true" if word in ("yes", "on", "y", "1") else "false" if word in ("no", "off", "n", "0") else None
        k = str(key).lstrip("+~")
        out.append(Problem(k, short(v), "a boolean knob given as a word: OmegaConf would read it as a boolean "
                           "where verl's own keys refuse the same word; one spelling for both",
                           f"{k}={meant} (unquoted)" if meant else f"{k}=true or {k}=false"))
    return out


# the maps whose keys become environment variables of the run's processes (exported on a SLURM node, set by Ray)
ENV_GROUPS = ("env", "model.env")


def env_name_problems(raw: dict) -> list:
    """Keys of the env maps that no shell can export (`+env.A-B=1`, `+env.$X=1`): a variable's name is letters,
    digits and _, not starting with a digit (POSIX's rule, vrun.checks.secret.IDENT)."""
    import re

    from vrun.core.dotted import get

    out = []
    for group in ENV_GROUPS:
        m = get(raw, group, None)
        for k, v in (m.items() if isinstance(m, dict) else ()):
            if check_secrets.IDENT.fullmatch(str(k)):
                continue
            name = re.sub(r"[^A-Za-z0-9_]+", "_", str(k)).strip("_") or "MY_VAR"
            name = f"_{name}" if name[0].isdigit() else name
            out.append(Problem(f"{group}.{short(k)}", short(v), "not a variable name a shell can export (letters, "
                               "digits and _, not starting with a digit): the run's processes could not be given it",
                               f"+{group}.{name}=..."))
    return out


def config_problems(cfg: Any, environ: Optional[dict] = None, choices: Optional[dict] = None,
                    parts: Optional[tuple] = None) -> list:
    """Every problem of the composed run config found before the plan: one per key. parts: containers(cfg), when
    the caller has them already."""
    environ = dict(os.environ if environ is None else environ)
    raw, resolved = parts if parts is not None else containers(cfg)
    problems: list = []
    seen: set = set()

    def add(ps) -> None:
        for p in ps:
            if p.key not in seen:
                seen.add(p.key)
                problems.append(p)

    add(unknown_keys(raw))
    add(env_name_problems(raw))
    add(check_secrets.check(raw, resolved, environ))
    for key, v in leaves(raw):
        if CONTROL.search(key):
            add([Problem(CONTROL.sub("?", key), None, "a key with a control character", "remove it")])
        elif isinstance(v, str) and key not in seen and _control(key, v):
            add([_control_problem(key)])
    if isinstance(resolved, Exception):
        from vrun.config import cli_errors

        line = cli_errors.describe(resolved).removeprefix("error: ")
        head, _, rest = line.partition(": ")
        key, _, shown = head.partition("=")
        if not problems:
            problems.append(Problem(key, shown or "<unresolved>", rest.split("; fix: ")[0],
                                    rest.partition("; fix: ")[2] or f"{key}=<an interpolation that resolves>"))
        return problems
    for key, v in leaves(resolved):
        if key in seen or key.startswith("pass_env"):
            continue
        if isinstance(v, str) and _control(key, v):
            add([_control_problem(key)])
        elif isinstance(v, float) and not math.isfinite(v):
            add([Problem(key, v, "NaN or infinity: every figure computed from it would be meaningless",
                         f"{key}=<a finite number>")])
    add(check_paths.names(resolved, choices, seen))
    add(check_sbatch.check(resolved, seen))
    return problems


def _control(key: str, v: str) -> bool:
    setup = key.startswith(check_sbatch.SETUP_KEYS)
    return bool((check_sbatch.SETUP_CONTROL if setup else CONTROL).search(v))


def _control_problem(key: str) -> Problem:
    return Problem(key, "<control characters>", "a value with a control character (a newline would add a line to "
                   "sbatch.sh or a command line)", f"give {key} on one line, without control characters")


# a sweep larger than this is refused before any point is composed (each point is planned and written)
MAX_SWEEP_POINTS = 10_000


def _empty_sweep(o, v) -> Problem:
    """A swept key that expands to no value: the sweep would have no point."""
    from hydra.core.override_parser.types import RangeSweep

    key = o.get_key_element()
    text = o.input_line.split("=", 1)[1] if getattr(o, "input_line", None) else "<sweep>"
    if isinstance(v, RangeSweep):
        step = v.step or 1
        a, b = (v.start, v.stop) if v.stop is not None else (0, v.start)
        fix = f"{key}=range({a},{b},{-step})" if (b - a) * step < 0 else f"{key}=range({a},{a + step}{f',{step}' if step != 1 else ''})"
        why = f"range from {a} to {b} in steps of {step} holds no value (it stops before it starts)"
        return Problem(key, text, why, fix)
    return Problem(key, text, "the glob matches no option of the group", f"{key}=glob(*) lists them all; or name an option")


def sweep_size_problems(parsed: list, limit: int = MAX_SWEEP_POINTS) -> list:
    """The number of points a sweep's parsed overrides expand to as Hydra's basic sweeper expands them (a product
    over the swept keys; range by arithmetic, choice by its values, glob by the group options it matches), counted
    without building the points, refused over `limit`."""
    import math

    from hydra.core.override_parser.types import ChoiceSweep, Glob, RangeSweep

    n, widest, empty = 1, None, []
    for o in parsed:
        if not o.is_sweep_override():
            continue
        v = o.value()
        if isinstance(v, RangeSweep):
            step = v.step or 1
            k = max(0, math.ceil((v.stop - v.start) / step)) if v.stop is not None else 0
        elif isinstance(v, ChoiceSweep):
            k = len(v.list)
        elif isinstance(v, Glob):
            # as Hydra expands it: the group's options the patterns match (the parser's config loader lists them)
            try:
                k = sum(1 for _ in o.sweep_string_iterator())
            except Exception:  # noqa: BLE001 - no config loader: the patterns, at least one value each
                k = max(1, len(v.include))
        else:
            k = 1
        if k == 0:
            empty.append(_empty_sweep(o, v))
        if widest is None or k > widest[1]:
            widest = (o.key_or_group, k)
        n *= max(k, 1)
    if empty:
        return empty
    if n <= limit:
        return []
    return [Problem("--multirun", f"{n:,} points", f"over the limit of {limit:,} points a sweep plans (each point is "
                    "planned, checked and written)", f"sweep fewer values (the widest: {widest[0]}, {widest[1]:,} "
                    "values) or split the sweep")]

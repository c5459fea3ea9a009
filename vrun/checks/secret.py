"""Secrets in the composed run config: refused at plan time, one line each, the value hidden.

Refused: an interpolation of a secret variable in any spelling (found with OmegaConf's own grammar: quoted names,
spaces, nesting, `${oc.decode:${oc.env:X}}`, a name built by an interpolation), a value that holds a secret's
value anywhere in it (raw or resolved), a value under a key that names a secret, `pass_env` entries that are not
variable names or whose value is too short to be masked, `model.path_env` naming a secret, and setup lines that
carry a literal secret (`export HF_TOKEN=...`, `--token ...`). The rule for what is secret is vrun.core.writer's.
Entry point: `check(raw, resolved, environ)`.
A key that names a secret: vrun.core.problems.names_secret (the same rule for the command line's overrides,
vrun.config.overrides).
"""
from __future__ import annotations

import functools
import re
import shlex
from typing import Any, Iterator, Optional

from vrun.core.problems import Problem, names_secret
from vrun.core.writer import MIN_SECRET, URL_USERINFO, is_secret_name, secret_values, short_secrets

# the default names passed to workers (conf/run.yaml pass_env) are secrets even before the config is read
DEFAULT_PASS_ENV = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_RESOLVERS = ("oc.env", "env")
# a resolver name holding an interpolation (`${oc.${x}:NAME}`): the only way to reach oc.env without writing "env"
DYNAMIC = re.compile(r"\$\{[^:}]*\$\{")
SETUP_KEYS = ("cluster.setup", "cluster.node_setup")


def secret_names(environ: dict, pass_env=()) -> set:
    return {k for k in environ if is_secret_name(k)} | set(DEFAULT_PASS_ENV) | {str(n) for n in pass_env}


def env_refs(value: str) -> list:
    """The variables a value reads through oc.env (see _env_refs)."""
    if "${" not in value or ("env" not in value and not DYNAMIC.search(value)):
        return []
    return list(_env_refs(value))


@functools.lru_cache(maxsize=4096)
def _env_refs(value: str) -> tuple:
    """The variables a value reads through oc.env (or env), by OmegaConf's grammar: a name, or None where the name
    itself is built by an interpolation (or the resolver's name is)."""
    if "${" not in value or ("env" not in value and not DYNAMIC.search(value)):
        return []  # no resolver that can read the environment, and no resolver name built by an interpolation
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as G
    from omegaconf.grammar_parser import parse

    try:
        tree = parse(value)
    except Exception:  # noqa: BLE001 - a value that does not parse fails composition, which reports it
        return []
    out = []

    def walk(node) -> None:
        if isinstance(node, G.InterpolationResolverContext):
            name_ctx = node.resolverName()
            dynamic_name = any(isinstance(c, G.InterpolationContext) for c in _descendants(name_ctx))
            rname = "".join(c.getText() for c in _children(name_ctx)).replace(" ", "")
            if dynamic_name:
                out.append(None)
            elif rname in ENV_RESOLVERS:
                seq = node.sequence()
                first = seq.element(0) if seq is not None and seq.element() else None
                if first is not None:
                    if any(isinstance(c, G.InterpolationContext) for c in _descendants(first)):
                        out.append(None)
                    else:
                        out.append(_literal(first))
        for c in _children(node):
            walk(c)

    walk(tree)
    return tuple(out)


def _descendants(node) -> Iterator[Any]:
    for c in _children(node):
        yield c
        yield from _descendants(c)


def _children(node) -> list:
    get = getattr(node, "getChildren", None)
    return list(get() or []) if get is not None else []


def _literal(element) -> str:
    text = element.getText().strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        q = text[0]
        text = text[1:-1].replace("\\" + q, q).replace("\\\\", "\\")
    return text


def leaves(d: Any, prefix: str = "") -> Iterator[tuple]:
    if isinstance(d, dict):
        if not d and prefix:
            yield prefix, d
        for k, v in d.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(d, list):
        if not d and prefix:
            yield prefix, d
        for i, v in enumerate(d):
            yield from leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, d


def _hide_fix(name: str) -> str:
    return f"remove it; add {name} to pass_env (it reaches the workers by name)"


def check(raw: dict, resolved: Any, environ: dict) -> list:
    """Every secret problem of the composed run config (raw: unresolved container; resolved: the resolved one,
    or an exception when it does not resolve)."""
    pass_env = [str(x) for x in (raw.get("pass_env") or []) if isinstance(x, (str, int))]
    names = secret_names(environ, pass_env)
    values = secret_values(environ, names)
    out: list = []
    seen: set = set()

    def add(p: Problem) -> None:
        if p.key not in seen:
            seen.add(p.key)
            out.append(p)

    def holds(v: str) -> Optional[str]:
        return next((n for s, n in values.items() if s in v), None)

    for key, v in leaves(raw):
        if key.startswith("pass_env"):
            if not (isinstance(v, str) and IDENT.fullmatch(v)) or holds(str(v)):
                add(Problem(key, "<hidden>", "pass_env holds names of variables, not values",
                            "pass_env=[WANDB_API_KEY,HF_TOKEN] (names; export the values)"))
            continue
        if isinstance(v, str):
            refs = env_refs(v)
            if None in refs:
                add(Problem(key, "<hidden>", "names the variable it reads by an interpolation: the plan cannot tell "
                            "whether it is a secret", "interpolate ${oc.env:NAME} with the name written out"))
                continue
            bad = next((r for r in refs if r in names or is_secret_name(r)), None)
            if bad:
                add(Problem(key, "<hidden>", f"interpolates the secret variable {bad}: its value would be written "
                            "into the plan and the verl config", _hide_fix(bad)))
                continue
            found = holds(v)
            if found:
                add(Problem(key, "<hidden>", f"holds the value of the secret variable {found}: it would be written "
                            "into the plan and the verl config", _hide_fix(found)))
                continue
        if names_secret(key) and v not in (None, "", {}, []):
            last = key.rpartition(".")[2]
            add(Problem(key, "<hidden>", "a secret's value would be written into the plan and the verl config",
                        f"export {last} and add it to pass_env=[...,{last}] (it reaches the workers by name)"))
    short = short_secrets(environ, [n for n in pass_env if IDENT.fullmatch(n)])
    if short:
        add(Problem("pass_env", short[0], f"{short[0]} is set to a value shorter than {MIN_SECRET} characters: too "
                    "short to be kept out of every file and line (it would mask ordinary words)",
                    f"export {short[0]} as its real (longer) value, or drop it from pass_env"))
    path_env = (raw.get("model") or {}).get("path_env") if isinstance(raw.get("model"), dict) else None
    if isinstance(path_env, str) and (path_env in names or is_secret_name(path_env)):
        add(Problem("model.path_env", path_env, "names a secret variable: its value would become the model path, "
                    "written into the plan and printed", "model.path_env=<the variable holding the checkpoint "
                    "path>, or model.path=/path/to/checkpoint"))
    for key in SETUP_KEYS:
        group, _, leaf = key.partition(".")
        lines = (raw.get(group) or {}).get(leaf) if isinstance(raw.get(group), dict) else None
        for i, line in enumerate(lines if isinstance(lines, list) else []):
            if isinstance(line, str):
                name = setup_literal(line)
                if name:
                    add(Problem(f"{key}[{i}]", "<hidden>", f"sets {name} to a literal value: the secret would be "
                                "written into sbatch.sh", f"export {name} before submitting and add it to "
                                f"pass_env; in setup lines refer to it as \"${{{name}}}\""))
    if not isinstance(resolved, BaseException):
        for key, v in leaves(resolved):
            if key in seen or key.startswith("pass_env") or not isinstance(v, str):
                continue
            found = holds(v)
            if found:
                add(Problem(key, "<hidden>", f"its value holds the secret variable {found}'s: it would be written "
                            "into the plan and the verl config", _hide_fix(found)))
            elif URL_USERINFO.search(v):
                add(Problem(key, "<hidden>", "a URL with credentials (user:password@): they would be written into "
                            "the plan and the verl config", "drop the credentials from the URL; give them to the "
                            "tool by a variable in pass_env"))
    return out


HEADER = re.compile(r"(?i)(?:authorization\s*:\s*(?:bearer|basic|token)?|bearer)\s+(\S+)")
OPTION = re.compile(r"^--?([A-Za-z][A-Za-z0-9_-]*)(?:=(.*))?$", re.S)


def setup_literal(line: str) -> Optional[str]:
    """The secret a shell line sets to a literal (`export HF_TOKEN=hf_x`, `login --token hf_x`,
    `--password=x`), or None. A reference (`$HF_TOKEN`, `"${HF_TOKEN}"`) is not a literal."""
    try:
        words = shlex.split(line, comments=True, posix=True)
    except ValueError:
        words = line.split()
    for w in words:
        m = HEADER.search(w)
        if m and _literal_value(m.group(1)):
            return "an Authorization header"
    for i, w in enumerate(words):
        name, eq, value = w.partition("=")
        if eq and IDENT.fullmatch(name) and is_secret_name(name) and _literal_value(value):
            return name
        m = OPTION.match(w)
        if m and is_secret_name(m.group(1).replace("-", "_")):
            value = m.group(2) if m.group(2) is not None else (words[i + 1] if i + 1 < len(words) else "")
            if _literal_value(value):
                return m.group(1)
    return None


def _literal_value(value: str) -> bool:
    return bool(value) and not value.startswith("$") and not value.startswith("-")


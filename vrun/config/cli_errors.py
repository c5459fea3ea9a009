"""Every error a user can cause ends as one line (key, value, why, fix) and a non-zero exit: Hydra's
composition errors are rewritten here, plan errors are printed by the runner."""
from __future__ import annotations

import difflib
import re
import sys
from dataclasses import fields, is_dataclass

EXIT_USAGE = 2


def emit(lines: list[str], code: int = EXIT_USAGE) -> None:
    """Print the lines (never a secret's value: vrun.core.writer.mask) and exit."""
    from vrun.core.writer import mask

    for line in lines:
        print(mask(line), file=sys.stderr)
    sys.exit(code)


def one_line_hydra_errors() -> None:
    """Replace Hydra's error reporter (hydra-core is pinned; tests/test_errors.py covers it)."""
    import hydra._internal.utils as hu

    def run_and_report(func):
        try:
            return func()
        except SystemExit:
            raise
        except Exception as ex:  # noqa: BLE001 - every user error must end in one line
            import os

            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            emit([describe(ex)])

    hu.run_and_report = run_and_report


def mode_from_run_yaml() -> None:
    """Hydra's CLI composes the whole config once only to read hydra.mode, then composes it again to run. conf/
    run.yaml sets hydra.mode=MULTIRUN (every run passes through the sweeper), so that first composition is skipped.
    hydra.mode typed on the command line: RUN is refused here, before anything is written, with or without -m
    (Hydra would otherwise run the task itself, or warn and sweep anyway); MULTIRUN is what run.yaml says; any other
    value goes to Hydra's own reading. A config that does not compose fails in the run's own composition with the
    same one-line error. The SweeperOnly callback still refuses a RUN that reaches Hydra another way."""
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    composed_mode = Hydra.get_mode

    def get_mode(self, config_name, overrides):
        typed = [o.split("=", 1)[1] if "=" in o else "" for o in overrides
                 if o.lstrip("+~").split("=", 1)[0] == "hydra.mode"]
        if not typed or typed[-1].strip() == RunMode.MULTIRUN.name:
            return RunMode.MULTIRUN
        if typed[-1].strip() == RunMode.RUN.name:
            emit([sweeper_only_problem(typed[-1].strip())])
        return composed_mode(self, config_name=config_name, overrides=overrides)

    Hydra.get_mode = get_mode


def describe(ex: BaseException) -> str:
    from vrun.core.problems import PlanError

    if isinstance(ex, PlanError):
        return str(ex)
    msg = str(ex)
    cause = ex.__cause__ or ex.__context__
    m = re.search(r"Sweeping over Hydra's configuration is not supported : '([^=']+)=(.*)'$", msg)
    if m:
        from vrun.config.overrides import shown_override

        given = shown_override(f"{m.group(1)}={m.group(2)}")
        if given.endswith("=<hidden>"):
            return (f"error: {given}: a comma makes the value a list to sweep, and Hydra sweeps no value of its own "
                    f"config; fix: quote the value: '{m.group(1)}=\"...\"'")
        return (f"error: {m.group(1)}={m.group(2)}: a comma makes the value a list to sweep, and Hydra sweeps no "
                f"value of its own config; fix: quote the value: '{m.group(1)}=\"{m.group(2)}\"'")
    m = re.search(r"Error parsing override '([^=']+)=([^']*)'.*empty choice", msg, re.S)
    if m:
        return (f"error: {m.group(1)}={m.group(2)}: a choice of no value (a sweep with no point); fix: "
                f"{m.group(1)}=choice(<a>,<b>) with at least one value, or {m.group(1)}=<one value>")
    m = re.search(r"Could not find '([^']+)'", msg)
    if m:
        group, _, option = m.group(1).rpartition("/")
        avail = re.findall(r"^\t(\S+)$", msg, re.M)
        near = difflib.get_close_matches(option, avail, n=1, cutoff=0.3)
        best = f"{group}={near[0]}" if near else f"{group}=<option>"
        return (f"error: {group}={option}: no such option in conf/{group}; fix: {best} "
                f"(options: {', '.join(avail)})")
    m = re.search(r"Could not override '([^']+)'", msg)
    key = m.group(1) if m else None
    if key is None and cause is not None:
        key = getattr(cause, "full_key", None)
    if key is None:
        key = getattr(ex, "full_key", None)
    if key and ("not in struct" in msg or "not in struct" in str(cause) or "Key '" in str(cause or msg)):
        value = _value_of(key)
        head = key.split(".")[0]
        if key.startswith("hydra.launcher."):
            return _launcher_key(key, value)
        if head in VERL_SECTIONS:
            return (f"error: {key}={value}: no such key in the run config ({head}.* is verl's); fix: "
                    f"verl.{key}={value}")
        if _is_map(key.rsplit(".", 1)[0]):
            return (f"error: {key}={value}: a new entry of the map {key.rsplit('.', 1)[0]}; fix: +{key}={value}")
        return (f"error: {key}={value}: no such key in the run config; fix: {_near_keys(key)}")
    keyed = cause if getattr(cause, "full_key", None) else ex if getattr(ex, "full_key", None) else None
    if keyed is not None and keyed is ex and re.search(r"Environment variable '|Interpolation key '", msg):
        keyed = None  # read by the rules below, which name the variable or the key to interpolate
    if keyed is not None:  # OmegaConf's own error, with the key it was about
        first = str(keyed).splitlines()[0]
        key = keyed.full_key
        if key == "_dummy_":  # a group's choice interpolated: Hydra resolves it on a stand-in key
            inner = re.search(r"'(?:\$\{)?([^'}]+)\}?' not found", first)
            key = _key_with("${" + inner.group(1)) if inner else "?"
            return (f"error: {key}={_value_of(key)}: a group's choice interpolates ${{{inner.group(1) if inner else '?'}}}"
                    f", which does not exist when the defaults are chosen; fix: {key}=<option> (no interpolation)")
        if any(x in first for x in ("mismatched input", "no viable alternative", "extraneous input",
                                    "token recognition error")):
            return (f"error: {key}={_value_of(key)}: the interpolation does not parse (OmegaConf's grammar: "
                    f"{first[:100]}); fix: {key}=<the interpolation with its argument quoted, ${{resolver:'...'}}, "
                    "and its braces balanced>")
        nested = _nested_under(key) if "Cannot convert 'dict'" in first else None
        if nested:  # +a.b.c=1 where a.b is a plain value (a map of strings, a number): c has nowhere to go
            from vrun.config.overrides import shown_override

            name, value = nested.lstrip("+~").split("=", 1)
            parent = key.rsplit(".", 1)[0]
            fix = (f"+{parent}.{name[len(parent) + 1:].replace('.', '_')}={value} (one key per entry of {parent})"
                   if "." in key and _is_map(parent) else f"{key}=<one value>")
            return f"error: {shown_override(nested)}: {key} holds one value, not keys under it; fix: {fix}"
        choices = re.search(r"expected one of \[([^\]]*)\]", first)  # a closed choice (an enum in vrun.config.schema)
        fix = " or ".join(f"{key}={c.strip()}" for c in choices.group(1).split(",")) if choices else \
            f"{key}=<{_wanted(first)}>"
        return f"error: {key}={_value_of(key)}: {first}; fix: {fix}"
    first = " ".join(line.strip() for line in msg.splitlines() if line.strip())
    m = re.search(r"Ambiguous value for argument '([^=']+)=([^']*)'", msg)
    if m:
        from vrun.config.overrides import shown_override

        return (f"error: {shown_override(f'{m.group(1)}={m.group(2)}')}: a comma in a value is a list or a sweep to "
                f"Hydra; fix: quote it ({m.group(1)}='a,b'), write a list ({m.group(1)}=[a,b]) or sweep with -m")
    m = re.search(r"Error parsing override '([^']*)'\s*missing EQUAL", msg)
    if m:
        return (f"error: {m.group(1)}: an override without '=' (Hydra's grammar); fix: {m.group(1)}=<value>, or "
                f"~{m.group(1)} to delete it")
    if any(x in msg for x in ("no viable alternative", "mismatched input", "extraneous input", "LexerNoViableAlt",
                              "token recognition error")):
        hidden = _unparsed(secret_only=True)
        if hidden:
            return (f"error: {hidden}: the override does not parse; fix: quote the value (key='...') or balance its "
                    "brackets (Hydra's override grammar)")
        bad = _unparsed()
        hydra_says = re.sub(r"^(LexerNoViableAltException: |Error parsing override '[^']*'\s*)", "",
                            first.split(' See https')[0].replace(bad or "\0", ""))
        if bad and "=" in bad:
            key, value = bad.split("=", 1)
            group, _, name = key.lstrip("+~").rpartition(".")
            if group in ("env", "model.env") and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                legal = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "MY_VAR"
                legal = f"_{legal}" if legal[0].isdigit() else legal
                from vrun.config.overrides import shown_override as shown

                return (f"error: {shown(bad)}: {name} is not a variable name a shell can export (letters, "
                        f"digits and _, not starting with a digit); fix: +{group}.{legal}=...")
            from vrun.core.hydra_text import render

            quoted = render(value)
            hydra_says = hydra_says.strip(" :^\n") or "a character it cannot read unquoted"
            return (f"error: {bad}: the override does not parse (Hydra's grammar: {hydra_says[:120]}); "
                    f"fix: {key}={quoted} (the value quoted), or balance its brackets")
        return (f"error: {bad or first.split(' See https')[0]}: the override does not parse; fix: key=value, "
                "+key=value or ~key, the value quoted (key='...') where it holds spaces or brackets")
    if "Could not detect" in first and "srun" in first:
        return ("error: cluster=slurm: no SLURM client on this machine (sbatch/srun not found); fix: submit from a "
                "SLURM login node (where sinfo works), or mode=plan to write each point's sbatch.sh without submitting")
    m = re.search(r"Environment variable '([^']+)' not found(?:.*?full_key: (\S+))?", first)
    if m:
        where = m.group(2) or _key_with(f"oc.env:{m.group(1)}")
        return (f"error: {where}: interpolates the unset variable {m.group(1)}; fix: export {m.group(1)}, or "
                f"give a default: ${{oc.env:{m.group(1)},<default>}}")
    m = re.search(r"Interpolation key '([^']+)' not found(?:.*?full_key: (\S+))?", first)
    if m:
        where = m.group(2) if m.group(2) and m.group(2) != "_dummy_" else _key_with(m.group(1))
        return (f"error: {where}: interpolates ${{{m.group(1)}}}, which does not exist; fix: "
                "interpolate an existing key of the run config (e.g. ${model.name})")
    return _hydra_edit_error(first) or _fallback(first)


# OmegaConf's type names in its conversion errors → what the fix asks for
_TYPE_WANTED = {"Integer": "an integer", "int": "an integer", "Float": "a number", "float": "a number",
                "Boolean": "true or false", "bool": "true or false", "String": "a string", "str": "a string"}


def _wanted(message: str) -> str:
    m = re.search(r"(?:converted to|field of type|is not a valid) '?(Integer|Float|Boolean|String|int|float|bool|str)'?",
                  message)
    return _TYPE_WANTED[m.group(1)] if m else "a value of its type (docs/configuration.md 'Config groups')"


def _nested_under(key: str):
    """The command-line override that put keys under `key` (`+model.env.A.B=1` for key model.env.A), or None."""
    for arg in sys.argv[1:]:
        name = arg.lstrip("+~").split("=", 1)[0]
        if "=" in arg and name.startswith(key + "."):
            return arg
    return None


def _hydra_edit_error(first: str):
    """Hydra's errors about what an override does to the config (delete, append, override a default, load an
    option, an interpolation that resolves to the wrong type): one line naming the override and the change."""
    m = re.search(r"Could not delete from config\. '([^']+)' does not exist", first)
    if m:
        return f"error: ~{m.group(1)}: no such key to delete; fix: drop ~{m.group(1)} (nothing holds it)"
    m = re.search(r"Could not append to config\. An item is already at '([^']+)'", first)
    if m:
        key = m.group(1)
        given = next((a for a in sys.argv[1:] if a.startswith("+") and a.lstrip("+").split("=", 1)[0] == key), None)
        value = given.split("=", 1)[1] if given and "=" in given else "<value>"
        return f"error: +{key}={_shown(value, key)}: {key} is already in the config; fix: {key}={_shown(value, key)} (no +)"
    m = re.search(r"Could not override '([^']+)'\. Did you mean to override ([^?]+)\?", first)
    if m:
        given, group = m.group(1), m.group(2).strip()
        value = _value_of(given)
        return (f"error: {given}={value}: the defaults list has no {given} to override; fix: {group}={value}, or "
                f"+{given}={value} to add it")
    m = re.search(r"Could not load '([^']+)/([^'/]+)'", first)
    if m:
        group = m.group(1)
        option = _value_of(group) if _value_of(group) != "?" else m.group(2)
        from pathlib import Path

        conf = Path(__file__).resolve().parents[2] / "conf" / group
        options = sorted(p.stem for p in conf.glob("*.yaml"))  # none where the group is not a directory
        return (f"error: {group}={option}: no such option in conf/{group} (a group takes one option per run); fix: "
                f"{group}=<option>" + (f" (options: {', '.join(options)}), or sweep with -m {group}=a,b" if options
                                       else ""))
    m = re.search(r"While dereferencing interpolation '(.*?)': (.*?) full_key: (\S+)", first)
    if m:
        key = m.group(3)
        return (f"error: {key}={_shown(m.group(1), key)}: the interpolation resolves to a value {key} cannot hold "
                f"({m.group(2).strip()[:160]}); fix: {key}=<{_wanted(first)}>")
    return None


def _shown(value: str, key: str) -> str:
    from vrun.core.problems import SECRETISH, names_secret

    return "<hidden>" if SECRETISH.search(key) or names_secret(key) else value


def _fallback(first: str) -> str:
    """An error no rule above reads: the command-line override it quotes, named, with the change to make."""
    for arg in sys.argv[1:]:
        key = arg.lstrip("+~").split("=", 1)[0]
        if "=" in arg and key and (f"'{key}'" in first or f"'{arg}'" in first):
            from vrun.config.overrides import shown_override

            return (f"error: {shown_override(arg)}: {first}; fix: correct {key} as Hydra says above, or drop "
                    f"{arg.split('=', 1)[0]}")
    return (f"error: hydra: {first}; fix: correct the override it quotes (Hydra's override grammar: key=value, "
            "+key=value to add a key, ~key to delete one)")


# verl's top-level sections: a key under one of them belongs under verl.
VERL_SECTIONS = ("trainer", "data", "actor_rollout_ref", "algorithm", "reward", "reward_model", "critic",
                 "ray_kwargs", "custom_reward_function", "checkpoint", "global_profiler", "transfer_queue")


def _is_map(path: str) -> bool:
    """Whether the run config's schema has a map (Dict field) at this dotted path."""
    import typing

    from vrun.config.schema import RunConfig

    node: typing.Any = RunConfig
    for part in path.split("."):
        if not is_dataclass(node):
            return False
        hints = typing.get_type_hints(node)
        if part not in hints:
            return False
        node = hints[part]
    return typing.get_origin(node) in (dict, typing.Dict)


def _value_of(key: str) -> str:
    from vrun.config.overrides import shown_override
    from vrun.core.problems import SECRETISH, names_secret

    if SECRETISH.search(key) or names_secret(key):
        return "<hidden>"
    from vrun.core.problems import show as shown

    for arg in sys.argv[1:]:
        k, _, v = arg.lstrip("+~").partition("=")
        if k == key:
            return "<hidden>" if shown_override(arg) != arg else shown(v)
    return "?"


def _unparsed(secret_only: bool = False):
    """The first command-line override Hydra's grammar refuses, as typed, or None. secret_only: the first that gives
    a secret key a value, as `key=<hidden>` (Hydra's message would quote the value, or a piece of it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from vrun.config.overrides import shown_override

    parser = OverridesParser.create()
    for arg in sys.argv[1:]:
        if arg.startswith("-") or (secret_only and ("=" not in arg or shown_override(arg) == arg)):
            continue
        try:
            parser.parse_override(arg)
        except Exception:  # noqa: BLE001 - Hydra's grammar refused it
            return shown_override(arg) if secret_only else arg
    return None


def _key_with(text: str) -> str:
    """The command-line key whose value holds `text` (an interpolation Hydra's error does not place)."""
    for arg in sys.argv[1:]:
        k, _, v = arg.lstrip("+~").partition("=")
        if text in v:
            return k
    return "?"


def _near_keys(key: str) -> str:
    from vrun.config.schema import RunConfig

    node, known = RunConfig(), []
    parts = key.split(".")
    for part in parts[:-1]:
        child = getattr(node, part, None) if is_dataclass(node) else None
        if not is_dataclass(child):
            break
        node, known = child, known + [part]
    options = [x.name for x in fields(node)]
    bad = parts[len(known)]
    near = difflib.get_close_matches(bad, options, n=2, cutoff=0.5)
    prefix = "".join(p + "." for p in known)
    if near:
        return " or ".join(prefix + n for n in near)
    return (f"one of {prefix}{{{', '.join(options)}}}; verl keys go under verl. "
            "(e.g. verl.trainer.save_freq=10)")


def _launcher_key(key: str, value: str) -> str:
    """A hydra.launcher key Hydra's submitit launcher lacks: the sbatch values are the cluster group's knobs."""
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

    parts = key.split(".")
    if len(parts) > 3 and parts[2] == "additional_parameters":
        return f"error: {key}={value}: a new sbatch option; fix: +cluster.additional_parameters.{parts[3]}={value}"
    options = [f.name for f in fields(SlurmQueueConf) if not f.name.startswith("_")]
    near = difflib.get_close_matches(parts[2], options, n=1, cutoff=0.5)
    return (f"error: {key}={value}: no such key in Hydra's submitit launcher; fix: " +
            (f"hydra.launcher.{near[0]}={value}" if near else "a cluster.* knob (vrun/config/schema.py: Cluster)"))


def sweeper_only_problem(mode) -> str:
    from vrun.core.problems import Problem

    return Problem("hydra.mode", mode, "every run is planned by the project's sweeper and started by its launchers "
                   "(a run is a sweep of one point)", "drop hydra.mode (conf/run.yaml sets MULTIRUN)").line()


def _callback_base():
    from hydra.experimental.callback import Callback

    return Callback


class SweeperOnly(_callback_base()):
    """A Hydra callback (conf/run.yaml): a run Hydra would start itself (hydra.mode=RUN) is refused before Hydra
    creates its run dir. Holds no state."""

    def on_run_start(self, config, **kwargs) -> None:
        emit([sweeper_only_problem("RUN")])

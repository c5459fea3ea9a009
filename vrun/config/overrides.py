"""What the command line types, as a line may quote it: an override that gives a secret key a value (the key by
vrun.core.problems.names_secret: a variable's name under `+env.*` or `hydra.job.env_set.*` by the writer's broad
rule, a secret's name elsewhere), or a map holding one (`+env={HF_TOKEN:...}`), is a secret whether it parses or
not and whatever sweep holds it. `typed_secrets`: its values, which the entry points register with the writer
(vrun.core.writer.hide: masked in every line and file); `shown_override`: the override as `key=<hidden>`."""
from __future__ import annotations

import re
from typing import Any, Iterator, Optional

from vrun.core.problems import names_secret


OVERRIDE_KEY = re.compile(r"^(?:\+\+|\+|~)?([^=@]+?)(?:@[^=]*)?=(.*)$", re.S)
NAME_BEFORE_COLON = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*)\s*:")
PIECES = re.compile(r"[^,\[\]{}()'\"\s:]+")


def _override_secret(arg: str) -> Optional[list]:
    """The values `arg` (an override as typed) gives a secret key, or None when it gives none. A value that does
    not parse counts whole, with its pieces."""
    m = OVERRIDE_KEY.match(str(arg))
    if not m:
        return None
    key, value = m.group(1).strip(), m.group(2)
    if not names_secret(key):
        # a map assigned whole: a secret name among its keys
        inner = [n for n in NAME_BEFORE_COLON.findall(value) if names_secret(f"{key}.{n}")]
        if not inner or "{" not in value:
            return None
    out = [value]
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        o = OverridesParser.create().parse_override(f"{key}={value}")
        out += [str(x) for x in _parsed_leaves(o.value())]
    except Exception:  # noqa: BLE001 - a value that does not parse: every piece of it is the secret's
        out += PIECES.findall(value)
    return out


def _parsed_leaves(v: Any) -> Iterator[Any]:
    from hydra.core.override_parser.types import ChoiceSweep, Glob, IntervalSweep, RangeSweep

    if isinstance(v, ChoiceSweep):
        for x in v.list:
            yield from _parsed_leaves(x)
    elif isinstance(v, (RangeSweep, IntervalSweep, Glob)):
        return
    elif isinstance(v, dict):
        for x in v.values():
            yield from _parsed_leaves(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _parsed_leaves(x)
    elif v is not None:
        yield v


def typed_secrets(args) -> list:
    """Every value the command line gives a secret key (see the module's docstring)."""
    return [v for a in args for v in (_override_secret(a) or [])]


def shown_override(arg: str) -> str:
    """The override as a line may quote it: `key=<hidden>` where it gives a secret key a value."""
    if _override_secret(arg) is None:
        return str(arg)
    return str(arg).split("=", 1)[0] + "=<hidden>"


# the launcher each cluster group selects (conf/cluster/*.yaml): a Hydra user who picks the launcher gets its group
CLUSTER_OF_LAUNCHER = {"submitit_slurm": "slurm", "vrun_ray": "ray", "vrun_kuberay": "kuberay", "vrun_local": "local"}


def with_cluster_of_launcher(args: list) -> list:
    """The command line with `cluster=<group>` added when it selects a launcher (`hydra/launcher=submitit_slurm`)
    and no cluster group: the cluster group carries the launcher's knobs (nodes, GPUs and time come from it), so
    choosing the launcher is choosing the cluster. A sweep over launchers, or a cluster given too, is left as typed
    (the sweeper says what is wrong with a mismatch)."""
    launcher, cluster_given = None, False
    for a in args:
        m = OVERRIDE_KEY.match(str(a))
        if not m:
            continue
        key = m.group(1).strip()
        if key == "hydra/launcher":
            launcher = m.group(2).strip()
        elif key == "cluster":
            cluster_given = True
    if cluster_given or launcher not in CLUSTER_OF_LAUNCHER:
        return list(args)
    return list(args) + [f"cluster={CLUSTER_OF_LAUNCHER[launcher]}"]

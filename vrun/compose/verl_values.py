"""Closed choices the installed verl enforces at job start (or on its first step), read from its source text —
never by importing verl (seconds), and once per process: advantage estimators (the AdvantageEstimator enum and
every register_adv_est name), loss aggregation modes (agg_loss's branches), logger backends (Tracking's
supported_backend), rollout (name, mode) pairs (_ROLLOUT_REGISTRY). A choice whose source is not found is not
checked (a verl laid out differently plans as before)."""
from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path
from typing import Any, Optional

from vrun.core.dotted import MISSING, get
from vrun.core.problems import Problem
from vrun.entrypoints import ACTOR, ROLLOUT


def verl_root() -> Optional[Path]:
    spec = importlib.util.find_spec("verl")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _read(root: Path, rel: str) -> str:
    try:
        return (root / rel).read_text()
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def choices() -> dict[str, Any]:
    root = verl_root()
    if root is None:
        return {}
    out: dict[str, Any] = {}
    algos = _read(root, "trainer/ppo/core_algos.py")
    enum = re.search(r"class AdvantageEstimator\(.*?\):(.*?)\n(?=\S)", algos, re.S)
    if enum:
        names = set(re.findall(r'^\s+[A-Z_0-9]+\s*=\s*"([^"]+)"', enum.group(1), re.M))
        names |= set(re.findall(r'register_adv_est\(\s*"([^"]+)"', algos))
        out["adv_estimator"] = names
    modes = set(re.findall(r'loss_agg_mode\s*==\s*"([^"]+)"', algos))
    for group in re.findall(r"loss_agg_mode\s+in\s*[\[(]([^\])]*)[\])]", algos):
        modes |= set(re.findall(r'"([^"]+)"', group))
    if modes:
        out["loss_agg_mode"] = modes
    tracking = _read(root, "utils/tracking.py")
    m = re.search(r"supported_backend\s*=\s*\[(.*?)\]", tracking, re.S)
    if m:
        out["logger"] = set(re.findall(r'"([^"]+)"', m.group(1)))
    base = _read(root, "workers/rollout/base.py")
    m = re.search(r"_ROLLOUT_REGISTRY\s*=\s*\{(.*?)\n\}", base, re.S)
    if m:
        out["rollout"] = set(re.findall(r'\(\s*"([^"]+)"\s*,\s*"([^"]+)"\s*\)', m.group(1)))
    return out


def problems(verl: dict) -> list[Problem]:
    """The resolved tree's closed choices against the installed verl's, each where the tree has its key (an
    entrypoint's tree without a key has nothing to check there: SFT's has no algorithm, actor or rollout)."""
    c = choices()
    out = []

    def one_of(key: str, value: Any, allowed: set, what: str) -> None:
        if value is MISSING or value is None or not allowed:
            return
        if not isinstance(value, str) or value not in allowed:
            out.append(Problem(f"verl.{key}", value, f"not one of the installed verl's {what}",
                               f"one of {sorted(allowed)}"))

    logger = get(verl, "trainer.logger", MISSING)
    if "logger" in c and logger is not MISSING and logger is not None:
        for name in ([logger] if isinstance(logger, str) else logger if isinstance(logger, list) else [logger]):
            one_of("trainer.logger", name, c["logger"], "logger backends (utils/tracking.py)")
    one_of("algorithm.adv_estimator", get(verl, "algorithm.adv_estimator", MISSING), c.get("adv_estimator", set()),
           "advantage estimators (trainer/ppo/core_algos.py)")
    one_of(f"{ACTOR}.loss_agg_mode", get(verl, f"{ACTOR}.loss_agg_mode", MISSING), c.get("loss_agg_mode", set()),
           "loss aggregation modes (core_algos.agg_loss)")
    pairs = c.get("rollout")
    name, mode = get(verl, f"{ROLLOUT}.name", MISSING), get(verl, f"{ROLLOUT}.mode", MISSING)
    if pairs and name is not MISSING and not (isinstance(name, str) and isinstance(mode, str)
                                              and (name, mode) in pairs):
        names = {n for n, _ in pairs}
        key, value = (f"{ROLLOUT}.name", name) if not (isinstance(name, str) and name in names) else \
            (f"{ROLLOUT}.mode", mode)
        out.append(Problem(f"verl.{key}", value, "the installed verl has no such rollout (workers/rollout/base.py)",
                           " or ".join(f"verl.{ROLLOUT}.name={n} verl.{ROLLOUT}.mode={m}" for n, m in sorted(pairs))))
    strategy = get(verl, f"{ACTOR}.strategy", MISSING)
    if strategy is not MISSING and not (isinstance(strategy, str) and strategy == "mlite"):
        out.append(Problem(f"verl.{ACTOR}.strategy", strategy, "the actor runs the Megatron Lite engine "
                           "(actor@actor_rollout_ref.actor=mlite_actor); another strategy builds other workers",
                           f"drop verl.{ACTOR}.strategy (it is mlite)"))
    return out

"""Values as verl reads them: the ranges verl (or its first step) enforces, one source for the lengths, the run
config's own ranges, the model group's facts as counts (vrun.checks.model_facts), and types — a boolean given as a
string, NaN or inf, a negative where verl's default is positive — refused so the plan and verl never read a value
differently.

Entry points: `run_config(config)` on the typed run config; `verl(resolved, entrypoint, base)` on the resolved
verl tree (entrypoint: its record, vrun.entrypoints; base: verl's own composed tree, for the types of its
defaults). The cluster's addresses and ports are read in vrun.checks.addresses.
"""
from __future__ import annotations

import math
import re
from typing import Any, Optional

from vrun.checks.addresses import (  # noqa: F401 - the cluster's addresses and ports; importable from here
    HOST_PORT, MAX_PORT, RAY_CLIENT_PORT, RAY_DASHBOARD_PORT, RAY_GCS_PORT, address_problems, host_port,
    port_problems)
from vrun.checks.model_facts import (  # noqa: F401 - the model group's facts; importable from here
    ARCH_POSITIVE, MAX_COUNT, MAX_LAYERS, arch_problems, model_problems)
from vrun.checks.paths import short as _short
from vrun.core.problems import Problem
from vrun.estimate import timelimit


def run_config(config) -> list:
    """The typed run config's ranges and conflicts, and the model group's facts."""
    return run_problems(config) + model_problems(config.model)


def verl(resolved: dict, entrypoint, base: Optional[dict] = None) -> list:
    """The resolved verl tree: types as verl reads them (against base, verl's defaults), ranges, the lengths the
    entrypoint's record links (vrun.entrypoints.Entrypoint.linked_lengths)."""
    out = type_problems(resolved, base) if base is not None else []
    bad = {p.key for p in out}
    out += [p for p in range_problems(resolved, entrypoint) + length_problems(resolved, entrypoint.linked_lengths)
            if p.key not in bad]
    return out


def type_problems(resolved: Any, base: Any, path: str = "") -> list:
    """Leaves whose type verl reads differently from what the plan would: a string where verl's default is a
    boolean or a number (verl's dataclasses read 'false', 'no', 'off' as False; the plan would read them as true),
    NaN or inf anywhere, a negative where verl's default is positive."""
    out: list = []
    _types(resolved, base, path, out)
    return out


def _types(v: Any, b: Any, path: str, out: list) -> None:
    if isinstance(v, dict):
        for k, x in v.items():
            _types(x, b.get(k) if isinstance(b, dict) else None, f"{path}.{k}" if path else str(k), out)
        return
    if isinstance(v, list):
        for i, x in enumerate(v):
            _types(x, None, f"{path}[{i}]", out)
        return
    key = f"verl.{path}"
    if isinstance(v, float) and not math.isfinite(v):
        out.append(Problem(key, v, "NaN or infinity: verl would train on it (or divide by it) without a word",
                           f"{key}=<a finite number>"))
    elif isinstance(b, bool) and isinstance(v, str):
        word = v.strip().lower()
        meant = "true" if word in ("true", "yes", "on", "1", "y") else "false" if word in (
            "false", "no", "off", "0", "n", "") else None
        # the value shown quoted, as the string it is: `key='true'` with its fix `key=true` unquoted
        out.append(Problem(key, _short(repr(v)), "a boolean given as a string: verl's config classes and the plan "
                           "would read it differently", f"{key}={meant}" if meant else f"{key}=true or {key}=false"))
    elif isinstance(b, (int, float)) and not isinstance(b, bool) and isinstance(v, str) and not v.startswith("${"):
        out.append(Problem(key, _short(repr(v)), f"a number given as a string (verl's default is {b!r})",
                           f"{key}=<a number, unquoted>"))
    elif isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 and \
            isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0 and not path.endswith("seed"):
        out.append(Problem(key, v, f"negative where verl's default is positive ({b!r})", f"{key}=<a positive number>"))


# verl keys with a range verl (or its first step) enforces in every tree; each entrypoint's record lists its own
# (Entrypoint.positive_ints, .fractions), and its optimizer block's offload_fraction is a fraction too
NON_NEGATIVE_INT = ("trainer.total_epochs", "trainer.save_freq", "trainer.test_freq")
# read by both entrypoints when set (null: verl counts the steps from the data and epochs)
POSITIVE_INT = ("trainer.total_training_steps",)
# RAY_AUTH_MODE's values (Ray 2.60: ray._private.authentication, AuthenticationMode)
RAY_AUTH_MODES = ("disabled", "token")
# a Linux interface name: IFNAMSIZ 16 with its NUL, no / or space; never an option to `ip`
IFACE = re.compile(r"[A-Za-z0-9_.:@][A-Za-z0-9_.:@-]{0,14}")


def range_problems(verl: dict, entrypoint) -> list[Problem]:
    """Values of the resolved verl tree out of the range verl accepts (booleans are not integers): the shared keys
    and those the entrypoint's record lists."""
    from vrun.core.dotted import MISSING, get

    out = []
    positive = tuple(entrypoint.positive_ints) + POSITIVE_INT
    for key in positive + NON_NEGATIVE_INT:
        v = get(verl, key, MISSING)
        if v is MISSING or v is None:
            continue
        low = 1 if key in positive else (-1 if key.endswith("_freq") else 0)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= 2 ** 31:
            what = "a positive integer" if low == 1 else ("an integer ≥ -1 (-1: never)" if low == -1
                                                          else "a non-negative integer")
            what += " up to 2^31"
            out.append(Problem(f"verl.{key}", v, f"must be {what}", f"verl.{key}=<{what}>"))
    for key in (*entrypoint.fractions, f"{entrypoint.optim}.override_optimizer_config.offload_fraction"):
        v = get(verl, key, MISSING)
        if v is MISSING or v is None:
            continue
        zero_ok = key.endswith("offload_fraction")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not ((0 <= v) if zero_ok else (0 < v)) or v > 1:
            out.append(Problem(f"verl.{key}", v, f"must be a fraction in {'[0' if zero_ok else '(0'}, 1]",
                               f"verl.{key}=0.5"))
    return out


def length_problems(verl: dict, linked: dict) -> list[Problem]:
    """Lengths with one source (linked: data key → the keys that repeat it; PPO: the rollout's lengths and the DAPO
    reward's max_resp_len) equal the data's."""
    from vrun.core.dotted import MISSING, get

    out = []
    for src, dest in ((s, d) for s, dests in linked.items() for d in dests):
        a, b = get(verl, src, MISSING), get(verl, dest, MISSING)
        if a is MISSING or b is MISSING or a is None or b is None or a == b:
            continue
        out.append(Problem(f"verl.{dest}", b, f"differs from {src}={a}: the plan's checks and the table would "
                           "describe lengths verl does not use", f"set verl.{src} only (it sets {dest})"))
    return out


# the longest time limit taken: a year. SLURM keeps a limit as 32-bit minutes, Kubernetes activeDeadlineSeconds as
# 64-bit seconds, and the deadline a node gives verl is read only up to year 2200 (vrun.launch.deadline): each would
# take more, but a limit past a year is a typo whose GPU-hours and cost lines are meaningless
MAX_TIME_MIN = 365 * 24 * 60
# the largest count any reader of the integer knobs takes (sbatch's and Ray's are 32-bit signed)
MAX_INT = 2 ** 31 - 1
RANGE_WHY = {"cluster.time_min": " (minutes: at most a year)"}


def INT_KNOBS(c) -> tuple:
    """(key, value, lowest, highest) of each integer knob of the cluster group."""
    return (("cluster.time_min", c.time_min, 1, MAX_TIME_MIN),
            ("cluster.ray.join_timeout_s", c.ray.join_timeout_s, 1, MAX_INT),
            ("cluster.max_requeues", c.max_requeues, 0, MAX_INT),
            ("cluster.no_progress_attempts", c.no_progress_attempts, 0, MAX_INT),
            ("cluster.cpus_per_task", c.cpus_per_task, 1, MAX_INT), ("cluster.mem_gb", c.mem_gb, 1, MAX_INT),
            ("cluster.ray.num_cpus", c.ray.num_cpus, 0, MAX_INT), ("cluster.ray.num_gpus", c.ray.num_gpus, 1, MAX_INT),
            ("cluster.signal_delay_s", c.signal_delay_s, 1, MAX_INT))


def run_problems(config) -> list[Problem]:
    """The run config's own ranges and conflicts (config: vrun.config.schema.RunConfig)."""
    c = config.cluster
    out = []
    slurm = str(c.name) == "slurm"
    t = c.ray.dashboard_timeout_s
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 600:
        out.append(Problem("cluster.ray.dashboard_timeout_s", t, "must be seconds in (0, 600]: a lost dashboard "
                           "is reported after it", "cluster.ray.dashboard_timeout_s=15"))
    out += address_problems(c, slurm, str(config.algo.entrypoint) == "sft")
    if not isinstance(c.ray.auth_mode, str) or c.ray.auth_mode.lower() not in RAY_AUTH_MODES:
        out.append(Problem("cluster.ray.auth_mode", _short(c.ray.auth_mode), f"RAY_AUTH_MODE is one of "
                           f"{', '.join(RAY_AUTH_MODES)} (Ray 2.60's AuthenticationMode); Ray reads anything else as "
                           "neither", "cluster.ray.auth_mode=disabled (or token, with the token on every node)"))
    iface = c.ray.interface
    if iface is not None and not (isinstance(iface, str) and IFACE.fullmatch(iface)):
        out.append(Problem("cluster.ray.interface", _short(iface), "a network interface name (at most 15 "
                           "characters: letters, digits and . _ : @ -, not starting with -), as `ip addr show dev` "
                           "on each node takes it", "cluster.ray.interface=ib0 (ip -o link lists a node's), or null "
                           "(the hostname's address)"))
    for key, v, low, high in INT_KNOBS(c):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            why = "0 means no time limit to sbatch (and no GPU-hours to confirm)" if key == "cluster.time_min" and \
                v == 0 else ("Ray would offer verl's workers no GPU (null: the mesh's gpus_per_node)"
                             if key == "cluster.ray.num_gpus" and v == 0 else f"must be an integer in "
                             f"[{low}, {high:,}]{RANGE_WHY.get(key, '')}")
            out.append(Problem(key, v, why, f"{key}=<integer in [{low}, {high:,}]>"))
    if all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (c.time_min, c.ray.join_timeout_s)) \
            and slurm and c.ray.join_timeout_s >= c.time_min * 60:
        out.append(Problem("cluster.ray.join_timeout_s", c.ray.join_timeout_s, f"the head would wait for the nodes "
                           f"past the job's own {c.time_min}-minute time limit (the job ends first, saying nothing)",
                           f"cluster.ray.join_timeout_s=<under {c.time_min * 60}> (300 by default)"))
    if all(isinstance(x, int) and x > 0 for x in (c.time_min, c.signal_delay_s)) and c.signal_delay_s >= c.time_min * 60:
        out.append(Problem("cluster.signal_delay_s", c.signal_delay_s, f"the requeue signal would come at the start "
                           f"of a {c.time_min}-minute job (every attempt requeues at once)",
                           f"cluster.signal_delay_s=<under {c.time_min * 60}>"))
    elif all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (c.time_min, c.signal_delay_s)) and \
            slurm and c.signal_delay_s > timelimit.max_signal_delay_s(c.time_min):
        most = timelimit.max_signal_delay_s(c.time_min)
        out.append(Problem("cluster.signal_delay_s", c.signal_delay_s, f"submitit reads a signal more than {most + 60} s "
                           f"before the end of a {c.time_min}-minute job as a preemption, not the time limit: every "
                           "time limit would requeue the job without counting against cluster.max_requeues, "
                           "for ever", f"cluster.signal_delay_s={min(most, 120)}"))
    out += watch_problems(config.run, slurm or str(c.name) == "ray", str(c.name))
    out += port_problems("cluster.master_port", c.master_port)
    out += node_local_problems(c.node_local_paths)
    if c.confirm_gpu_hours is not None and not c.confirm_gpu_hours > 0:
        out.append(Problem("cluster.confirm_gpu_hours", c.confirm_gpu_hours, "must be positive",
                           "cluster.confirm_gpu_hours=1000"))
    from vrun import entrypoints
    from vrun.config.schema import EntrypointName

    for block in (config.recipe or {}):  # one block per entrypoint, named after it
        if block not in {e.value for e in EntrypointName}:
            out.append(Problem(f"recipe.{block}", "...", "no such recipe block: recipe.ppo holds main_ppo keys, "
                               "recipe.sft sft_trainer keys", "recipe.ppo.<key> or recipe.sft.<key>"))
        # another entrypoint's block typed on the command line: Entrypoint.typed_problems (the group files fill
        # both blocks for every algorithm, so only what was typed is a setting)
    out += entrypoints.of(config).run_problems(config)
    from vrun.checks import unread

    said = {p.key for p in out}
    out += [p for p in unread.problems(config) if p.key not in said]
    return out


def node_local_problems(paths) -> list[Problem]:
    """cluster.node_local_paths: absolute paths (`~` and `~user` expanded here, as the check before sbatch expands
    them); a relative one would be compared with the run dir's absolute path and never match, letting a run dir on
    node-local storage through."""
    import os

    out = []
    for i, p in enumerate(paths or []):
        key = f"cluster.node_local_paths[{i}]"
        if not isinstance(p, str) or not p.strip():
            out.append(Problem(key, _short(p), "an empty entry: a path private to each node is needed",
                               f"drop {key}"))
        elif not os.path.isabs(os.path.expanduser(p.strip())):
            out.append(Problem(key, _short(p), "a relative path (or a `~user` that does not exist): the run dir "
                               "and the other paths are compared as absolute ones, so it would never match",
                               f"{key}=/{p.strip().lstrip('~/.') or 'scratch'} (an absolute path; ~/ is expanded)"))
    return out


ESI_KEY = "verl.trainer.esi_redundant_time"


def esi_problems(r, time_min, signal_delay_s, band: Optional[tuple], save_s: float, needed: int) -> list[Problem]:
    """trainer.esi_redundant_time (r) against what verl does with it (vrun.estimate.timelimit): after every step
    verl saves when the deadline is within its 60 s + the longest step so far + r, and keeps saving at every step
    after. So r < -60 makes that window shorter than a step (the deadline can fall between two checks: no save at
    all), and a window as long as the usable time limit makes every step from the second save; r under `needed`
    (the plan's: this save's seconds beyond verl's 60, vrun.estimate.timelimit.redundant_time) lets a save begin
    too late to finish, and one more step at the band's high end than needed makes the last steps each save.
    band: the plan's step time (low, high) in seconds, None without an estimate."""
    from vrun.estimate.timelimit import SIGNAL_EARLY_S, VERL_SAVE_S

    if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
        return []  # a type verl reads differently: type_problems says it
    fix = f"{ESI_KEY}={needed} (what this plan's save needs), or leave it unset (the plan sets it)"
    if r < -VERL_SAVE_S:
        return [Problem(ESI_KEY, r, f"verl saves once the deadline is within {VERL_SAVE_S:g} s + the longest step "
                        f"+ this; under -{VERL_SAVE_S:g} that window is shorter than a step, so the deadline can fall "
                        "between two of its checks and nothing is saved", fix)]
    usable = None
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (time_min, signal_delay_s)):
        usable = time_min * 60.0 - float(signal_delay_s) - SIGNAL_EARLY_S
    if usable is not None and VERL_SAVE_S + r >= usable:
        return [Problem(ESI_KEY, r, f"verl's pre-deadline window ({VERL_SAVE_S:g} s + the longest step + this) "
                        f"holds the whole {time_min:g}-minute job ({usable:,.0f} s before the signal): every step "
                        "from the second would save a checkpoint", fix)]
    if r < needed:
        return [Problem(ESI_KEY, r, f"a save verl begins inside its window may not finish before the deadline: this "
                        f"plan's save takes about {save_s:,.0f} s, {needed} s beyond the {VERL_SAVE_S:g} verl counts",
                        fix, warning=True)]
    if band and band[0] and band[0] > 0 and r > needed + band[1]:
        saves = math.ceil((VERL_SAVE_S + band[1] + r) / (band[0] + max(save_s, 0.0)))
        return [Problem(ESI_KEY, r, f"verl's window ({VERL_SAVE_S:g} s + the longest step + this) holds up to "
                        f"{saves} steps with their saves at the plan's {band[0]:,.0f}-{band[1]:,.0f} s a step and "
                        f"{save_s:,.0f} s a save: each of them saves, about {saves * save_s:,.0f} s of saves where "
                        "one is needed", fix, warning=True)]
    return []


def watch_problems(run, slurm: bool, cluster: str = "") -> list[Problem]:
    """run.stall_after_s and run.stall_grace_s: finite seconds (a stall bound of 0 would cancel every job at once);
    a requeue on a stall needs a cluster to submit to (slurm: SLURM's, or a standing Ray cluster's; a KubeRay pod
    cannot apply a RayJob: there it acts as cancel)."""
    import math

    out = []
    for key, v, low in (("run.stall_after_s", run.stall_after_s, 1.0), ("run.stall_grace_s", run.stall_grace_s, 0.0)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < low or v > 1e7:
            out.append(Problem(key, v, f"must be seconds between {low:g} and 10,000,000",
                               f"{key}=<seconds>, or leave it unset (derived from the plan's step time)"))
    if str(run.on_stall) == "requeue" and not slurm:
        why = ("a KubeRay pod cannot apply a RayJob" if cluster == "kuberay" else
               "a run on this machine has no cluster to submit it to again")
        out.append(Problem("run.on_stall", "requeue", f"{why}: a stall cancels it instead",
                           "run.on_stall=cancel, or cluster=slurm" + (" or cluster=ray" if cluster == "kuberay" else ""),
                           warning=True))
    return out



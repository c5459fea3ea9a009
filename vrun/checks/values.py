"""Values as verl reads them: the ranges verl (or its first step) enforces, one source for the lengths, the run
config's own ranges, the model group's facts as counts, and types — a boolean given as a string, NaN or inf, a
negative where verl's default is positive — refused so the plan and verl never read a value differently.

Entry points: `run_config(config)` on the typed run config; `verl(resolved, entrypoint, base)` on the resolved
verl tree (entrypoint: its record, vrun.entrypoints; base: verl's own composed tree, for the types of its
defaults).
"""
from __future__ import annotations

import math
import re
from typing import Any, Optional

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
        out.append(Problem(key, _short(v), "a boolean given as a string: verl's config classes and the plan would "
                           "read it differently", f"{key}={meant}" if meant else f"{key}=true or {key}=false"))
    elif isinstance(b, (int, float)) and not isinstance(b, bool) and isinstance(v, str) and not v.startswith("${"):
        out.append(Problem(key, _short(v), f"a number given as a string (verl's default is {b!r})",
                           f"{key}=<a number, unquoted>"))
    elif isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 and \
            isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0 and not path.endswith("seed"):
        out.append(Problem(key, v, f"negative where verl's default is positive ({b!r})", f"{key}=<a positive number>"))


# verl keys with a range verl (or its first step) enforces in every tree; each entrypoint's record lists its own
# (Entrypoint.positive_ints, .fractions), and its optimizer block's offload_fraction is a fraction too
NON_NEGATIVE_INT = ("trainer.total_epochs", "trainer.save_freq", "trainer.test_freq")
# read by both entrypoints when set (null: verl counts the steps from the data and epochs)
POSITIVE_INT = ("trainer.total_training_steps",)
RAY_ADDRESS = re.compile(r"^(local|auto|(ray://)?[A-Za-z0-9._-]+:[0-9]{1,5})$")
# cluster=ray: the dashboard the Job Submission API answers on
RAY_DASHBOARD = re.compile(r"^(auto|(https?://)?([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5})/?$")


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


def run_problems(config) -> list[Problem]:
    """The run config's own ranges and conflicts (config: vrun.config.schema.RunConfig)."""
    c = config.cluster
    out = []
    slurm = str(c.name) == "slurm"
    if str(c.name) == "ray":
        if not isinstance(c.ray.address, str) or not RAY_DASHBOARD.match(c.ray.address):
            out.append(Problem("cluster.ray.address", _short(c.ray.address), "cluster=ray submits to a running "
                               "cluster's dashboard ('auto': RAY_ADDRESS)",
                               "cluster.ray.address=http://<head>:8265 (or auto with RAY_ADDRESS set)"))
        t = c.ray.dashboard_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 600:
            out.append(Problem("cluster.ray.dashboard_timeout_s", t, "must be seconds in (0, 600]: a lost dashboard "
                               "is reported after it", "cluster.ray.dashboard_timeout_s=15"))
    elif not isinstance(c.ray.address, str) or not RAY_ADDRESS.match(c.ray.address):
        out.append(Problem("cluster.ray.address", _short(c.ray.address), "Ray joins 'local' (a fresh instance), "
                           "'auto' (the running one) or host:port", "cluster.ray.address=local|auto|<host>:<port>"))
    elif slurm and c.ray.address == "local" and str(config.algo.entrypoint) != "sft":  # SFT: warned as unread
        out.append(Problem("cluster.ray.address", "local", "cluster=slurm brings up one Ray cluster over the job's "
                           "nodes; 'local' would start a separate one-node instance on the head",
                           "cluster.ray.address=auto (the default for cluster=slurm)"))
    for key, v, low in (("cluster.time_min", c.time_min, 1), ("cluster.ray.join_timeout_s", c.ray.join_timeout_s, 1),
                        ("cluster.max_requeues", c.max_requeues, 0), ("cluster.master_port", c.master_port, 1),
                        ("cluster.cpus_per_task", c.cpus_per_task, 1), ("cluster.mem_gb", c.mem_gb, 1),
                        ("cluster.ray.num_cpus", c.ray.num_cpus, 0), ("cluster.ray.num_gpus", c.ray.num_gpus, 1),
                        ("cluster.signal_delay_s", c.signal_delay_s, 1)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            why = "0 means no time limit to sbatch (and no GPU-hours to confirm)" if key == "cluster.time_min" and \
                v == 0 else ("Ray would offer verl's workers no GPU (null: the mesh's gpus_per_node)"
                             if key == "cluster.ray.num_gpus" and v == 0 else f"must be an integer ≥ {low}")
            out.append(Problem(key, v, why, f"{key}=<integer ≥ {low}>"))
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
    out += watch_problems(config.run, slurm)
    if not 0 < c.master_port < 65536:
        out.append(Problem("cluster.master_port", c.master_port, "not a TCP port", "cluster.master_port=29500"))
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
    return out


def watch_problems(run, slurm: bool) -> list[Problem]:
    """run.stall_after_s and run.stall_grace_s: finite seconds (a stall bound of 0 would cancel every job at once);
    a requeue on a stall needs a cluster to submit to."""
    import math

    out = []
    for key, v, low in (("run.stall_after_s", run.stall_after_s, 1.0), ("run.stall_grace_s", run.stall_grace_s, 0.0)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < low or v > 1e7:
            out.append(Problem(key, v, f"must be seconds between {low:g} and 10,000,000",
                               f"{key}=<seconds>, or leave it unset (derived from the plan's step time)"))
    if str(run.on_stall) == "requeue" and not slurm:
        out.append(Problem("run.on_stall", "requeue", "a run on this machine has no cluster to submit it to again: "
                           "a stall cancels it instead", "run.on_stall=cancel, or cluster=slurm", warning=True))
    return out


# architecture facts that count something: a positive integer; the others (optional widths, ranks) ≥ 0
MAX_LAYERS, MAX_COUNT = 4096, 2 ** 40
ARCH_POSITIVE = ("layers", "routed_experts", "experts_per_token", "heads", "hidden", "gdn_conv_kernel")


def arch_problems(arch) -> list[Problem]:
    """The model group's facts (vrun.config.schema.Arch) as counts: integers, positive where they count layers/heads."""
    from dataclasses import fields

    out = []
    for f in fields(arch):
        if "int" not in str(f.type):
            continue
        v = getattr(arch, f.name)
        low = 1 if f.name in ARCH_POSITIVE else 0
        high = MAX_LAYERS if "layers" in f.name else MAX_COUNT
        vals = v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else [v]
        if any(x is not None and (isinstance(x, bool) or not isinstance(x, int) or not low <= x <= high)
               for x in vals):
            out.append(Problem(f"model.arch.{f.name}", _short(v), f"a count: an integer in [{low}, {high}]",
                               "fix conf/model/<model>.yaml (the checkpoint's config.json is the truth)"))
    if isinstance(arch.full_attention_interval, int) and arch.full_attention_interval == 0:
        out.append(Problem("model.arch.full_attention_interval", 0, "one full-attention layer every 0 layers",
                           "null (no hybrid layers) or a positive interval"))
    return out


def model_problems(model) -> list[Problem]:
    """The model group's own facts besides arch (vrun.config.schema.Model)."""
    out = arch_problems(model.arch)
    for key in ("tp_allowed", "etp_allowed"):
        v = getattr(model, key)
        if not v or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= 1024 for x in v):
            out.append(Problem(f"model.{key}", _short(v), "the TP sizes Megatron Lite implements for the family: "
                               "a non-empty list of positive integers", f"model.{key}=[1]"))
    for key in ("mlite_name", "path_env"):
        v = getattr(model, key)
        if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            out.append(Problem(f"model.{key}", _short(v), "an identifier", f"fix conf/model/{model.name}.yaml"))
    return out



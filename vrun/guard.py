"""Input the plan refuses before anything is written: secrets by any path, control characters, names that
become paths or reach the batch script, run dirs that escape or that verl's own Hydra would misparse.

Runs on the composed run config (Hydra's node, before the typed config is built) for a single run in the
manifest callback's on_run_start (before Hydra creates the run dir) and for every sweep point in the
sweeper (before anything is written). Secrets are kept out of every line printed: emit() scrubs them.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from vrun.problems import CONTROL, SECRETISH, Problem

# names that become path components, job names or verl trainer names
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
NAME_KEYS = ("model.name", "algo.name", "data.name", "run.project_name", "run.experiment_name")
# the group whose option a name is: the name is that option (group identities are not free text)
GROUP_OF = {"model.name": "model", "algo.name": "algo", "data.name": "data"}
# values that reach sbatch options: a word each (constraint expressions keep their operators)
SBATCH_KEYS = {"cluster.partition": r"[A-Za-z0-9._,-]+", "cluster.account": r"[A-Za-z0-9._-]+",
               "cluster.qos": r"[A-Za-z0-9._-]+", "cluster.constraint": r"[A-Za-z0-9._,&|!*:\[\]()-]+",
               "cluster.job_name": r"[A-Za-z0-9._+-]{1,128}"}
# sbatch options the plan decides: refused as additional_parameters (the plan's figures would not be the job's)
SBATCH_OWNED = {"nodes": "mesh.nnodes", "ntasks": "one task per node", "ntasks-per-node": "one task per node",
                "tasks-per-node": "one task per node", "ntasks-per-gpu": "one task per node",
                "gpus": "the mesh", "gpus-per-node": "mesh.gpus_per_node", "gpus-per-task": "mesh.gpus_per_node",
                "time": "cluster.time_min", "job-name": "cluster.job_name", "partition": "cluster.partition",
                "account": "cluster.account", "qos": "cluster.qos", "constraint": "cluster.constraint",
                "cpus-per-task": "cluster.cpus_per_task", "mem": "cluster.mem_gb", "signal": "cluster.signal_delay_s",
                "output": "the job's logs (hydra.launcher.submitit_folder)", "error": "the job's logs "
                "(hydra.launcher.submitit_folder)", "open-mode": "the job's logs", "wrap": "the job's command",
                "array": "one job per sweep point"}
# the default names passed to workers (conf/run.yaml pass_env) are secrets even before the config is read
DEFAULT_PASS_ENV = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
TRIVIAL = {"", "0", "1", "true", "false", "True", "False", "none", "None", "null"}
ENV_REF = re.compile(r"oc\.env\s*:\s*([A-Za-z_][A-Za-z0-9_]*)")


def secret_names(environ: Optional[dict] = None, pass_env: Iterable[str] = ()) -> set[str]:
    environ = os.environ if environ is None else environ
    return {k for k in environ if SECRETISH.search(k)} | set(DEFAULT_PASS_ENV) | {str(n) for n in pass_env}


def secret_values(environ: Optional[dict] = None, pass_env: Iterable[str] = ()) -> dict[str, str]:
    """value → the variable it comes from, for every secret variable set to something non-trivial."""
    environ = os.environ if environ is None else environ
    out = {}
    for name in secret_names(environ, pass_env):
        v = environ.get(name)
        if v and v.strip() not in TRIVIAL and len(v) >= 4:
            out[v] = name
    return out


def scrub(text: str, environ: Optional[dict] = None) -> str:
    """The text with every secret variable's value replaced by <hidden> (longest first)."""
    for v in sorted(secret_values(environ), key=len, reverse=True):
        text = text.replace(v, "<hidden>")
    return text


def _leaves(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(d, dict):
        if not d and prefix:
            yield prefix, d
        for k, v in d.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(d, list):
        if not d and prefix:
            yield prefix, d
        for i, v in enumerate(d):
            yield from _leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, d


def _containers(cfg: Any) -> tuple[dict, Optional[dict]]:
    """(raw, resolved) plain containers of the run config without the hydra node; resolved is None when an
    interpolation fails (composition reports that one, scrubbed)."""
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    raw = OmegaConf.to_container(cfg, resolve=False)
    raw.pop("hydra", None)
    try:
        c = cfg.copy()
        from omegaconf import open_dict

        with open_dict(c):
            c.pop("hydra", None)
        resolved = OmegaConf.to_container(c, resolve=True)
    except Exception as e:  # noqa: BLE001 - reported as one line by config_problems
        resolved = e
    return raw, resolved


def config_problems(cfg: Any, environ: Optional[dict] = None, choices: Optional[dict] = None) -> list[Problem]:
    """Secrets, control characters, names and sbatch values in the composed run config."""
    environ = dict(os.environ if environ is None else environ)
    raw, resolved = _containers(cfg)
    pass_env = [str(x) for x in (raw.get("pass_env") or []) if isinstance(x, (str, int))]
    names = secret_names(environ, pass_env)
    values = secret_values(environ, pass_env)
    problems: list[Problem] = []
    seen: set[str] = set()

    def add(p: Problem) -> None:
        if p.key not in seen:
            seen.add(p.key)
            problems.append(p)

    for key, v in _leaves(raw):
        last = re.split(r"[.\[]", key)[-1]
        if CONTROL.search(key):
            add(Problem(CONTROL.sub("?", key), None, "a key with a control character", "remove it"))
            continue
        if key.startswith("pass_env"):
            if not (isinstance(v, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)):
                add(Problem(key, "<hidden>" if isinstance(v, str) and v in values else v,
                            "pass_env holds names of variables, not values",
                            "pass_env=[WANDB_API_KEY,HF_TOKEN] (names; export the values)"))
            continue
        if isinstance(v, str):
            m = ENV_REF.search(v)
            if m and (m.group(1) in names):
                add(Problem(key, "<hidden>", f"interpolates the secret variable {m.group(1)}: its value would be "
                            "written into the plan and the verl config",
                            f"remove it; add {m.group(1)} to pass_env (it reaches the workers by name)"))
                continue
            if v in values:
                add(Problem(key, "<hidden>", f"equals the value of the secret variable {values[v]}: it would be "
                            "written into the plan and the verl config",
                            f"remove it; add {values[v]} to pass_env (it reaches the workers by name)"))
                continue
            if CONTROL.search(v):
                add(Problem(key, "<control characters>", "a value with a control character (a newline would add "
                            "a line to sbatch.sh or a command line)", f"give {key} on one line, without control "
                            "characters"))
                continue
        if SECRETISH.search(last) and v not in (None, "", {}, []):
            add(Problem(key, "<hidden>", "a secret's value would be written into the plan and the verl config",
                        f"export {last} and add it to pass_env=[...,{last}] (it reaches the workers by name)"))
    if isinstance(resolved, Exception):
        from vrun import cli_errors

        line = cli_errors.describe(resolved).removeprefix("error: ")
        key, _, rest = line.partition(": ")
        if not problems:
            problems.append(Problem(key, "<unresolved>", rest.split("; fix: ")[0], rest.partition("; fix: ")[2] or
                                    "fix the interpolation"))
    else:
        for key, v in _leaves(resolved):
            if key in seen or key.startswith("pass_env"):
                continue
            if isinstance(v, str) and v in values:
                add(Problem(key, "<hidden>", f"its value comes from the secret variable {values[v]}: it would be "
                            "written into the plan and the verl config",
                            f"remove it; add {values[v]} to pass_env (it reaches the workers by name)"))
            elif isinstance(v, str) and CONTROL.search(v):
                add(Problem(key, "<control characters>", "a value with a control character (a newline would add "
                            "a line to sbatch.sh or a command line)", f"give {key} without control characters"))
        problems += name_problems(resolved, choices, seen)
    return problems


def name_problems(resolved: dict, choices: Optional[dict] = None, seen: Optional[set] = None) -> list[Problem]:
    from vrun.dotted import get

    seen = set() if seen is None else seen
    out = []
    for key in NAME_KEYS:
        v = get(resolved, key, None)
        if key in seen or v is None:
            continue
        if not group_of(key) and any(p.key in GROUP_OF for p in out):
            continue  # the run names default to the group names: one line for the name at fault
        group = group_of(key)
        choice = (choices or {}).get(group) if group else None
        if group and choice is not None and str(v) != str(choice):
            out.append(Problem(key, _short(v), f"the {group} group's identity (it names the run dir and the job) "
                               f"is set by {group}=<option>, here {group}={choice}",
                               f"drop {key}=...; choose another {group} with {group}=<option>"))
        elif not (isinstance(v, str) and SAFE_NAME.match(v)):
            out.append(Problem(key, _short(v), "a name that becomes part of a path and a job name must be "
                               "letters, digits and . _ + - (starting with a letter or digit, at most 128)",
                               f"{key}=<letters, digits, . _ + ->"))
    for key, allowed in SBATCH_KEYS.items():
        v = get(resolved, key, None)
        if key in seen or v is None:
            continue
        if not re.fullmatch(allowed, str(v)):
            out.append(Problem(key, _short(v), "reaches sbatch.sh as an option value: one word of the "
                               "characters sbatch takes there" + (" (at most 128)" if key == "cluster.job_name" else ""),
                               f"{key}=<name>"))
    for key in ("cluster.setup", "cluster.node_setup"):
        for i, line in enumerate(get(resolved, key, None) or []):
            if not isinstance(line, str):
                out.append(Problem(f"{key}[{i}]", _short(line), "a line of shell", f"{key}=['<command>']"))
            elif key == "cluster.setup" and re.match(r"\s*#\s*SBATCH", line):
                out.append(Problem(f"{key}[{i}]", _short(line), "sbatch would read it as an option of the job",
                                   "sbatch options go in +cluster.additional_parameters.<option>=<value>"))
    extra = get(resolved, "cluster.additional_parameters", None) or {}
    for k, v in extra.items():
        key, option = f"cluster.additional_parameters.{k}", str(k).replace("_", "-")
        if key in seen:
            continue
        owned = [o for o in SBATCH_OWNED if o.startswith(option)]  # sbatch takes any unambiguous prefix
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", str(k)) or CONTROL.search(str(v)):
            out.append(Problem(key, _short(v), "becomes an #SBATCH line: a lower-case option name and a one-line "
                               "value", "cluster.additional_parameters.<option>=<value>"))
        elif owned:
            name = option if option in SBATCH_OWNED else owned[0]
            owner = SBATCH_OWNED[name]
            out.append(Problem(key, _short(v), f"--{name} is decided by {owner}", f"drop {key}" + (
                f"; set {owner}" if owner.startswith(("cluster.", "mesh.")) else "")))
        elif option == "gres" and "gpu" in str(v):
            out.append(Problem(key, _short(v), "the GPUs per node come from the mesh (--gpus-per-node)",
                               f"drop {key}; set mesh.gpus_per_node"))
        elif option == "cpus-per-gpu" and get(resolved, "cluster.cpus_per_task", None) is not None:
            out.append(Problem(key, _short(v), "sbatch takes one of --cpus-per-task (cluster.cpus_per_task) and "
                               "--cpus-per-gpu", f"drop {key} or cluster.cpus_per_task"))
        elif option in ("mem-per-gpu", "mem-per-cpu") and (get(resolved, "cluster.mem_gb", None) is not None or
                                                          len({"mem-per-gpu", "mem-per-cpu"} & {
                                                              str(x).replace("_", "-") for x in extra}) > 1):
            out.append(Problem(key, _short(v), "sbatch takes one of --mem (cluster.mem_gb), --mem-per-gpu, "
                               "--mem-per-cpu", f"drop {key} or the other memory option"))
    return out


def _short(v: Any) -> str:
    s = str(v)
    s = CONTROL.sub("?", s)
    return s if len(s) <= 80 else s[:77] + "..."


def run_dir_problems(run_dir: str, key: str, inside: Optional[str] = None) -> list[Problem]:
    """A run dir verl can be given: no comma (verl's Hydra argv would read a sweep), no control character, and
    within `inside` (the sweep dir) when given."""
    out = []
    if CONTROL.search(run_dir):
        return [Problem(key, _short(run_dir), "a directory name with a control character",
                        f"{key}=<a path without control characters>")]
    if "," in run_dir:
        out.append(Problem(key, run_dir, "a comma in the run dir reaches verl's Hydra command line (the config path) "
                           "and parses as a sweep", f"{key}=<a path without commas>"))
    if inside is not None:
        base = Path(os.path.normpath(os.path.abspath(inside)))
        target = Path(os.path.normpath(os.path.abspath(run_dir)))
        if target != base and base not in target.parents:
            out.append(Problem(key, run_dir, f"the run dir escapes the sweep dir {base}",
                               "names in hydra.sweep.subdir must not contain '/' or '..'"))
    return out


def new_ancestors(path: str) -> list[Path]:
    """The directories mkdir -p would create for `path`, deepest first (what a refused run removes)."""
    p = Path(os.path.abspath(path))
    out = []
    while not p.exists() and p != p.parent:
        out.append(p)
        p = p.parent
    return out


def remove_if_empty(dirs: list[Path]) -> None:
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            return


# the directories a single run's Hydra is about to create (removed again when the plan is refused)
CREATED: list[Path] = []


def check_single_run(config: Any) -> None:
    """on_run_start of a single run: refuse (one line each, exit 2) before Hydra creates the run dir."""
    from omegaconf import OmegaConf

    from vrun import cli_errors

    hc = config.hydra
    choices = OmegaConf.to_container(hc.runtime.choices, resolve=False) if "runtime" in hc else {}
    problems = config_problems(config, choices=choices)
    launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
    if "submitit" in launcher:
        problems.append(Problem("hydra/launcher", choices.get("hydra/launcher"), "Hydra applies a launcher only "
                                "in multirun, so this run would train on this machine",
                                "add cluster=slurm (it submits without -m)"))
    run_dir = None
    if not problems:
        try:
            run_dir = str(OmegaConf.select(config, "hydra.run.dir", throw_on_resolution_failure=True))
        except Exception as e:  # noqa: BLE001
            problems.append(Problem("hydra.run.dir", None, cli_errors.describe(e).removeprefix("error: "),
                                    "hydra.run.dir=<a directory>"))
    if run_dir is not None:
        problems += run_dir_problems(run_dir, "hydra.run.dir")
    errors = [p for p in problems if not p.warning]
    if errors:
        cli_errors.emit([p.line() for p in errors])
    CREATED[:] = new_ancestors(run_dir) if run_dir else []


def group_of(key: str) -> Optional[str]:
    return GROUP_OF.get(key)


# verl keys with a range verl (or its first step) enforces, by the entrypoint's tree: key → (kind, fix)
POSITIVE_INT = ("data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
                "actor_rollout_ref.rollout.n", "actor_rollout_ref.actor.ppo_mini_batch_size",
                "actor_rollout_ref.rollout.tensor_model_parallel_size", "data.micro_batch_size_per_gpu",
                "data.max_length", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_epochs")
NON_NEGATIVE_INT = ("trainer.total_epochs", "trainer.save_freq", "trainer.test_freq")
FRACTION = ("actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.actor.clip_ratio",
            "actor_rollout_ref.actor.optim.override_optimizer_config.offload_fraction",
            "optim.override_optimizer_config.offload_fraction")
RAY_ADDRESS = re.compile(r"^(local|auto|(ray://)?[A-Za-z0-9._-]+:[0-9]{1,5})$")


def range_problems(verl: dict) -> list[Problem]:
    """Values of the resolved verl tree out of the range verl accepts (booleans are not integers)."""
    from vrun.dotted import MISSING, get

    out = []
    for key in POSITIVE_INT + NON_NEGATIVE_INT:
        v = get(verl, key, MISSING)
        if v is MISSING or v is None:
            continue
        low = 1 if key in POSITIVE_INT else (-1 if key.endswith("_freq") else 0)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= 2 ** 31:
            what = "a positive integer" if low == 1 else ("an integer ≥ -1 (-1: never)" if low == -1
                                                          else "a non-negative integer")
            what += " up to 2^31"
            out.append(Problem(f"verl.{key}", v, f"must be {what}", f"verl.{key}=<{what}>"))
    for key in FRACTION:
        v = get(verl, key, MISSING)
        if v is MISSING or v is None:
            continue
        zero_ok = key.endswith("offload_fraction")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not ((0 <= v) if zero_ok else (0 < v)) or v > 1:
            out.append(Problem(f"verl.{key}", v, f"must be a fraction in {'[0' if zero_ok else '(0'}, 1]",
                               f"verl.{key}=0.5"))
    return out


def length_problems(verl: dict) -> list[Problem]:
    """PPO: the rollout's lengths and the DAPO reward's max_resp_len equal the data's (one source)."""
    from vrun.dotted import MISSING, get

    out = []
    for src, dest in (("data.max_prompt_length", "actor_rollout_ref.rollout.prompt_length"),
                      ("data.max_response_length", "actor_rollout_ref.rollout.response_length"),
                      ("data.max_response_length", "reward.reward_kwargs.max_resp_len")):
        a, b = get(verl, src, MISSING), get(verl, dest, MISSING)
        if a is MISSING or b is MISSING or a is None or b is None or a == b:
            continue
        out.append(Problem(f"verl.{dest}", b, f"differs from {src}={a}: the plan's checks and the table would "
                           "describe lengths verl does not use", f"set verl.{src} only (it sets {dest})"))
    return out


def run_problems(config) -> list[Problem]:
    """The run config's own ranges and conflicts (config: vrun.schema.RunConfig)."""
    c = config.cluster
    out = []
    slurm = str(c.name) == "slurm"
    if not isinstance(c.ray.address, str) or not RAY_ADDRESS.match(c.ray.address):
        out.append(Problem("cluster.ray.address", _short(c.ray.address), "Ray joins 'local' (a fresh instance), "
                           "'auto' (the running one) or host:port", "cluster.ray.address=local|auto|<host>:<port>"))
    elif slurm and c.ray.address == "local":
        out.append(Problem("cluster.ray.address", "local", "cluster=slurm brings up one Ray cluster over the job's "
                           "nodes; 'local' would start a separate one-node instance on the head",
                           "cluster.ray.address=auto (the default for cluster=slurm)"))
    for key, v, low in (("cluster.time_min", c.time_min, 1), ("cluster.ray.join_timeout_s", c.ray.join_timeout_s, 1),
                        ("cluster.max_requeues", c.max_requeues, 0), ("cluster.master_port", c.master_port, 1),
                        ("cluster.cpus_per_task", c.cpus_per_task, 1), ("cluster.mem_gb", c.mem_gb, 1),
                        ("cluster.ray.num_cpus", c.ray.num_cpus, 0), ("cluster.ray.num_gpus", c.ray.num_gpus, 0),
                        ("cluster.signal_delay_s", c.signal_delay_s, 1)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            why = "0 means no time limit to sbatch (and no GPU-hours to confirm)" if key == "cluster.time_min" and \
                v == 0 else f"must be an integer ≥ {low}"
            out.append(Problem(key, v, why, f"{key}=<integer ≥ {low}>"))
    if all(isinstance(x, int) and x > 0 for x in (c.time_min, c.signal_delay_s)) and c.signal_delay_s >= c.time_min * 60:
        out.append(Problem("cluster.signal_delay_s", c.signal_delay_s, f"the requeue signal would come at the start "
                           f"of a {c.time_min}-minute job (every attempt requeues at once)",
                           f"cluster.signal_delay_s=<under {c.time_min * 60}>"))
    if not 0 < c.master_port < 65536:
        out.append(Problem("cluster.master_port", c.master_port, "not a TCP port", "cluster.master_port=29500"))
    if c.confirm_gpu_hours is not None and not c.confirm_gpu_hours > 0:
        out.append(Problem("cluster.confirm_gpu_hours", c.confirm_gpu_hours, "must be positive",
                           "cluster.confirm_gpu_hours=1000"))
    from vrun import entrypoints
    from vrun.schema import EntrypointName

    ep = str(config.algo.entrypoint)
    for block, v in (config.recipe or {}).items():  # one block per entrypoint, named after it
        if block not in {e.value for e in EntrypointName}:
            out.append(Problem(f"recipe.{block}", "...", "no such recipe block: recipe.ppo holds main_ppo keys, "
                               "recipe.sft sft_trainer keys", "recipe.ppo.<key> or recipe.sft.<key>"))
        elif block != ep and v:
            # the group files fill both blocks for every algorithm: only keys no group file sets are a setting
            extra = sorted({k for k, _ in _leaves(v)} - _group_recipe_keys(block))
            if extra:
                out.append(Problem(f"recipe.{block}.{extra[0]}", "...", f"algo={config.algo.name} runs {ep}: "
                                   f"recipe.{block} is read by nothing",
                                   "drop it, or " + ("algo=sft" if block == "sft" else "algo=grpo or algo=dapo"),
                                   warning=True))
    if config.run.dump_rollouts and not entrypoints.of(config).has_rollout:
        out.append(Problem("run.dump_rollouts", True, "SFT has no rollouts: read by nothing",
                           "drop it, or algo=grpo|dapo", warning=True))
    return out


# architecture facts that count something: a positive integer; the others (optional widths, ranks) ≥ 0
MAX_LAYERS, MAX_COUNT = 4096, 2 ** 40
ARCH_POSITIVE = ("layers", "routed_experts", "experts_per_token", "heads", "hidden", "gdn_conv_kernel")


def arch_problems(arch) -> list[Problem]:
    """The model group's facts (vrun.schema.Arch) as counts: integers, positive where they count layers/heads."""
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
    """The model group's own facts besides arch (vrun.schema.Model)."""
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


@functools.lru_cache(maxsize=None)
def _group_recipe_keys(block: str) -> frozenset:
    """The recipe.<block> keys the group files under conf/ set (read as YAML, once)."""
    import yaml

    keys = set()
    for f in (Path(__file__).resolve().parent.parent / "conf").rglob("*.yaml"):
        try:
            d = yaml.safe_load(f.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        node = (d.get("recipe") or {}).get(block) if isinstance(d, dict) and isinstance(d.get("recipe"), dict) else None
        if isinstance(node, dict):
            keys |= {k for k, _ in _leaves(node)}
    return frozenset(keys)

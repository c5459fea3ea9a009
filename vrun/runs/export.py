"""`python -m vrun export RUN`: a standalone bash script that reproduces the run's verl invocation without this
project — for a bug report to verl or Megatron Lite. It carries the saved verl_config.yaml verbatim (written
next to the script when it runs), sets and unsets the run's environment, runs verl's own CLI on that config and
says, in comments, what the project's entry does that verl's CLI does not. Secrets by name only."""
from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import asdict
from pathlib import Path

from vrun.rundir.state import Run
from vrun.core.writer import is_secret_name
from vrun.core import fs

MARK = "VERL_CONFIG_EOF"
SFT_ENTRY = ["verl_mlite.launch", "verl.trainer.sft_trainer"]


def script(run: Run) -> str:
    p = run.plan
    from vrun.core import fs
    from vrun.rundir.files import LIMIT, RunDirError

    config, why = fs.read_checked(run.dir / "verl_config.yaml", LIMIT, own=True)
    if config is None:
        raise RunDirError(str(run.dir / "verl_config.yaml"), "refused", why, "plan the run again")
    mark = delimiter(config)
    m = {k: c(v) for k, v in asdict(p.mesh).items()}
    b = p.batch
    manifest = _manifest(run.dir)
    pk = manifest.get("packages") if isinstance(manifest.get("packages"), dict) else {}
    sft = "sft_trainer" in p.entrypoint
    lines = [
        "#!/usr/bin/env bash",
        f"# Reproduces the verl invocation of run {c(run.dir)}",
        f"#   {c(p.model.name)} · {c(p.algo)} · optimizer {c(p.optimizer)} · mode {c(p.mode)} · cluster {c(p.cluster)}",
        f"#   mesh: {m.get('world')} GPUs = {m.get('nnodes')} node(s) × {m.get('gpus_per_node')}; dense "
        f"TP{m.get('tp')} · CP{m.get('cp')} · PP{m.get('pp')} · DP{m.get('dp')}; expert ETP{m.get('etp')} · "
        f"EP{m.get('ep')} · PP{m.get('pp')} · EDP{m.get('edp')}; vpp {m.get('vpp')}",
        f"#   batch: {c(json.dumps(b, sort_keys=True))}",
        "#   written with " + ", ".join(f"{c(k)} {c(v.get('version'))}" for k, v in pk.items()
                                       if k in ("verl", "ray", "torch") and isinstance(v, dict))
        + f"; verl_mlite from {c(p.mlite.source)}",
        "# Needs only verl (and Megatron Lite's verl_mlite on PYTHONPATH). Extra arguments are passed to verl's CLI,",
        "# e.g. `bash this.sh --cfg job` prints the composed config and exits.",
        "set -euo pipefail",
        'CONFIG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/verl-config.XXXXXX")',
        f"cat > \"$CONFIG_DIR/verl_config.yaml\" <<'{mark}'",
        config.rstrip("\n"),
        mark,
        "",
        "# the run's environment (set for the driver; the config's ray_kwargs.ray_init.runtime_env carries it to "
        "Ray workers)",
    ]
    for k, v in p.env.items():
        if not NAME.fullmatch(str(k)):
            lines.append(f"# skipped an environment entry whose name is not a variable name: {c(k)}")
            continue
        if k == "PYTHONPATH":
            v = ":".join(x for x in str(v).split(":") if not _is_project(x))
        if is_secret_name(k):
            lines.append(f": \"${{{k}:?export {k} first}}\"  # a secret: read from your environment")
        else:
            lines.append(f"export {k}={shlex.quote(str(v))}")
    unset = " ".join(n for n in (p.env_unset or ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"])
                     if NAME.fullmatch(str(n)))
    unset = unset or "ROCR_VISIBLE_DEVICES HIP_VISIBLE_DEVICES"
    lines.append(f"if [ -n \"${{CUDA_VISIBLE_DEVICES:-}}\" ]; then unset {unset}; fi")
    secrets = [str(n) for n in p.pass_env if NAME.fullmatch(str(n))]
    if secrets:
        lines.append(f"# secrets, by name only (never written here): {' '.join(secrets)}")
        if not sft:
            lines.append("# Export them in this shell: Ray workers inherit them from it on this node; on other "
                         "nodes export them before")
            lines.append("# `ray start` (neither the project nor verl puts them in the config or Ray's runtime env).")
    lines += notes(run)
    if sft:
        entry = sft_entry(p.argv)
        lines += [
            "# torchrun on every node: NODE_RANK 0…nnodes-1, MASTER_ADDR the first node",
            f"torchrun --nnodes {shlex.quote(str(m.get('nnodes')))} --nproc_per_node "
            f"{shlex.quote(str(m.get('gpus_per_node')))} "
            "--node_rank \"${NODE_RANK:-0}\" --master_addr \"${MASTER_ADDR:-127.0.0.1}\" "
            "--master_port \"${MASTER_PORT:-29500}\" \\",
            f"  -m {' '.join(shlex.quote(x) for x in entry)} --config-path \"$CONFIG_DIR\" --config-name verl_config "
            "\\",
            "  hydra.output_subdir=null \"$@\"",
        ]
    else:
        lines += [
            "python3 -m verl.trainer.main_ppo --config-path \"$CONFIG_DIR\" --config-name verl_config \\",
            "  hydra.output_subdir=null \"hydra.run.dir=$CONFIG_DIR/outputs\" \"$@\"",
        ]
    return "\n".join(lines) + "\n"


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def c(value) -> str:
    """A value as it may stand in a comment: one line (control characters shown as '?')."""
    return CONTROL.sub("?", str(value))


def delimiter(text: str) -> str:
    """A here-document delimiter that no line of `text` contains (the config ends only where the script says)."""
    tag = hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()[:12]
    mark = f"{MARK}_{tag}"
    while mark in text:
        mark += "_X"
    return mark


def notes(run: Run) -> list[str]:
    """Where the project's way of running this config differs from verl's CLI."""
    p = run.plan
    argv = p.argv
    out = []
    if "--task-runner" in argv:
        runner = c(argv[argv.index("--task-runner") + 1]) if argv.index("--task-runner") + 1 < len(argv) else "?"
        out.append(f"# NOTE: the run used the task runner {runner} (run.task_runner); verl's CLI runs its own "
                   "TaskRunner instead.")
    if "vrun.launch.entry" in argv:
        out.append("# NOTE: the project started this config with `python -m vrun.launch.entry ppo`, which does what "
                   "main_ppo.main does (auto_set_device,")
        out.append("# validate_config, run_ppo) and warns of unset pass_env names; verl's CLI below composes the "
                   "same saved config through Hydra first.")
    address = _ray_address(run.dir)
    if p.cluster == "slurm" or address not in (None, "local"):
        out.append(f"# NOTE: ray_kwargs.ray_init.address={c(address)}: start Ray first (`ray start --head` on the "
                   "first node, `ray start --address` on the others,")
        out.append("# each with --num-gpus), as the project's SLURM job did; then run this on the first node.")
    entry = sft_entry(argv)
    if "sft_trainer" in p.entrypoint and entry != SFT_ENTRY:
        out.append(f"# NOTE: the run replaced the SFT entry ({' '.join(SFT_ENTRY)}) by run.sft_entry={c(entry)}.")
    return out


def sft_entry(argv: list) -> list:
    """The modules torchrun runs: between -m and --config-path."""
    if "-m" in argv and "--config-path" in argv:
        return argv[argv.index("-m") + 1:argv.index("--config-path")]
    return list(SFT_ENTRY)


def _is_project(path: str) -> bool:
    """This project's root, or its stack hook's directory, on a PYTHONPATH (the script runs without them)."""
    here = Path(__file__).resolve().parent.parent.parent
    p = Path(path)
    return p in (here, here / "vrun" / "launch" / "stackhook") or fs.is_file(p / "vrun" / "launch" / "entry.py") or \
        (p.name == "stackhook" and fs.is_file(p.parent / "entry.py"))


def _ray_address(d: Path):
    import yaml

    try:
        from vrun.core import fs
        from vrun.rundir.files import LIMIT

        text, _ = fs.read_checked(d / "verl_config.yaml", LIMIT, own=True)
        cfg = yaml.load(text or "", Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        return (((cfg.get("ray_kwargs") or {}).get("ray_init") or {}).get("address"))
    except (OSError, AttributeError, ValueError, yaml.YAMLError):
        return None


def _manifest(d: Path) -> dict:
    from vrun.rundir import files

    return files.optional_object(d / "manifest.json") or {}

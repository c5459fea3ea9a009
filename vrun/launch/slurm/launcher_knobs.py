"""A `hydra.launcher.*` value given by hand, put onto the knob it names before a point's checks (take_launcher: its
sbatch options without a knob become cluster.additional_parameters), refused where the mesh decides it, and named as
typed in any error (as_given); the point's own checks before anything is submitted (point_problems, folder_problems).
"""
from __future__ import annotations

import os
from pathlib import Path

from vrun.core.problems import Problem


# hydra.launcher.<key> given by hand → the knob it sets: one home per sbatch value. The value is put there as
# given (interpolations unresolved), so the knob's own checks (secrets, one word, ranges) judge it.
LAUNCHER_KNOBS = {"partition": "cluster.partition", "account": "cluster.account", "qos": "cluster.qos",
                  "constraint": "cluster.constraint", "timeout_min": "cluster.time_min",
                  "cpus_per_task": "cluster.cpus_per_task", "mem_gb": "cluster.mem_gb",
                  "max_num_timeout": "cluster.max_requeues", "name": "cluster.job_name",
                  "signal_delay_s": "cluster.signal_delay_s", "setup": "cluster.setup",
                  "additional_parameters": "cluster.additional_parameters",
                  # sbatch options without a knob of their own are additional_parameters (the same #SBATCH line)
                  **{k: f"cluster.additional_parameters.{k}" for k in ("comment", "exclude", "gres", "cpus_per_gpu",
                                                                     "mem_per_gpu", "mem_per_cpu")}}


# ... that the mesh decides: refused when they disagree with it (one task per node holds all its GPUs)
LAUNCHER_MESH = {"nodes": "mesh.nnodes", "gpus_per_node": "mesh.gpus_per_node", "gpus_per_task": "mesh.gpus_per_node",
                 "tasks_per_node": None}


# ... that do not apply to this project's jobs
LAUNCHER_REFUSED = {"array_parallelism": "this project submits one job per sweep point, not a job array",
                    "stderr_to_stdout": "the run's logs keep stdout and stderr apart (python -m vrun logs reads both)"}


def launcher_given(unresolved: dict, overridden: list[str]) -> set[str]:
    """The hydra.launcher keys set by hand: given on the command line, or differing from the plugin's defaults."""
    import dataclasses

    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from omegaconf import OmegaConf

    defaults = OmegaConf.to_container(OmegaConf.structured(SlurmQueueConf), resolve=False)
    named = {o.lstrip("+~").split("=", 1)[0][len("hydra.launcher."):].split(".")[0]
             for o in overridden if o.lstrip("+~").startswith("hydra.launcher.")}
    # the launcher's values: its public fields (which class launches is the group choice's, not a value given)
    values = {f.name for f in dataclasses.fields(SlurmQueueConf) if not f.name.startswith("_")}
    return {k for k in unresolved if k in values and (k in named or unresolved[k] != defaults[k])}


def take_launcher(cfg, launcher: dict, given: set[str], mesh_values: dict) -> tuple[list[Problem], dict]:
    """Puts the hydra.launcher values given by hand (launcher: unresolved) onto their knobs in the composed point
    `cfg`, before its checks run. mesh_values: the given LAUNCHER_MESH keys, resolved. Returns the problems and
    {knob: hydra.launcher key} for naming the launcher key in the knobs' problems (as_given)."""
    from omegaconf import OmegaConf

    from vrun.config.schema import RunConfig

    out, taken = [], {}
    default = OmegaConf.structured(RunConfig)
    for key in sorted(given - {"submitit_folder"}):
        name = f"hydra.launcher.{key}"
        if key in LAUNCHER_KNOBS:
            knob, v = LAUNCHER_KNOBS[key], launcher[key]
            if isinstance(v, str) and v.replace(" ", "") == "${" + knob + "}":
                continue  # the launcher pointing at the knob itself: nothing given
            now = OmegaConf.select(cfg, knob, default=None, throw_on_resolution_failure=False)
            if key == "setup":  # the launcher's lines, then the cluster group's
                v = list(v or []) + OmegaConf.to_container(OmegaConf.select(cfg, knob), resolve=False)
            elif key == "additional_parameters":
                v = {**OmegaConf.to_container(OmegaConf.select(cfg, knob), resolve=False), **(v or {})}
            elif now is not None and now != OmegaConf.select(default, knob, default=None) and str(now) != str(v):
                out.append(Problem(name, v, f"{knob}={now} is given too: one value, two places",
                                   f"drop {name} or {knob}"))
                continue
            OmegaConf.update(cfg, knob, v, merge=False, force_add=True)
            taken[knob] = name
        elif key in LAUNCHER_MESH:
            src, v = LAUNCHER_MESH[key], mesh_values.get(key)
            want = OmegaConf.select(cfg, src) if src else 1
            if v is not None and v != want:
                out.append(Problem(name, v, f"the job's shape comes from the mesh: {src or 'one task per node'} = "
                                   f"{want}", f"drop {name}" + (f"; set {src}={v}" if src else "")))
        else:
            out.append(Problem(name, launcher[key], LAUNCHER_REFUSED.get(key, "not an option this project "
                               "takes from Hydra's submitit launcher"),
                               f"drop {name}" + ("" if key in LAUNCHER_REFUSED else
                                                 "; sbatch options go in +cluster.additional_parameters.<option>")))
    return out, taken


def as_given(problems: list[Problem], taken: dict) -> list[Problem]:
    """The knobs' problems named by the hydra.launcher key the value came from (the key the user typed)."""
    import dataclasses

    out = []
    for p in problems:
        for knob, name in taken.items():
            if p.key == knob or p.key.startswith((knob + ".", knob + "[")):
                p = dataclasses.replace(p, key=name + p.key[len(knob):], fix=p.fix.replace(knob, name))
                break
        out.append(p)
    return out


def point_problems(cfg, launcher: dict, hydra_overrides: list, sweep_dir: str, run_dir: str,
                   run_dir_key: str) -> tuple[list[Problem], dict]:
    """A composed point under cluster=slurm (cfg still holds the point's hydra node; launcher: its hydra.launcher,
    unresolved): the hydra.launcher values given by hand put onto their knobs, the job's folder, the paths SLURM
    expands. Returns the problems and {"folder": the submitit folder, "knobs": {knob: hydra.launcher key}}."""
    from omegaconf import OmegaConf

    from vrun.checks import sbatch as check_sbatch

    given = launcher_given(launcher, hydra_overrides)
    # resolved here only what the mesh decides and the job's folder: every other launcher value goes onto its
    # knob unresolved, for the knob's checks
    resolved = {k: OmegaConf.select(cfg, f"hydra.launcher.{k}")
                for k in (given & set(LAUNCHER_MESH)) | {"submitit_folder"} if k in launcher}
    problems, knobs = take_launcher(cfg, launcher, given, resolved)
    # one run, one run dir: a run's job folder is in its run dir (hydra.run.dir), a sweep's in the sweep dir
    base, base_key = (run_dir, "hydra.run.dir") if run_dir_key == "hydra.run.dir" else (sweep_dir, "hydra.sweep.dir")
    default = Path(base) / ".submitit/%j"
    folder = str(Path(str(resolved.get("submitit_folder") if "submitit_folder" in given else default)).absolute())
    if "submitit_folder" in given:
        problems += folder_problems(folder, base, base_key)
    problems += check_sbatch.expanded_path(run_dir, run_dir_key)
    return problems, {"folder": folder, "knobs": knobs}


def folder_problems(folder: str, sweep_dir: str, dir_key: str = "hydra.sweep.dir") -> list[Problem]:
    """hydra.launcher.submitit_folder given by hand (absolute): the job's logs and pickles, inside the sweep dir
    (a run's: inside its run dir, dir_key hydra.run.dir)."""
    from vrun.core.problems import CONTROL

    key = "hydra.launcher.submitit_folder"
    if CONTROL.search(folder):
        return [Problem(key, folder, "a directory name with a control character (it reaches sbatch.sh)",
                        f"{key}=<a path without control characters>")]
    base = Path(os.path.normpath(sweep_dir))
    what = "run dir" if dir_key == "hydra.run.dir" else "sweep dir"
    if base not in Path(os.path.normpath(folder)).parents:
        return [Problem(key, folder, f"the job's logs and pickles would be written outside the {what} {base}",
                        f"{key}={base}/<dir>/%j (or {dir_key}=<a dir holding it>)")]
    return []

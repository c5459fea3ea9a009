"""Paths and run dirs: names that become path components, and run dirs that are one run's, inside their sweep dir,
reached without a link. (How an entrypoint's command line reads the run dir is its own check:
`Entrypoint.run_dir_problems`.)

Entry points: `names(resolved, choices)` for the run config's names; `run_dir(path, key, ...)` for a run or sweep
dir before anything is written into it; `sweep(sweep_dir, point_dirs, resume)` for a sweep's points together;
`same_plan(run_dir, verl_text)` when `run.resume=true` re-plans into a run's own dir.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

from vrun.core.problems import CONTROL, Problem
from vrun.core.writer import secret_values
from vrun.core import fs

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
NAME_KEYS = ("model.name", "algo.name", "data.name", "run.project_name", "run.experiment_name")
# the group whose option a name is: the name is that option (group identities are not free text)
GROUP_OF = {"model.name": "model", "algo.name": "algo", "data.name": "data"}
# what a run leaves in its dir: a dir holding one of these holds a run
RUN_FILES = ("plan.json", "verl_config.yaml", "manifest.json", "progress.jsonl", "slurm_job.json", "sbatch.sh",
             "checkpoints", "rollouts", "slurm_attempts.jsonl", ".vrun")
# the longest file name and path Linux filesystems take (NAME_MAX, PATH_MAX), and the length a run dir may have so
# that the files verl writes below it (checkpoints/global_step_N/actor/...) still fit
NAME_MAX, PATH_MAX = 255, 4096
PATH_ROOM = PATH_MAX - 512
def _resume_fix(key: str) -> str:
    """A run dir holding another run: a new dir under the key the user sets (a sweep point's dir is set by the sweep
    dir), or resume."""
    where = "hydra.sweep.dir" if key.startswith("hydra.sweep") else key
    return f"a new dir ({where}=<a new directory>), or run.resume=true with the same plan to continue that run"


def group_of(key: str) -> Optional[str]:
    return GROUP_OF.get(key)


def short(v: Any) -> str:
    s = CONTROL.sub("?", str(v))
    return s if len(s) <= 80 else s[:77] + "..."


def names(resolved: dict, choices: Optional[dict] = None, seen: Optional[set] = None) -> list:
    """The run's names: a group's name is its option; the others letters, digits and . _ + -."""
    from vrun.core.dotted import get

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
            out.append(Problem(key, short(v), f"the {group} group's identity (it names the run dir and the job) "
                               f"is set by {group}=<option>, here {group}={choice}",
                               f"drop {key}=...; choose another {group} with {group}=<option>"))
        elif not (isinstance(v, str) and SAFE_NAME.match(v)):
            out.append(Problem(key, short(v), "a name that becomes part of a path and a job name must be "
                               "letters, digits and . _ + - (starting with a letter or digit, at most 128)",
                               f"{key}=<letters, digits, . _ + ->"))
    return out


def run_dir(path: Any, key: str, inside: Optional[str] = None, resume: bool = False,
            environ: Optional[dict] = None) -> list:
    """A run (or sweep) dir the plan may write: not empty, not /, a filesystem root or the home dir; no control
    character; no secret in its name; inside
    `inside` (the sweep dir) on real paths without a link below it; not a link itself; not holding another run's
    files unless `resume` (the same plan, checked when it is made)."""
    if path is None or str(path).strip() == "":
        return [Problem(key, "''", "an empty run dir is the current directory: the plan's files would mix with "
                        "whatever is there", f"{key}=<a new directory>")]
    path = str(path)
    if CONTROL.search(path):
        return [Problem(key, short(path), "a directory name with a control character",
                        f"{key}=<a path without control characters>")]
    if any(v in path for v in secret_values(environ)):
        return [Problem(key, "<hidden>", "the dir's name holds a secret variable's value: it would be written in "
                        "every file and line naming the run", f"{key}=<a path without it>")]
    absolute = os.path.normpath(os.path.abspath(os.path.expanduser(path) if path.startswith("~") else path))
    longest = max((len(c.encode()) for c in absolute.split("/")), default=0)
    if longest > NAME_MAX or len(absolute.encode()) > PATH_ROOM:
        why = (f"a name of {longest} bytes, the filesystem takes at most {NAME_MAX}" if longest > NAME_MAX else
               f"{len(absolute.encode())} bytes long; the run's files below it need the rest of the {PATH_MAX} "
               "a path may have")
        return [Problem(key, short(path), why, f"{key}=<a shorter path>")]
    home = os.path.normpath(os.path.expanduser("~"))
    real = os.path.realpath(absolute)
    if absolute == "/" or real == "/" or absolute in (home, os.path.realpath(home)) or real == os.path.realpath(home) \
            or (os.path.isdir(real) and os.path.ismount(real)):
        what = "the home directory" if real == os.path.realpath(home) else "a filesystem root"
        return [Problem(key, short(path), f"is {what}: a run dir is one run's own directory",
                        f"{key}=<a new directory below it>")]
    if absolute == os.path.normpath(os.getcwd()):
        return [Problem(key, short(path), "is the current directory: the plan's files would mix with whatever is "
                        "there", f"{key}=<a new directory>")]
    if os.path.exists(absolute) and not os.path.isdir(absolute):
        return [Problem(key, short(path), "exists and is not a directory", f"{key}=<a new directory>")]
    out = []
    if inside is not None:
        base = os.path.normpath(os.path.abspath(inside))
        if absolute != base and not absolute.startswith(base.rstrip("/") + "/"):
            out.append(Problem(key, short(path), f"the run dir escapes the sweep dir {base}",
                               "names in hydra.sweep.subdir must not contain '/' or '..'"))
        else:
            link = _link_below(base, absolute)
            if link:
                out.append(Problem(key, short(path), f"{link} is a symbolic link: a sweep point's files would be "
                                   "written wherever it points", "remove the link; points are plain dirs under "
                                   "hydra.sweep.dir"))
    if os.path.islink(absolute):
        out.append(Problem(key, short(path), "is a symbolic link: the run's files would be written wherever it "
                           "points", f"{key}=<a plain directory>"))
    elif not resume and not out:
        held = holds_run(absolute)
        if held:
            out.append(Problem(key, short(path), f"holds another run's files ({held}): its progress, job and "
                               "checkpoints would be taken for this run's", _resume_fix(key)))
        elif _entries(absolute):
            out.append(Problem(key, short(path), f"holds files that are not a run's ({_entries(absolute)[0]}, ...): "
                               "a run dir is one run's own directory",
                               f"{'hydra.sweep.dir' if key.startswith('hydra.sweep') else key}=<a new directory>"))
    return out


def _link_below(base: str, path: str) -> Optional[str]:
    """The first existing component below `base` on the way to `path` that is a symbolic link."""
    rel = os.path.relpath(path, base)
    cur = base
    for part in ([] if rel == "." else rel.split(os.sep)):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            return cur
        if not os.path.exists(cur):
            return None
    return None


def _entries(path: str) -> list:
    """What the dir holds, but the lock of the process writing it (vrun.rundir.lock: no run file)."""
    from vrun.rundir.lock import LOCK

    try:
        return sorted(e for e in os.listdir(path) if e != LOCK)
    except OSError:
        return []


def holds_run(path: str) -> Optional[str]:
    """The first run file in `path` (None: no run there)."""
    try:
        present = set(os.listdir(path))
    except OSError:
        return None
    return next((f for f in RUN_FILES if f in present), None)


def sweep(sweep_dir: str, point_dirs: list, resume: bool = False) -> list:
    """A sweep's points together, point_dirs as (point number, run dir): each its own dir, and no point of an earlier
    sweep left beside them."""
    out = []
    seen: dict = {}
    for i, d in point_dirs:
        key = os.path.normpath(os.path.abspath(d))
        if key in seen:
            out.append(Problem("hydra.sweep.subdir", short(os.path.relpath(key, sweep_dir)), f"points {seen[key]} and "
                               f"{i} share one run dir: they would overwrite each other",
                               "hydra.sweep.subdir=${hydra.job.num}_... (unique per point)"))
            return out
        seen[key] = i
    if resume:
        return out
    try:
        entries = os.listdir(sweep_dir)
    except OSError:
        return out
    stale = sorted(e for e in entries if os.path.normpath(os.path.join(sweep_dir, e)) not in seen
                   and os.path.isdir(os.path.join(sweep_dir, e)) and holds_run(os.path.join(sweep_dir, e)))
    if stale:
        out.append(Problem("hydra.sweep.dir", short(sweep_dir), f"holds {len(stale)} point(s) of an earlier sweep "
                           f"({', '.join(stale[:3])}{', …' if len(stale) > 3 else ''}): `runs` and `cancel` would "
                           "take them for this sweep's", "hydra.sweep.dir=<a new directory>, or run.resume=true to "
                           "continue that sweep with the same points"))
    return out


def _same_yaml(a: str, b: str) -> bool:
    """The same content written another way (an earlier version of the project wrote it with PyYAML)."""
    import yaml

    try:
        return yaml.safe_load(a) == yaml.safe_load(b)
    except yaml.YAMLError:
        return False


def same_plan(run_dir_: str, verl_text: str) -> list:
    """run.resume=true: the dir's verl config must be the one this plan writes (verl resumes its checkpoints)."""
    f = Path(run_dir_) / "verl_config.yaml"
    if not fs.is_file(f) or fs.is_link(f):
        return []
    from vrun.rundir.files import LIMIT

    raw, _ = fs.read_checked(f, LIMIT, own=True, binary=True)
    try:
        old = raw.decode("utf-8") if raw is not None else None
    except UnicodeDecodeError:
        old = None
    if old == verl_text or (old is not None and _same_yaml(old, verl_text)):
        return []
    return [Problem("run.resume", True, f"{run_dir_} holds another plan (its verl_config.yaml differs): verl would "
                    "resume that run's checkpoints under this run's config", "the same overrides as that run, or a "
                    "new dir without run.resume")]

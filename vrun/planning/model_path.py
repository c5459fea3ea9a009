"""The model's checkpoint path as verl can take it: from model.path, the model's own variable, MODEL_PATH (one model
only) or the group's default, in that order; made absolute without a trailing '/' and `~` expanded (verl does
neither, and the job runs in the run dir), each change and a path this machine lacks said as a warning.
"""
from __future__ import annotations

import os
from typing import Optional

from vrun.core.problems import Problem
from vrun.core.writer import is_secret_name


def resolve_model_path(model, environ: dict, single_model: bool) -> tuple[Optional[str], str, list[Problem]]:
    """model: the config's model group (vrun.config.schema.Model). The path as verl can take it (normalise_path)."""
    path, source, problems = _model_path(model, environ, single_model)
    if path is None:
        return path, source, problems
    key = "model.path" if source == "model.path" else (source if source != "default" else "model.default_path")
    path, p = normalise_path(path, key, environ)
    return path, source, problems + p


def normalise_path(path: str, key: str, environ: dict) -> tuple[Optional[str], list[Problem]]:
    """verl asserts on a trailing '/' (copy_to_local), does not expand '~', and the job runs in the run dir (a
    relative path would point there): normalised, and said so; a path that does not exist is a warning."""
    out = []
    given = path
    if path.startswith("~"):
        home = environ.get("HOME") or os.path.expanduser("~")
        path = home + path[1:] if path == "~" or path.startswith("~/") else path
    hub_id = not path.startswith((".", "/", "~")) and path.count("/") == 1 and not os.path.exists(path)
    if hub_id:  # org/name: the workers resolve it on the Hugging Face hub (preflight says so)
        return path, out
    if not os.path.isabs(path):
        path = os.path.abspath(path)
    if len(path) > 1 and path.endswith("/"):
        path = path.rstrip("/") or "/"
    if len(path) > 4096 or any(len(part) > 255 for part in path.split("/")):
        return None, [Problem(key, given[:80] + ("..." if len(given) > 80 else ""), "longer than a path can be",
                              f"{key}=/path/to/checkpoint")]
    if path != given:
        out.append(Problem(key, given, f"taken as {path} (verl needs an absolute path without a trailing '/'; "
                           "the job runs in the run dir)", f"{key}={path}", warning=True))
    if not os.path.exists(path):
        out.append(Problem(key, path, "does not exist on this machine (preflight checks it where the job runs)",
                           f"{key}=<an existing checkpoint directory>", warning=True))
    return path, out


def _model_path(model, environ: dict, single_model: bool) -> tuple[Optional[str], str, list[Problem]]:
    if model.path:
        return model.path, "model.path", []
    env_name = model.path_env
    if is_secret_name(str(env_name)):
        return None, "unset", [Problem("model.path_env", env_name, "names a secret variable: its value would become "
                                       "the model path, written into the plan and printed",
                                       "model.path_env=<the variable holding the checkpoint path>")]
    if environ.get(env_name):
        return environ[env_name], env_name, []
    if environ.get("MODEL_PATH"):
        if single_model:
            return environ["MODEL_PATH"], "MODEL_PATH", []
        return None, "MODEL_PATH", [Problem("MODEL_PATH", environ["MODEL_PATH"],
                                            "this sweep plans several models; MODEL_PATH would put every one on one "
                                            "checkpoint", f"set {env_name} (and each model's own variable)")]
    if model.default_path:
        return model.default_path, "default", []
    return None, "unset", [Problem(env_name, None, f"no checkpoint path for {model.name}",
                                   f"export {env_name}=/path/to/checkpoint or model.path=...", warning=True)]

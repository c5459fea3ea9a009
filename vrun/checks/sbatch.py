"""Values that reach sbatch.sh: option values one word each, setup lines that are valid bash, extra sbatch options
from an allow-list (an option that would undo the plan is refused), and no `%` in paths SLURM expands.

Entry points: `check(resolved)` on the resolved run config; `expanded_path(path, key)` for a dir SLURM reads as
a filename pattern (the sweep dir and the job's log folder under cluster=slurm).
"""
from __future__ import annotations

import re
import subprocess
from typing import Optional

from vrun.checks.paths import short
from vrun.core.problems import CONTROL, Problem

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
# sbatch options that leave the plan's nodes, GPUs, tasks, time, environment and command as planned (sbatch(1));
# anything else (export, tres-per-task, gpus-per-socket, time-min, chdir, ...) is refused
SBATCH_ALLOWED = frozenset({
    "mail-type", "mail-user", "comment", "exclusive", "reservation", "nodelist", "exclude", "begin", "dependency",
    "kill-on-invalid-dep", "deadline", "licenses", "wckey", "nice", "priority", "hint", "switches", "gres",
    "gres-flags", "mem-per-gpu", "mem-per-cpu", "cpus-per-gpu", "gpu-bind", "gpu-freq", "network", "oversubscribe",
    "power", "profile", "propagate", "reboot", "tmp", "mcs-label", "prefer", "wait-all-nodes", "acctg-freq",
    "core-spec", "thread-spec", "cores-per-socket", "sockets-per-node", "threads-per-core", "container",
    "container-id", "clusters", "cluster-constraint", "spread-job", "delay-boot", "extra", "hold", "requeue",
    "no-requeue", "nv-mps", "bb", "bbf", "uid", "gid", "get-user-env", "x11", "mincpus", "contiguous",
    "distribution", "no-kill", "quiet", "verbose", "parsable", "test-only", "exclusive-user", "segment",
})
# of the allowed, those that change who runs the job or what it inherits: refused too
SBATCH_REFUSED_ANYWAY = {"uid": "the job runs as you", "gid": "the job runs as you",
                         "get-user-env": "the job's environment is the plan's (pass_env, env)",
                         "hold": "a held job never starts: submit with cluster.detach instead",
                         "test-only": "nothing would be submitted", "parsable": "the submitter reads sbatch's answer",
                         "no-requeue": "requeue is the plan's (cluster.max_requeues)",
                         "requeue": "requeue is the plan's (cluster.max_requeues)",
                         "quiet": "the submitter reads sbatch's answer", "verbose": "the submitter reads sbatch's "
                         "answer", "no-kill": "a lost node must end the job (the plan's nodes are all needed)",
                         "x11": "a batch job has no display"}
SETUP_KEYS = ("cluster.setup", "cluster.node_setup")
# control characters a shell line may hold: a tab is whitespace to bash
SETUP_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def check(resolved: dict, seen: Optional[set] = None) -> list:
    from vrun.core.dotted import get

    seen = set() if seen is None else seen
    out = []
    for key, allowed in SBATCH_KEYS.items():
        v = get(resolved, key, None)
        if key in seen or v is None:
            continue
        if not re.fullmatch(allowed, str(v)):
            out.append(Problem(key, short(v), "reaches sbatch.sh as an option value: one word of the "
                               "characters sbatch takes there" + (" (at most 128)" if key == "cluster.job_name" else ""),
                               f"{key}=<name>"))
    out += setup_problems(resolved, seen)
    extra = get(resolved, "cluster.additional_parameters", None) or {}
    if not isinstance(extra, dict):
        return out
    for k, v in extra.items():
        key, option = f"cluster.additional_parameters.{k}", str(k).replace("_", "-")
        if key in seen:
            continue
        owned = [o for o in SBATCH_OWNED if o.startswith(option)]  # sbatch takes any unambiguous prefix
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", str(k)) or CONTROL.search(str(v)):
            out.append(Problem(key, short(v), "becomes an #SBATCH line: a lower-case option name and a one-line "
                               "value", "cluster.additional_parameters.<option>=<value>"))
        elif owned:
            name = option if option in SBATCH_OWNED else owned[0]
            owner = SBATCH_OWNED[name]
            out.append(Problem(key, short(v), f"--{name} is decided by {owner}", f"drop {key}" + (
                f"; set {owner}" if owner.startswith(("cluster.", "mesh.")) else "")))
        elif option not in SBATCH_ALLOWED or option in SBATCH_REFUSED_ANYWAY:
            why = SBATCH_REFUSED_ANYWAY.get(option, "not among the sbatch options that leave the plan's nodes, "
                                            "GPUs, tasks, time, environment and command as planned")
            out.append(Problem(key, short(v), f"--{option}: {why}", f"drop {key} (allowed: mail-type, comment, "
                               "exclusive, reservation, nodelist, exclude, dependency, gres, ... — vrun/checks/sbatch.py "
                               "SBATCH_ALLOWED)"))
        elif option == "gres" and "gpu" in str(v):
            out.append(Problem(key, short(v), "the GPUs per node come from the mesh (--gpus-per-node)",
                               f"drop {key}; set mesh.gpus_per_node"))
        elif option == "cpus-per-gpu" and get(resolved, "cluster.cpus_per_task", None) is not None:
            out.append(Problem(key, short(v), "sbatch takes one of --cpus-per-task (cluster.cpus_per_task) and "
                               "--cpus-per-gpu", f"drop {key} or cluster.cpus_per_task"))
        elif option in ("mem-per-gpu", "mem-per-cpu") and (get(resolved, "cluster.mem_gb", None) is not None or
                                                          len({"mem-per-gpu", "mem-per-cpu"} & {
                                                              str(x).replace("_", "-") for x in extra}) > 1):
            out.append(Problem(key, short(v), "sbatch takes one of --mem (cluster.mem_gb), --mem-per-gpu, "
                               "--mem-per-cpu", f"drop {key} or the other memory option"))
    return out


def setup_problems(resolved: dict, seen: set) -> list:
    """Setup lines: strings, one line each, not #SBATCH options, valid bash (`bash -n`)."""
    from vrun.core.dotted import get

    out = []
    for key in SETUP_KEYS:
        lines = get(resolved, key, None) or []
        if not isinstance(lines, list):
            continue
        good = []
        for i, line in enumerate(lines):
            k = f"{key}[{i}]"
            if k in seen:
                continue
            if not isinstance(line, str):
                out.append(Problem(k, short(line), "a line of shell", f"{key}=['<command>']"))
            elif SETUP_CONTROL.search(line):
                out.append(Problem(k, "<control characters>", "a setup line with a control character (a newline "
                                   "would add a line to sbatch.sh)", f"give {k} on one line"))
            elif key == "cluster.setup" and re.match(r"\s*#\s*SBATCH", line):
                out.append(Problem(k, short(line), "sbatch would read it as an option of the job",
                                   "sbatch options go in +cluster.additional_parameters.<option>=<value>"))
            else:
                good.append((k, line))
        if good and not _bash_ok("\n".join(line for _, line in good)):
            for k, line in good:
                if not _bash_ok(line):
                    out.append(Problem(k, short(line), "not valid bash (`bash -n` refuses it): sbatch.sh would "
                                       "fail on the node", "fix the line's quotes or brackets"))
    return out


def _bash_ok(text: str) -> bool:
    try:
        p = subprocess.run(["bash", "-n"], input=text + "\n", capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return True  # no bash here: the node's bash judges it
    return p.returncode == 0


def expanded_path(path: str, key: str) -> list:
    """SLURM reads `%` in its log paths as a filename pattern (%j, %u, ...): a sweep or run dir holding one would
    put the job's files elsewhere."""
    if "%" in str(path):
        return [Problem(key, short(path), "holds '%', which SLURM expands in the job's file names (%j, %u, ...)",
                        f"{key}=<a path without '%'>")]
    return []

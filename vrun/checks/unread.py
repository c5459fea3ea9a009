"""Settings the chosen cluster or stall policy never reads: warned, as an entrypoint's unread settings are
(vrun.entrypoints.base.Entrypoint.run_problems), so a value typed for one cluster and planned on another is said,
not silently dropped.

READERS is the one record of which cluster's code reads which cluster.* knob: a knob it does not list is read on
every cluster (the plan's GPU part, its price, Ray's resources). tests/test_unread.py holds it to the code: each
listed knob is read in the modules of each cluster named, and in none of another cluster's.

Entry point: `problems(config)` on the typed run config (vrun.config.schema.RunConfig).
"""
from __future__ import annotations

from vrun.checks.paths import short
from vrun.core.problems import Problem

SLURM, LOCAL, RAY, KUBERAY = "slurm", "local", "ray", "kuberay"
# cluster.<knob> → the clusters whose code reads it
READERS = {
    # sbatch's values and submitit's (vrun.launch.slurm.submit.Submission, vrun.checks.sbatch)
    **{k: (SLURM,) for k in ("partition", "account", "qos", "constraint", "job_name", "setup",
                             "additional_parameters")},
    # a stall's requeues (a Ray job's watchdog counts them too: vrun.launch.raywatch; on KubeRay a requeue acts as
    # cancel, the cap still read), the deadline verl's pre-deadline save is given (vrun.launch.deadline)
    **{k: (SLURM, RAY, KUBERAY) for k in ("max_requeues", "signal_delay_s")},
    # a SLURM job's resources; a RayJob's pods' requests and limits (vrun.launch.kuberay)
    **{k: (SLURM, KUBERAY) for k in ("cpus_per_task", "mem_gb")},
    # the SLURM submitter's own behaviour: the confirmation, waiting, the login preflight, node-local storage
    **{k: (SLURM,) for k in ("confirm_gpu_hours", "yes", "login_preflight", "node_local_paths")},
    # restarts that make no progress stop where the next attempt starts: a SLURM job's node 0, a Ray job's requeue
    # (KubeRay's entry runs the same watchdog, whose requeue acts as cancel there, as max_requeues's does)
    "no_progress_attempts": (SLURM, RAY, KUBERAY),
    "detach": (SLURM, RAY),                 # the submitter returns at once instead of following the job
    "node_setup": (SLURM,),                 # each node's lines (vrun.launch.slurm.node)
    "time_min": (SLURM, RAY, KUBERAY),      # sbatch --time; a Ray job's end; the RayJob's activeDeadlineSeconds
    "master_port": (LOCAL,),                # torchrun's rendezvous on this machine (a SLURM job's comes from its id)
    "ray.interface": (SLURM,),              # the address each node gives Ray or torchrun
    "ray.join_timeout_s": (SLURM,),         # the head's wait for the job's nodes
    "ray.auth_mode": (SLURM,),              # RAY_AUTH_MODE of the job's own Ray cluster
    "ray.dashboard_timeout_s": (RAY,),      # every request to a standing cluster's dashboard
    "ray.address": (LOCAL, SLURM, RAY),     # ray.init's address; cluster=ray: the dashboard
    **{f"kuberay.{k}": (KUBERAY,) for k in ("image", "namespace", "claim", "mount_path", "env_from", "gpu_resource",
                                            "ttl_s", "apply", "run_as_uid", "run_as_gid")},
}
# the clusters whose jobs the watchdog watches (vrun.launch.watchdog: beside a local run, on a SLURM job's node 0, in
# a Ray job's own entry on a standing cluster and on KubeRay: vrun.launch.raywatch): the run.* stall knobs are read
# there only
WATCHED = (LOCAL, SLURM, RAY, KUBERAY)
STALL_KNOBS = ("on_stall", "stall_after_s", "stall_grace_s")
# the value each cluster group file gives a knob (conf/cluster/*.yaml), where it is not the schema's default
GROUP_VALUES = {"ray.address": {LOCAL: "local", SLURM: "auto", RAY: "auto", KUBERAY: "auto"}}


def _get(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _set(config, knob: str) -> bool:
    """Whether cluster.<knob> differs from what the cluster group gives it."""
    from vrun.config.schema import Cluster

    group = GROUP_VALUES.get(knob, {}).get(str(config.cluster.name))
    default = group if group is not None else _get(Cluster(), knob)
    return _get(config.cluster, knob) != default


def cluster_problems(config) -> list[Problem]:
    """cluster.* knobs set to other than their group's value on a cluster whose code never reads them."""
    name = str(config.cluster.name)
    sft = str(config.algo.entrypoint) == "sft"
    out = []
    for knob, readers in READERS.items():
        read = name in readers
        if knob == "master_port":
            read = read and sft  # only SFT's torchrun on this machine reads it
        if read or not _set(config, knob):
            continue
        v = _get(config.cluster, knob)
        where = " or ".join(f"cluster={r}" for r in readers)
        out.append(Problem(f"cluster.{knob}", v if not isinstance(v, (list, dict)) else short(str(v)),
                           f"read by {where}{' with algo=sft' if knob == 'master_port' else ''} only; this run "
                           f"(cluster={name}{', algo=sft' if sft else ''}) reads nothing of it",
                           f"drop cluster.{knob}, or {where.split(' or ')[0]}", warning=True))
    # Ray's resources: given to a fresh instance (ray.init with address local) or to a SLURM job's `ray start`;
    # ray.init refuses them when it joins a running cluster, so they are not passed there
    if not sft and name != SLURM and config.cluster.ray.address != "local" or name in (RAY, KUBERAY):
        for k in ("num_cpus", "num_gpus"):
            v = getattr(config.cluster.ray, k)
            if v is not None:
                out.append(Problem(f"cluster.ray.{k}", v, "Ray's resources for a fresh instance (cluster.ray.address="
                                   "local) or a SLURM job's nodes; this run joins a running cluster, whose nodes "
                                   "declare their own: read by nothing", f"drop cluster.ray.{k}, or "
                                   "cluster.ray.address=local", warning=True))
    return out


def policy_problems(config) -> list[Problem]:
    """Stall-policy settings the policy chosen never reads, and on a cluster whose jobs no watchdog watches, all of
    them."""
    from vrun.config.schema import RunSettings

    run, c = config.run, config.cluster
    if str(c.name) not in WATCHED:
        return [Problem(f"run.{k}", getattr(run, k), f"read by the watchdog, which watches cluster="
                        f"{' and cluster='.join(WATCHED)} jobs; a cluster={c.name} job is not watched: read by "
                        "nothing", f"drop run.{k}, or cluster=slurm", warning=True)
                for k in STALL_KNOBS if getattr(run, k) != getattr(RunSettings(), k)]
    out = []
    if str(c.name) in (SLURM, RAY) and str(run.on_stall) == "requeue" and c.max_requeues == 0:
        out.append(Problem("run.on_stall", "requeue", "cluster.max_requeues=0 allows no requeue: the first stall "
                           "cancels the run, as run.on_stall=cancel does", "cluster.max_requeues=<requeues, ≥ 1>, or "
                           "run.on_stall=cancel", warning=True))
    if str(run.on_stall) == "report" and run.stall_grace_s is not None:
        out.append(Problem("run.stall_grace_s", run.stall_grace_s, "the wait before a stall's cancel or requeue; "
                           "run.on_stall=report does neither: read by nothing", "drop run.stall_grace_s, or "
                           "run.on_stall=cancel|requeue", warning=True))
    return out


def problems(config) -> list[Problem]:
    return cluster_problems(config) + policy_problems(config)

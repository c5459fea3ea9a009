"""How a running job is watched (vrun.launch.watchdog runs it on node 0, or beside a local run): the seconds
without a verl step line after which it counts as stalled, the first step's longer allowance (the model loads and
the rollout engine starts first), and what a stall does. Pure arithmetic on the plan; plan.json's `watch`.

stall_after_s = run.stall_after_s, else max(STALL_FLOOR_S, STALL_FACTOR × the step estimate's high end) — a step
that takes three times the estimate's pessimistic end is not a slow step but a stuck one; with no estimate,
STALL_FALLBACK_S. The first step of an attempt adds the load: the node's share of the bf16 weights read at
LOAD_RATE plus ENGINE_START_S (Ray workers, the Megatron Lite model built, vLLM started and its CUDA graphs
captured, the first refit). Each phase of the step has its own bound too (vrun.planning.phase_bounds: plan.json
`watch.phases`), unless run.stall_after_s is set.
"""
from __future__ import annotations

from typing import Optional

from vrun.core.units import clock
from vrun.estimate.timelimit import SAVE_WRITE_RATE
from vrun.planning import phase_bounds
from vrun.rundir.record import WatchRecord

STALL_FACTOR = 3.0
STALL_FLOOR_S = 600.0
STALL_FALLBACK_S = 1800.0
# a conservative read rate per node from shared storage: the one the save is written at
LOAD_RATE = SAVE_WRITE_RATE
ENGINE_START_S = 600.0
# verl's default save_ckpt_duration (should_save_ckpt_esi's own default): what one save is taken to cost
VERL_SAVE_S = 60.0


def policy(run, step_high_s, params_total, nnodes: int, stacks: str = "", cluster: str = "",
           bands: Optional[dict] = None, save_s: Optional[float] = None) -> WatchRecord:
    """run: the run config's `run` group (vrun.config.schema.RunSettings); step_high_s: the plan's step high end
    (None without an estimate); params_total: the model's parameters (None when unknown); cluster: the cluster's
    name (a Ray job's stacks are taken otherwise: RAY_STACKS); bands: {phase: (low_s, high_s)} of the plan's step
    and save_s the save estimate, each phase's own bound (vrun.planning.phase_bounds) — none where
    run.stall_after_s is set: the user's bound is the one bound."""

    if run.stall_after_s is not None:
        stall, basis = float(run.stall_after_s), "run.stall_after_s"
    elif step_high_s:
        stall = max(STALL_FLOOR_S, STALL_FACTOR * float(step_high_s))
        basis = (f"{STALL_FACTOR:g} × the step's high end {step_high_s:,.0f} s" if stall > STALL_FLOOR_S else
                 f"the floor: {STALL_FACTOR:g} × the step's high end is only {STALL_FACTOR * step_high_s:,.0f} s")
    else:
        stall, basis = STALL_FALLBACK_S, "no step-time estimate"
    load = ENGINE_START_S + (2.0 * params_total / max(nnodes, 1) / LOAD_RATE if params_total else 0.0)
    grace = float(run.stall_grace_s) if run.stall_grace_s is not None else stall
    return WatchRecord(stall_after_s=round(stall, 1), first_step_s=round(stall + load, 1),
                       on_stall=str(run.on_stall), grace_s=round(grace, 1), basis=basis,
                       stacks=RAY_STACKS if cluster in RAY_CLUSTERS else stacks, cluster=str(cluster or ""),
                       phases=phase_bounds.plan_bounds(bands or {}, save_s) if run.stall_after_s is None else {})


def line(w: WatchRecord) -> str:
    """The plan table's row: what this cluster gets, never more."""
    ray = w.cluster in RAY_CLUSTERS
    act = {"report": "reported (the job keeps running)",
           "cancel": f"reported, then cancelled after {_t(w.grace_s)} more without a step" +
                     (" (the job ends itself)" if ray else ""),
           "requeue": f"reported, then after {_t(w.grace_s)} submitted again without the odd rank's node"}[w.on_stall]
    if w.on_stall == "requeue" and w.cluster == "ray":
        act = (f"reported, then after {_t(w.grace_s)} the job ends and is submitted again to the same cluster, "
               "resuming from the last whole checkpoint (a standing Ray cluster cannot leave the odd node out; "
               "cancelled instead where the nodes do not reach the run dir)")
    elif w.on_stall == "requeue" and w.cluster == "kuberay":
        act = (f"reported, then cancelled after {_t(w.grace_s)} more without a step: requeue acts as cancel on "
               "KubeRay (a pod cannot apply a RayJob; python -m vrun resubmit <run dir> from here)")
    where = ("stacks of every Ray node's processes of the job under <run dir>/stalls/ (under the job's working dir "
             "where the nodes do not reach the run dir, each event then also a `vrun: event` line in the job's log)"
             if ray else "stacks of every node under <run dir>/stalls/")
    each = (f"; each phase from an attempt's second step: {phase_bounds.watch_line(w.phases)}, then "
            f"{phase_bounds.RUN_FACTOR:g} × this run's median where longer" + (
                " (not on cluster=local: the job's Ray is verl's own, its state API unknown here)"
                if w.cluster == "local" else "")) if w.phases else ""
    return (f"watch   stalled after {_t(w.stall_after_s)} without a verl step ({w.basis}; the first step of an "
            f"attempt: {_t(w.first_step_s)}){each}; on a stall: {where}, {act}" + (f"; {w.stacks}" if w.stacks else ""))


def _t(s: float) -> str:
    return clock(s)


HOOK = "the process's own dump on SIGURG (faulthandler, vrun/launch/stackhook)"
RAY_CLUSTERS = ("ray", "kuberay")
# a Ray job's stacks: its processes found by Ray's state API, dumped by a task pinned to each node; the stack hook is
# not on a Ray job's path (PYTHONPATH does not travel), and the nodes' ptrace rules are not known from here
RAY_STACKS = ("stacks by py-spy on each node (the job's processes from Ray's state API, dumped by a task pinned to "
              "the node): py-spy must be installed there and allowed to attach (Yama ptrace_scope, SYS_PTRACE in a "
              "container), else a process is listed without its stack")


def attach_rule(has_py_spy: bool, scope: Optional[int], cap_sys_ptrace: bool) -> tuple[bool, str]:
    """Whether py-spy may attach to the run's processes, and why: the one rule the plan's `watch` row and the node's
    stall dump (vrun.launch.stacks) both follow. scope: Yama's ptrace_scope (None without Yama)."""
    if not has_py_spy:
        return False, "py-spy is not installed here (pip install py-spy)"
    if scope is None or scope == 0:
        return True, "no Yama ptrace restriction" if scope is None else "ptrace_scope 0"
    if cap_sys_ptrace and scope in (1, 2):
        return True, f"ptrace_scope {scope}, with CAP_SYS_PTRACE"
    if scope == 1:
        return True, ("ptrace_scope 1: py-spy is not the ranks' ancestor; each process names the node process its "
                      "ptracer through the stack hook")
    if scope == 2:
        return False, "ptrace_scope 2 without CAP_SYS_PTRACE forbids attaching"
    return False, f"ptrace_scope {scope} forbids attaching"


def stacks_line(has_py_spy: bool, scope: Optional[int], cap_sys_ptrace: bool) -> str:
    """How a stall's stacks will be taken, in one line (the plan's, judged on the planning machine: the nodes
    usually run the same kernel; the node's own dump says it again as it found it)."""
    ok, why = attach_rule(has_py_spy, scope, cap_sys_ptrace)
    return f"stacks by py-spy, live ({why}); where it is refused, {HOOK}" if ok else f"stacks by {HOOK}: {why}"

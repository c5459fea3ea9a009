"""The runs verbs on a cluster=kuberay run dir (one holding rayjob.yaml, vrun.launch.kuberay): the job is the
KubeRay operator's, reached with the user's kubectl and credentials.

rayjob.yaml is a record, not an instruction: the RayJob's name and namespace are the plan's (plan.json, recomputed
with vrun.launch.kuberay's own builder), and the file's `vrun/run-id` label must be the plan's run id before any
verb acts. `cancel` and `resubmit` with kubectl on PATH: the cluster's object must carry the run's id too, then
`kubectl delete` (cancel), or the manifest rebuilt from plan.json written and applied (resubmit); without kubectl,
the one pasteable command that does it. `logs` names its command. `status` and `runs` show the RayJob's status as
kubectl reports it (refresh), the run dir's otherwise. Every kubectl run is bounded (vrun.launch.kubectl.run) and
every command printed is shell-quoted.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from vrun.core import fs
from vrun.runs.common import Usage

VERBS = ("logs", "cancel", "resubmit")
# `status` and `runs` ask kubectl for at most this long in all (a listing never waits a whole kubectl timeout)
LIST_TIMEOUT_S = 10.0


def job_of(path: str) -> Optional[tuple]:
    """(run dir, plan record, rayjob.yaml's doc) where `path` is a cluster=kuberay run dir; None otherwise. Both
    files are read through the bounded reader (a FIFO, a link or another user's file is not a job)."""
    import yaml

    from vrun.launch.kuberay import MANIFEST
    from vrun.rundir.record import PlanRecord

    d = Path(path)
    if not fs.is_dir(d):
        return None
    text, _ = fs.read_checked(d / MANIFEST, 1 << 20, own=True)
    if text is None:
        return None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    record = PlanRecord.load(d)  # RunDirError: one line naming plan.json
    return (d, record, doc) if record.cluster == "kuberay" else None


def where(record) -> tuple[str, str]:
    """(namespace, name) of the run's RayJob, from the plan: the namespace by its grammar (a record read back is
    checked as the command line is), the name recomputed."""
    from vrun.launch import kuberay_schema as api
    from vrun.launch.kuberay import name_of

    ns = (record.cluster_group.get("kuberay") or {}).get("namespace", "default")
    why = api.name_why(ns, "label")
    if why:
        raise Usage(f"error: plan.json=cluster_group.kuberay.namespace: {fs_shown(ns)}: {why}; fix: plan the run "
                    "again")
    name = name_of(record.model.name, record.run_id)
    if len(name) > api.NAME_MAX or not api.NAME.match(name):
        raise Usage(f"error: plan.json=run_id: {fs_shown(record.run_id)}: the RayJob's name from it, "
                    f"{fs_shown(name)}, is not a Kubernetes name; fix: plan the run again")
    return ns, name


def fs_shown(v) -> str:
    from vrun.launch.kubectl import shown

    return shown(repr(v), 80)


def proven(d: Path, record, doc) -> tuple[str, str]:
    """The run's (namespace, name) once rayjob.yaml is shown to be the run's: its vrun/run-id label is the plan's
    run id, and the plan's is the run dir's own."""
    import os

    from vrun.launch.kuberay import RUN_ID_LABEL
    from vrun.rundir.records import run_id

    if record.run_id != run_id(str(d)) and os.path.realpath(d) != os.path.realpath(record.run_dir):
        raise Usage(f"error: run={d}: plan.json's run_id {fs_shown(record.run_id)} is not this run dir's; fix: plan "
                    "the run again (a plan.json copied from another run dir names that run)")
    labels = ((doc or {}).get("metadata") or {}).get("labels") if isinstance(doc, dict) and isinstance(
        doc.get("metadata"), dict) else None
    got = labels.get(RUN_ID_LABEL) if isinstance(labels, dict) else None
    if got != record.run_id[:63]:
        raise Usage(f"error: run={d}: rayjob.yaml's label {RUN_ID_LABEL} is {fs_shown(got)}, not the plan's run id "
                    f"{record.run_id}: not this run's manifest, nothing done; fix: plan the run again")
    return where(record)


def _cluster_check(d: Path, record, ns: str, name: str) -> tuple:
    """The cluster's RayJob of that name, proven the run's: (status or None when not found, "" or why kubectl
    could not say)."""
    from vrun.launch import kubectl

    st, why = kubectl.get_status(ns, name)
    if st is None:
        return None, ("" if why == "not found" else why)
    if st.run_id != record.run_id[:63]:
        raise Usage(f"error: run={d}: the cluster's RayJob {ns}/{name} carries {fs_shown(st.run_id)} as its run id, "
                    f"not this run's {record.run_id}: not this run's job, nothing done; fix: check it with "
                    f"{kubectl.command(['kubectl', 'get', 'rayjob', '-n', ns, name, '--show-labels'])}")
    return st, ""


def dispatch(a) -> Optional[int]:
    """A verb on a cluster=kuberay run dir: its exit code, or Usage with its one line; None to leave the verb to
    the other clusters."""
    from vrun.rundir import state

    if a.verb not in VERBS:
        return None
    paths = a.runs if a.verb == "cancel" else [a.run]
    found = [job_of(p) for p in paths]
    # applied RayJobs only: a plan that never was is the verbs' own answer for a plan
    ours = [f for f in found if f is not None and state.load(f[0]).state != "planned"]
    if not ours:
        return None
    if len(ours) != len(paths):
        raise Usage(f"error: runs={' '.join(paths)}: cluster=kuberay runs mixed with others; fix: cancel them apart")
    verb = {"logs": logs, "cancel": cancel, "resubmit": resubmit}[a.verb]
    codes = [verb(d, record, *proven(d, record, doc)) for d, record, doc in ours]
    return max(codes)


def logs(d: Path, record, ns: str, name: str) -> int:
    from vrun.launch.kubectl import command

    raise Usage(f"error: run={d}: a RayJob on Kubernetes (cluster=kuberay, {ns}/{name}): the operator runs it and "
                f"kubectl reaches it; fix: {command(['kubectl', 'logs', '-n', ns, 'job/' + name])} (the job's "
                "driver; -f follows it)")


def cancel(d: Path, record, ns: str, name: str) -> int:
    import shutil

    from vrun.launch import kubectl
    from vrun.rundir import records

    delete = ["kubectl", "delete", "rayjob", "-n", ns, name]
    if shutil.which("kubectl") is None:
        raise Usage(f"error: run={d}: a RayJob on Kubernetes (cluster=kuberay, {ns}/{name}) and no kubectl on PATH "
                    f"here; fix: {kubectl.command(delete)}")
    st, why = _cluster_check(d, record, ns, name)
    if why:
        raise Usage(f"error: run={d}: {why}; nothing was cancelled; fix: {kubectl.command(delete)} where kubectl "
                    "reaches the cluster")
    if st is None:
        print(f"run {d}: the cluster has no RayJob {ns}/{name}: nothing to stop", flush=True)
        return 0
    got = kubectl.run(delete[1:], kubectl.TIMEOUT_S)
    if got.code != 0:
        raise Usage(f"error: run={d}: `{kubectl.command(delete)}`: {kubectl.said(got)}; fix: run it again where "
                    "kubectl reaches the cluster")
    records.record(str(d), "cancelled", attempt=0, cluster="kuberay", rayjob=name)
    print(f"cancelled RayJob {ns}/{name} ({st.line()}): {d}", flush=True)
    return 0


def resubmit(d: Path, record, ns: str, name: str) -> int:
    """The plan's RayJob again: the manifest rebuilt from plan.json (never the file as found), written over
    rayjob.yaml, and applied where kubectl is on PATH (an ended RayJob of the same name deleted first)."""
    import shutil

    import yaml

    from vrun.core import writer
    from vrun.core.problems import Problem
    from vrun.launch import kubectl
    from vrun.launch import kuberay
    from vrun.rundir import records

    job = kuberay.job_of_record(record)
    doc = kuberay.manifest(job)
    wrong = kuberay.schema_problems(doc)
    if wrong:
        raise Usage(wrong[0].line())
    path = d / kuberay.MANIFEST
    writer.write_text(path, yaml.safe_dump(doc, sort_keys=False), root=str(d))
    delete, apply = ["kubectl", "delete", "rayjob", "-n", ns, name], ["kubectl", "apply", "-n", ns, "-f", str(path)]
    if shutil.which("kubectl") is None:
        raise Usage(f"error: run={d}: a RayJob on Kubernetes (cluster=kuberay, {ns}/{name}) and no kubectl on PATH "
                    f"here; the plan's manifest is written again in {path}; fix: {kubectl.command(delete)} && "
                    f"{kubectl.command(apply)}")
    st, why = _cluster_check(d, record, ns, name)
    if why:
        raise Usage(f"error: run={d}: {why}; nothing was applied; fix: {kubectl.command(delete)} && "
                    f"{kubectl.command(apply)} where kubectl reaches the cluster")
    if st is not None and not st.ended:
        raise Usage(f"error: run={d}: RayJob {ns}/{name} is {st.state} ({st.line()}); fix: python -m vrun cancel "
                    f"{kubectl.command([str(d)])} first")
    if st is not None:
        got = kubectl.run(delete[1:], kubectl.TIMEOUT_S)
        if got.code != 0:
            raise Usage(f"error: run={d}: `{kubectl.command(delete)}`: {kubectl.said(got)}; nothing was applied; "
                        f"fix: {kubectl.command(delete)} && {kubectl.command(apply)}")
    ok, said = kuberay.apply(path, ns)
    if not ok:
        raise Usage(Problem("run", str(d), f"{said}; the plan's manifest is in {path}, nothing was applied",
                            f"{kubectl.command(apply)} where kubectl reaches the cluster").line())
    records.record(str(d), "submitted", attempt=0, cluster="kuberay", rayjob=name)
    print(f"applied RayJob {ns}/{name} again ({said}): {d}", flush=True)
    return 0


def refresh(runs: list) -> dict:
    """cluster=kuberay rows of `status` and `runs`: each applied RayJob's status from kubectl (bounded; kubectl on
    PATH), proven the run's by its label; a run cancelled with `vrun cancel` stays cancelled; kubectl that cannot
    say leaves the run dir's state and says why. Returns {run dir: the RayJob's line} for those kubectl answered."""
    import shutil

    from vrun.launch import kubectl

    import time

    said: dict = {}
    if shutil.which("kubectl") is None:
        return said
    end, stuck = time.monotonic() + LIST_TIMEOUT_S, ""
    for r in runs:
        plan = getattr(r, "plan", None)
        if getattr(plan, "cluster", None) != "kuberay" or r.state in ("planned", "cancelled") or not r.attempts:
            continue
        try:
            ns, name = where(plan)
        except Usage:
            continue
        left = end - time.monotonic()
        if stuck or left <= 0:  # one bound for the whole listing: kubectl is not asked again once it hung
            r.reason = f"RayJob {ns}/{name}: kubectl not asked ({stuck or f'{LIST_TIMEOUT_S:g} s spent on others'})"
            continue
        st, why = kubectl.get_status(ns, name, left)
        if "did not end within" in why:
            stuck = "it did not answer for another run"
        if st is None:
            r.reason = f"RayJob {ns}/{name}: " + ("not found on the cluster (deleted?)" if why == "not found" else why)
            r.phase = r.phase or r.reason
            continue
        if st.run_id != plan.run_id[:63]:
            r.reason = f"RayJob {ns}/{name} on the cluster is not this run's (run id {kubectl.shown(st.run_id, 24)})"
            continue
        r.state, r.phase = st.state, f"RayJob {st.line()}"
        if r.state == "pending":
            r.reason = r.phase
        said[str(r.dir)] = f"{ns}/{name}: {st.line()}"
    return said

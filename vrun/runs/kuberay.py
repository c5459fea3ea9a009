"""The runs verbs on a cluster=kuberay run dir (one holding rayjob.yaml, vrun.launch.kuberay): the job is the
KubeRay operator's, reached with the user's kubectl and credentials, so `logs`, `cancel` and `resubmit` say in one
line the kubectl command that does it; `status` and `runs` read the run dir as for any run."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from vrun.core import fs
from vrun.runs.common import Usage

VERBS = ("logs", "cancel", "resubmit")


def job_of(path: str) -> Optional[tuple]:
    """(run dir, name, namespace) where `path` is a cluster=kuberay run dir; None otherwise. rayjob.yaml is read
    through the bounded reader (a FIFO, a link or another user's file is not a job)."""
    import yaml

    from vrun.launch.kuberay import MANIFEST

    d = Path(path)
    if not fs.is_dir(d):
        return None
    text, _ = fs.read_checked(d / MANIFEST, 1 << 20, own=True)
    try:
        doc = yaml.safe_load(text) if text is not None else None
    except yaml.YAMLError:
        return None
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    ns = meta.get("namespace") if isinstance(meta.get("namespace"), str) else "default"
    return d, meta["name"], ns


def dispatch(a) -> Optional[int]:
    """Raises the one line for a verb on a cluster=kuberay run dir; None to leave the verb to the other clusters."""
    import shlex

    if a.verb not in VERBS:
        return None
    for path in (a.runs if a.verb == "cancel" else [a.run]):
        found = job_of(path)
        if found is None:
            continue
        d, name, ns = found
        from vrun.rundir import state

        if state.load(d).state == "planned":  # never applied: the verbs' own answer for a plan
            continue
        q = shlex.quote
        cmd = {"logs": f"kubectl logs -n {q(ns)} job/{q(name)} (the job's driver; -f follows it)",
               "cancel": f"kubectl delete rayjob -n {q(ns)} {q(name)}",
               "resubmit": f"kubectl delete rayjob -n {q(ns)} {q(name)}; kubectl apply -n {q(ns)} -f "
                           f"{q(str(d / 'rayjob.yaml'))}"}[a.verb]
        raise Usage(f"error: run={d}: a RayJob on Kubernetes (cluster=kuberay, {ns}/{name}): the operator runs it "
                    f"and kubectl reaches it; fix: {cmd}")
    return None

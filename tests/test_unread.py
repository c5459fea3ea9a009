"""Settings read by nothing on the chosen cluster or stall policy are warned (vrun.checks.unread), and the record of
which cluster reads which knob (READERS) is the code's: each listed knob is read in the modules of every cluster
it names and in none of another cluster's; a knob it does not list is read outside any one cluster's modules."""
import re
from dataclasses import fields

import pytest

from conftest import ROOT, compose

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

# a Ray job's own entry and its watchdog, on a standing cluster and on KubeRay alike
RAY_JOB = [ROOT / "vrun/launch/entry.py", ROOT / "vrun/launch/raywatch.py"]
# each cluster's own code: what reads a knob only when that cluster runs
MODULES = {"slurm": [*sorted((ROOT / "vrun/launch/slurm").glob("*.py")), ROOT / "vrun/checks/sbatch.py"],
           "kuberay": [ROOT / "vrun/launch/kuberay.py", ROOT / "vrun/launch/kuberay_schema.py",
                       ROOT / "vrun/launch/kuberay_checks.py", *RAY_JOB],
           "ray": [ROOT / "vrun/launch/rayjobs.py", ROOT / "vrun/runs/rayjobs.py", *RAY_JOB],
           "local": [ROOT / "vrun/launch/local.py", ROOT / "vrun/entrypoints/sft.py"]}
# code every cluster's plan runs (the plan, the estimates, the entrypoints' trees, preflight)
SHARED = [p for d in ("vrun/planning", "vrun/estimate", "vrun/launch/preflight.py", "vrun/entrypoints/ppo.py")
          for p in ([ROOT / d] if d.endswith(".py") else sorted((ROOT / d).glob("*.py")))]


def _reads(paths, knob: str) -> bool:
    """Whether the code reads cluster.<knob>: an attribute or key of that name (the last part of the knob). A loop
    over the group's fields that skips one (`if f.name == "interface" and …: continue`) reads none."""
    last = knob.split(".")[-1]
    rx = re.compile(rf"\.{re.escape(last)}\b|\[[\"']{re.escape(last)}[\"']\]|\"{re.escape(last)}\"")
    skip = re.compile(r"if f\.name == \"\w+\" and ")
    return any(rx.search(line) for p in paths for line in p.read_text().splitlines() if not skip.search(line))


def _knobs():
    from vrun.config.schema import Cluster, KubeRayCfg, RayCfg

    out = [f.name for f in fields(Cluster) if f.name not in ("name", "ray", "kuberay")]
    return out + [f"ray.{f.name}" for f in fields(RayCfg)] + [f"kuberay.{f.name}" for f in fields(KubeRayCfg)]


@pytest.mark.parametrize("knob", _knobs())
def test_the_readers_record_is_the_codes(knob):
    from vrun.checks.unread import READERS

    if knob not in READERS:  # read on every cluster: by the code they share
        assert _reads(SHARED, knob), f"cluster.{knob}: no shared reader; list its clusters in READERS"
        return
    for cluster, paths in MODULES.items():
        if cluster in READERS[knob]:
            assert _reads(paths, knob), f"cluster.{knob}: READERS says {cluster} reads it; its modules do not"
        else:
            assert not _reads(paths, knob), f"cluster.{knob}: {cluster}'s modules read it; READERS says they do not"


def test_the_watched_clusters_are_the_codes():
    """The stall knobs are read by the watchdog: the clusters whose modules start it are WATCHED."""
    from vrun.checks.unread import WATCHED

    for cluster, paths in MODULES.items():
        starts = any("watchdog" in p.read_text() for p in paths)
        assert starts == (cluster in WATCHED), cluster


def _lines(overrides):
    from vrun.checks import values
    from vrun.config import schema

    return [p.line() for p in values.run_config(schema.typed(compose(["model=qwen3_5_35b", "mode=plan", *overrides])))]


@pytest.mark.parametrize("case", [
    (["cluster.max_requeues=5"], "warning: cluster.max_requeues=5: read by cluster=slurm or cluster=ray or "
     "cluster=kuberay only"),
    (["cluster.partition=debug"], "warning: cluster.partition=debug: read by cluster=slurm only"),
    (["cluster.time_min=30"], "warning: cluster.time_min=30: read by cluster=slurm or cluster=ray or cluster=kuberay"),
    (["cluster=kuberay", "cluster.ray.dashboard_timeout_s=3"], "warning: cluster.ray.dashboard_timeout_s=3"),
    (["cluster=slurm", "cluster.kuberay.namespace=ml"], "warning: cluster.kuberay.namespace=ml: read by cluster=kuberay"),
    (["cluster.master_port=29600"], "warning: cluster.master_port=29600: read by cluster=local with algo=sft only"),
    (["cluster=slurm", "run.on_stall=requeue", "cluster.max_requeues=0"], "warning: run.on_stall=requeue: "
     "cluster.max_requeues=0 allows no requeue"),
    (["run.on_stall=report", "run.stall_grace_s=60"], "warning: run.stall_grace_s=60.0: "),
    (["cluster=ray", "cluster.ray.num_cpus=8"], "warning: cluster.ray.num_cpus=8: Ray's resources for a fresh"),
    (["cluster.ray.address=auto", "cluster.ray.num_gpus=8"], "warning: cluster.ray.num_gpus=8: Ray's resources"),
    (["cluster=ray", "run.on_stall=requeue", "cluster.max_requeues=0"], "warning: run.on_stall=requeue: "
     "cluster.max_requeues=0 allows no requeue"),
], ids=lambda c: " ".join(c[0]))
def test_an_unread_knob_is_warned(case):
    overrides, start = case
    lines = _lines(overrides)
    assert any(x.startswith(start) for x in lines), lines
    assert not [x for x in lines if x.startswith("error: ")], lines


@pytest.mark.parametrize("overrides", [
    ["cluster=slurm", "cluster.max_requeues=5", "cluster.partition=debug", "cluster.time_min=30"],
    ["cluster=kuberay", "cluster.time_min=30", "cluster.kuberay.namespace=ml"],
    ["cluster=ray", "cluster.ray.dashboard_timeout_s=3"],
    ["cluster=ray", "run.on_stall=requeue", "run.stall_after_s=600", "cluster.max_requeues=2", "cluster.time_min=60"],
    ["cluster=kuberay", "run.stall_after_s=600", "run.on_stall=report"],
    ["algo=sft", "mesh=8gpu", "cluster.master_port=29600"],
    ["cluster=slurm", "run.on_stall=requeue", "cluster.max_requeues=1"],
    ["cluster.ray.num_cpus=8", "cluster.ray.num_gpus=8"],
    ["cluster=slurm", "cluster.ray.num_cpus=8"],
    ["algo=sft", "mesh=8gpu", "cluster=slurm", "cluster.ray.interface=ib0"],
    [],
], ids=lambda o: " ".join(o) or "defaults")
def test_a_read_knob_is_not_warned(overrides):
    """Legal beside them: each knob on a cluster that reads it; the cluster groups' own values."""
    assert not [x for x in _lines(overrides) if "reads nothing of it" in x or "allows no requeue" in x or
                "read by nothing" in x]


@pytest.mark.parametrize("overrides,passed", [
    (["cluster.ray.num_cpus=8"], True), (["cluster.ray.address=auto", "cluster.ray.num_cpus=8"], False),
    (["cluster=slurm", "cluster.ray.num_cpus=8"], False), (["cluster=ray", "cluster.ray.num_cpus=8"], False)])
def test_ray_resources_reach_ray_init_only_for_a_fresh_instance(overrides, passed):
    """ray.init refuses num_cpus/num_gpus when it joins a running cluster (Ray 2.60: "When connecting to an
    existing cluster, num_cpus and num_gpus must not be provided"): verl's tree holds them only with address=local."""
    from conftest import plan
    from vrun.core.dotted import get

    p = plan(["model=qwen3_5_35b", "mode=plan", *overrides])
    assert (get(p.verl, "ray_kwargs.ray_init.num_cpus", None) == 8) == passed

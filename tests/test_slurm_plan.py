"""cluster=slurm without a cluster: what would be submitted, the confirmation rule, the login-node guard."""
import json

import pytest

from conftest import runner

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml


def test_plan_shows_the_submission(tmp_path):
    """mode=plan cluster=slurm: launcher parameters from the mesh, GPU-hours, the sbatch script; no submission."""
    proc = runner("model=glm5_1", "cluster=slurm", "cluster.partition=gpu", "cluster.time_min=120", "mode=plan",
                  f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0, proc.stderr
    assert "32 node(s) × 8 GPU(s), 120 min, partition gpu: 512.0 GPU-hours" in proc.stdout
    (d,) = [p for p in (tmp_path / "s").iterdir()]
    plan = json.loads((d / "plan.json").read_text())
    assert plan["slurm"]["parameters"]["nodes"] == 32 and plan["slurm"]["parameters"]["gpus_per_node"] == 8
    assert plan["slurm"]["gpu_hours"] == 512.0
    script = (d / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=32" in script and "#SBATCH --partition=gpu" in script and "#SBATCH --signal=USR2@120" in script
    assert "#SBATCH --ntasks-per-node=1" in script


def test_launcher_overrides_win(tmp_path):
    """hydra.launcher.* given by hand wins over the cluster group's value."""
    proc = runner("model=qwen3_5_35b", "cluster=slurm", "hydra.launcher.partition=debug", "mode=plan",
                  f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0 and "partition debug" in proc.stdout


def test_big_submission_needs_a_yes(tmp_path):
    """Above cluster.confirm_gpu_hours a non-interactive submission stops (one line) unless cluster.yes=true."""
    proc = runner("model=glm5_1", "cluster=slurm", "cluster.confirm_gpu_hours=100", "mode=train",
                  "cluster.login_preflight=false", "cluster.node_local_paths=[]", "run.allow_memory_overrun=true",
                  f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 2 and "error: cluster.yes=False: 1024 GPU-hours exceed" in proc.stderr
    assert not list((tmp_path / "s").glob(".submitit"))


def test_the_design_cards_launcher_choice_is_the_slurm_cluster(tmp_path):
    """`python runner.py -m hydra/launcher=submitit_slurm model=glm5_1 mesh=256gpu algo=grpo` plans exactly as
    cluster=slurm does (the same sbatch job), and never trains here."""
    common = ["model=glm5_1", "mesh=256gpu", "algo=grpo", "mode=plan"]
    a = runner("-m", "hydra/launcher=submitit_slurm", *common, f"hydra.sweep.dir={tmp_path}/a")
    b = runner("-m", "cluster=slurm", *common, f"hydra.sweep.dir={tmp_path}/b")
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-1500:] + b.stderr[-1500:]
    pa, pb = (json.loads(next((tmp_path / d).glob("*/plan.json")).read_text()) for d in "ab")
    folder = lambda p: {k: v for k, v in p["slurm"].items() if k != "submitit_folder"}  # noqa: E731 - under its dir
    assert pa["cluster"] == "slurm" and folder(pa) == folder(pb)
    from vrun.config.overrides import with_cluster_of_launcher as w
    assert w(["hydra/launcher=submitit_slurm"]) == ["hydra/launcher=submitit_slurm", "cluster=slurm"]
    assert w(["hydra/launcher=submitit_slurm", "cluster=local"]) == ["hydra/launcher=submitit_slurm", "cluster=local"]
    assert w(["hydra/launcher=submitit_slurm,vrun_local"]) == ["hydra/launcher=submitit_slurm,vrun_local"]
    assert w(["hydra/launcher=vrun_ray"])[-1] == "cluster=ray" and w(["model=glm5_1"]) == ["model=glm5_1"]


def one_error_line(stderr: str) -> str:
    """The one `error: ...; fix: ...` line of a refused point (the sweep prefixes it with the point)."""
    lines = [line for line in stderr.splitlines() if "error: " in line]
    assert len(lines) == 1 and "; fix: " in lines[0] and "Traceback" not in stderr, stderr
    return lines[0]


def _sbatch(tmp_path, *overrides):
    proc = runner("model=qwen3_5_35b", "cluster=slurm", "mode=plan", f"hydra.sweep.dir={tmp_path}/s", *overrides)
    scripts = list((tmp_path / "s").glob("*/sbatch.sh"))
    return proc, scripts[0].read_text() if scripts else ""


def test_launcher_values_land_on_their_cluster_knobs(tmp_path):
    """hydra.launcher.* given by hand sets the cluster knob it names (one home per sbatch value): it shows in the
    plan's config, passes the same checks, and the launcher's own options without a knob reach sbatch as given."""
    proc, script = _sbatch(tmp_path, "hydra.launcher.timeout_min=30", "hydra.launcher.exclude=node7",
                           "hydra.launcher.setup=[module load cuda]", "cluster.setup=[source env.sh]",
                           "hydra.launcher.name=nightly")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --time=30" in script and "#SBATCH --exclude=node7" in script
    assert "#SBATCH --job-name=nightly" in script
    assert script.index("module load cuda") < script.index("source env.sh")
    (d,) = (tmp_path / "s").iterdir()
    cluster = json.loads((d / "manifest.json").read_text())["config"]["cluster"]
    assert cluster["time_min"] == 30 and cluster["job_name"] == "nightly"


def test_launcher_values_the_mesh_decides_are_refused(tmp_path):
    """nodes/GPUs given to the launcher that disagree with the mesh would submit a job the plan was not made for."""
    for override, knob in (("hydra.launcher.nodes=3", "mesh.nnodes=3"), ("hydra.launcher.gpus_per_node=4",
                                                                          "mesh.gpus_per_node=4"),
                           ("hydra.launcher.tasks_per_node=8", "one task per node")):
        proc, script = _sbatch(tmp_path, override)
        assert proc.returncode == 2 and not script, override
        line = one_error_line(proc.stderr)
        assert override in line and knob in line, line
    proc, _ = _sbatch(tmp_path, "hydra.launcher.nodes=1")  # agrees with the mesh
    assert proc.returncode == 0, proc.stderr


def test_launcher_values_are_checked_like_the_knobs(tmp_path):
    """A launcher value reaches an #SBATCH line: the same one-word rule as cluster.*; a job array is refused."""
    for override, key in (("hydra.launcher.partition='gpu --wrap=x'", "hydra.launcher.partition=gpu --wrap=x"),
                          ("+cluster.additional_parameters.tasks-per-node=8", "one task per node"),
                          ("+cluster.additional_parameters.gpus-per-n=2", "--gpus-per-node is decided by"),
                          ("cluster.cpus_per_task=8|hydra.launcher.cpus_per_gpu=2", "--cpus-per-task"),
                          ("hydra.launcher.array_parallelism=4", "hydra.launcher.array_parallelism"),
                          ("hydra.launcher.stderr_to_stdout=true", "hydra.launcher.stderr_to_stdout"),
                          ("hydra.launcher.partion=gpu", "hydra.launcher.partition=gpu"),
                          ("hydra.launcher.additional_parameters.mail-type=END",
                           "+cluster.additional_parameters.mail-type=END"),
                          ("hydra.launcher.signal_delay_s=-1", "hydra.launcher.signal_delay_s=-1"),
                          ("hydra.launcher.timeout_min=-5", "hydra.launcher.timeout_min=-5"),
                          ("hydra.launcher.signal_delay_s=20000", "the requeue signal would come at the start"),
                          ("hydra.launcher.comment='a\n#SBATCH --x=y'", "hydra.launcher.comment=<control"),
                          ("hydra.launcher.setup=['#SBATCH --nodes=9']", "hydra.launcher.setup[0]"),
                          ("+cluster.additional_parameters.nodes=4", "--nodes is decided by mesh.nnodes"),
                          ("+hydra.launcher.additional_parameters.time=9999", "--time is decided by cluster.time_min"),
                          ("+cluster.additional_parameters.output=/etc/x", "--output is decided by the job's logs"),
                          ("hydra.launcher.gres=gpu:4", "mesh.gpus_per_node"),
                          ("cluster.mem_gb=10|hydra.launcher.mem_per_gpu=4G", "sbatch takes one of --mem"),
                          ("cluster.partition=a|hydra.launcher.partition=b", "one value, two places"),
                          ("hydra/launcher=submitit_local", "the project's launchers only"),
                          ("hydra.launcher.submitit_folder=/tmp/elsewhere/%j", "outside the sweep dir")):
        proc, script = _sbatch(tmp_path, *override.split("|"))
        assert proc.returncode == 2 and not script and "Traceback" not in proc.stderr, override
        assert key in one_error_line(proc.stderr), proc.stderr


def test_launcher_values_keep_secrets_out(tmp_path, monkeypatch):
    """A secret reaching sbatch through the launcher is refused as it is through the knobs: interpolated, typed
    as the value, or on a setup line; it appears nowhere (stderr, files)."""
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue123")
    for override in ("hydra.launcher.partition='x${oc.env:HF_TOKEN}'", "hydra.launcher.comment=hf_secretvalue123",
                     "hydra.launcher.setup=['echo ${oc.env:HF_TOKEN}']", "hydra.launcher.name='${oc.env:HF_TOKEN}'",
                     "+hydra.launcher.additional_parameters.comment='${oc.env:HF_TOKEN}'"):
        proc, script = _sbatch(tmp_path, override)
        assert proc.returncode == 2 and not script, override
        assert "hydra.launcher." in one_error_line(proc.stderr) and "hf_secretvalue123" not in proc.stderr + proc.stdout


def test_launcher_values_in_a_sweep_and_the_folder(tmp_path):
    """A launcher override holds for every point of a sweep; the job's folder inside the sweep dir is the one
    the script names (quoted, absolute: the script is submitit's own)."""
    proc = runner("-m", "model=qwen3_5_35b,deepseek_v4_flash", "cluster=slurm", "mode=plan", "hydra.launcher.exclude=n9",
                  f"hydra.sweep.dir={tmp_path}/s", f"hydra.launcher.submitit_folder={tmp_path}/s/logs/%j")
    assert proc.returncode == 0, proc.stderr
    scripts = [p.read_text() for p in (tmp_path / "s").glob("*/sbatch.sh")]
    assert len(scripts) == 2 and all("#SBATCH --exclude=n9" in x for x in scripts)
    assert all(f"-m submitit.core._submit {tmp_path}/s/logs/%j" in x for x in scripts)
    plan = json.loads(next((tmp_path / "s").glob("*/plan.json")).read_text())
    assert plan["slurm"]["max_num_timeout"] == 3 and plan["slurm"]["submitit_folder"] == f"{tmp_path}/s/logs/%j"


def test_saved_submission_reads_back_both_forms():
    """slurm_job.json's "spec" is read back by `resubmit`: the submitit parameters written now, and the
    field-per-knob form older run dirs hold, give the same sbatch parameters."""
    from vrun.launch.slurm.submit import Submission

    old = {"nodes": 2, "gpus_per_node": 8, "tasks_per_node": 1, "cpus_per_task": None, "mem_gb": 64,
           "timeout_min": 90, "partition": "gpu", "account": None, "qos": None, "constraint": None, "setup": ["x"],
           "additional_parameters": {}, "max_num_timeout": 3, "signal_delay_s": 120, "name": "job"}
    sub = Submission.load(old)
    assert sub.max_num_timeout == 3 and sub.gpu_hours == 2 * 8 * 90 / 60
    assert sub.parameters == {"nodes": 2, "gpus_per_node": 8, "ntasks_per_node": 1, "mem": "64GB", "time": 90,
                              "partition": "gpu", "setup": ["x"], "additional_parameters": {},
                              "signal_delay_s": 120, "job_name": "job"}
    assert Submission.load(sub.saved()) == sub


def test_the_node_reads_the_cluster_group_typed():
    """The job carries the cluster group as plain values; each node types it again with the schema (a job pickled
    by an older vrun, without newer fields, gets the schema's defaults for them)."""
    import dataclasses

    from vrun.config.schema import Cluster, ClusterName
    from vrun.launch.slurm.node import cluster_of

    c = Cluster(name=ClusterName.slurm, node_setup=["module load x"])
    c.ray.join_timeout_s = 42
    assert cluster_of(dataclasses.asdict(c)) == c
    old = dataclasses.asdict(c)
    del old["job_name"], old["ray"]["auth_mode"]
    typed = cluster_of(old)
    assert typed.job_name is None and typed.ray.auth_mode == "disabled" and typed.ray.join_timeout_s == 42


def test_plan_needs_no_slurm_on_this_machine(tmp_path):
    """mode=plan cluster=slurm writes the script where no SLURM client is installed (a laptop); a value quoted
    by submitit (a comment with a space) stays one option; the launcher pointing at its own knob (the old
    conf/cluster/slurm.yaml wiring) is no value given."""
    import os

    from conftest import PY

    env = dict(os.environ, PATH=os.path.dirname(PY))  # no srun, no sbatch
    proc = runner("model=qwen3_5_35b", "cluster=slurm", "mode=plan", f"hydra.sweep.dir={tmp_path}/s",
                  "hydra.launcher.comment='nightly run'", "hydra.launcher.timeout_min=${cluster.time_min}",
                  "cluster.time_min=90", env=env)
    assert proc.returncode == 0, proc.stderr
    script = next((tmp_path / "s").glob("*/sbatch.sh")).read_text()
    assert "#SBATCH --comment='nightly run'" in script and "#SBATCH --time=90" in script


def test_node_control_files(tmp_path, monkeypatch):
    """The node's control dir is per job, attempt and SLURM restart (a requeue by SLURM itself reruns the same
    attempt); what a node publishes appears whole; a failure is seen by the others, not by itself."""
    from types import SimpleNamespace

    from conftest import record_json
    from vrun.launch.slurm.job import RunJob
    from vrun.launch.slurm.node import Node
    from vrun.rundir import record

    data = record_json(tmp_path, mode="train", cluster="slurm")
    data["mesh"].update(gpus_per_node=4, nnodes=2)  # the same 8 ranks on two nodes (world = nodes × GPUs)
    (tmp_path / "plan.json").write_text(json.dumps(data))
    job = RunJob(str(tmp_path), data["run_id"], 1)
    plan = job.plan()
    assert plan.mesh.gpus_per_node == 4 and plan == record.PlanRecord.load(tmp_path)
    env = SimpleNamespace(job_id="77", node=1, hostnames=["n0", "n1"], num_nodes=2)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert Node.open(job, plan, env, 0.0).ctl.name == "job-77-1"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    node = Node.open(job, plan, env, 0.0)
    assert node.ctl.name == "job-77-1-r2" and node.gpus == 4
    node.publish("head", "10.0.0.1:20000")
    assert [p.name for p in node.ctl.iterdir()] == ["head"] and node.wait_for("head") == "10.0.0.1:20000"
    node.fail("boom")
    assert node.failure() is None and not node.released()
    other = Node(job, plan, SimpleNamespace(**{**vars(env), "node": 0}), node.ctl, 0.0, node.cluster)
    assert other.failure().endswith(": boom")


def test_the_node_and_the_local_launch_start_children_alike(tmp_path, monkeypatch):
    """Both launchers build the child environment in one place (vrun.launch.environment): the plan's variables
    set, its unset ones and ROCR/HIP (CUDA_VISIBLE_DEVICES is set) dropped, the run id exported; the node adds
    only its attempt and its own extras."""
    from types import SimpleNamespace

    from conftest import record_json
    from vrun.launch import local
    from vrun.launch.slurm.job import RunJob
    from vrun.launch.slurm.node import Node

    data = record_json(tmp_path, mode="train", cluster="slurm")
    data["env"], data["env_unset"] = {"VRUN_TEST_SET": "1", "PYTHONPATH": "/mlite:/vrun"}, ["VRUN_TEST_DROP"]
    (tmp_path / "plan.json").write_text(json.dumps(data))
    job = RunJob(str(tmp_path), data["run_id"], 2)
    plan = job.plan()
    for k, v in {"CUDA_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0",
                 "VRUN_TEST_DROP": "x", "VRUN_TEST_KEEP": "y", "PYTHONPATH": "/mine"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    node = Node.open(job, plan, SimpleNamespace(job_id="7", node=0, hostnames=["n0"], num_nodes=1), 0.0)
    on_node = node.environ({"RAY_ADDRESS": "10.0.0.1:20000"})
    here = local.child_env(SimpleNamespace(env=plan.env, env_unset=plan.env_unset, run_dir=str(tmp_path)))
    assert {k: on_node[k] for k in ("VRUN_ATTEMPT", "RAY_ADDRESS")} == {"VRUN_ATTEMPT": "2",
                                                                         "RAY_ADDRESS": "10.0.0.1:20000"}
    assert {k: v for k, v in on_node.items() if k not in ("VRUN_ATTEMPT", "RAY_ADDRESS")} == here
    assert here["VRUN_RUN_ID"] == data["run_id"] and here["VRUN_TEST_SET"] == "1" and here["VRUN_TEST_KEEP"] == "y"
    assert here["VRUN_RESUME_CHECKED"] == "1"  # both checked the checkpoint before the command: the entry does not
    assert here["PYTHONPATH"] == "/mlite:/vrun"  # the plan's, which already ends with the planner's own
    assert not {"ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "VRUN_TEST_DROP"} & set(here)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert node.environ({})["ROCR_VISIBLE_DEVICES"] == "0"  # decided where the children start

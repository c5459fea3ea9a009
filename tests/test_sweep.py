"""--multirun: every point is planned and checked before the first runs."""
from pathlib import Path

from conftest import runner, without_mlite


def test_invalid_point_stops_the_sweep(tmp_path):
    """One bad point: nothing runs, nothing is written, the point is named."""
    proc = runner("-m", "model=glm5_1,kimi_k2_6", "mesh.cp=8,3", "mode=plan", f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "2 of 4 point(s) do not plan; nothing was run" in proc.stderr
    assert any(line.startswith("point 1 [model=glm5_1 mesh.cp=3") for line in proc.stderr.splitlines())
    assert not Path(tmp_path / "s").exists()


def test_plan_sweep_writes_every_point(tmp_path):
    """A valid 4-point plan sweep writes each point's plan, verl config and manifest."""
    # dist_opt's estimate is over 80 GiB for both models: planned with run.allow_memory_overrun
    proc = runner("-m", "model=glm5_1,kimi_k2_6", "optimizer=fsdp2,dist_opt", "mode=plan", "run.allow_memory_overrun=true",
                  f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0, proc.stderr
    dirs = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert dirs == ["0_glm5_1_grpo_fsdp2", "1_glm5_1_grpo_dist_opt", "2_kimi_k2_6_grpo_fsdp2",
                    "3_kimi_k2_6_grpo_dist_opt"]
    for d in dirs:
        assert {p.name for p in (tmp_path / "s" / d).iterdir()} == {"plan.json", "verl_config.yaml", "manifest.json"}


def test_model_path_for_several_models(tmp_path):
    """MODEL_PATH alone with several models planned is an error, not one checkpoint for all."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.endswith("MODEL_PATH")}
    env["MODEL_PATH"] = "/ckpt/one"
    proc = runner("-m", "model=glm5_1,kimi_k2_6", "mode=plan", f"hydra.sweep.dir={tmp_path}/s", env=env)
    assert proc.returncode == 2 and "MODEL_PATH=/ckpt/one" in proc.stderr and "GLM5_1_MODEL_PATH" in proc.stderr
    single = runner("model=glm5_1", "mode=plan", f"hydra.run.dir={tmp_path}/r", env=env)
    assert single.returncode == 0 and "/ckpt/one  [MODEL_PATH]" in single.stdout


def test_local_launcher_runs_checked_points(tmp_path):
    """Past the checks, points go to the local launcher, which runs them by mode one after the other (here:
    preflight, which fails without verl_mlite in reach): the first failing point ends the sweep with its error."""
    proc = runner("-m", "model=qwen3_5_35b,glm5_1", "mode=preflight", f"hydra.sweep.dir={tmp_path}/s",
                  env=without_mlite())
    assert "2 point(s) planned and checked; launching" in proc.stdout
    assert proc.returncode == 2 and "error: MLITE_ROOT=" in proc.stderr
    first, second = tmp_path / "s" / "0_qwen3_5_35b_grpo_fsdp2", tmp_path / "s" / "1_glm5_1_grpo_fsdp2"
    assert (first / "plan.json").exists() and not second.exists()
    # nothing but the run's own files: no payload is left for a job to load
    assert sorted(p.name for p in first.iterdir()) == ["manifest.json", "plan.json", "progress.jsonl",
                                                       "verl_config.yaml"]


def test_one_point_sweep_prints_its_table(tmp_path):
    """A sweep of one point (-m with hydra.sweep.dir) lands in the sweep dir and prints the plan's table, as a run
    does; a run (no sweep syntax) lands in hydra.run.dir."""
    proc = runner("-m", "model=qwen3_5_35b", "mode=plan", f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0, proc.stderr
    assert f"run dir {tmp_path}/s/0_qwen3_5_35b_grpo_fsdp2" in proc.stdout and "memory  per GPU" in proc.stdout
    run = runner("model=qwen3_5_35b", "mode=plan", f"hydra.run.dir={tmp_path}/r")
    assert run.returncode == 0 and f"run dir {tmp_path}/r\n" in run.stdout


def test_sweep_points_equal_single_runs(tmp_path):
    """The sweeper composes once per set of group choices and applies value overrides with Hydra's own
    logic: each point's verl config equals a plain run with the same overrides."""
    import yaml

    proc = runner("-m", "model=glm5_1,qwen3_5_35b", "verl.trainer.save_freq=5,10", "mode=plan",
                  f"hydra.sweep.dir={tmp_path}/s")
    assert proc.returncode == 0, proc.stderr
    for d, ov in (("1_glm5_1_grpo_fsdp2", ["model=glm5_1", "verl.trainer.save_freq=10"]),
                  ("2_qwen3_5_35b_grpo_fsdp2", ["model=qwen3_5_35b", "verl.trainer.save_freq=5"])):
        single = runner(*ov, "mode=plan", f"hydra.run.dir={tmp_path}/{d}-single")
        assert single.returncode == 0, single.stderr
        a = yaml.safe_load((tmp_path / "s" / d / "verl_config.yaml").read_text())
        b = yaml.safe_load((tmp_path / f"{d}-single" / "verl_config.yaml").read_text())
        for c in (a, b):
            c["trainer"].pop("default_local_dir")
        assert a == b


def test_typed_from_the_resolved_containers_equals_omegaconf(tmp_path):
    """A sweep builds each point's typed config from its resolved containers (vrun.config.schema.typed with
    resolved=...): the same objects, enums included, as OmegaConf.to_object, for every model, algorithm,
    optimizer and cluster; a missing value still fails through OmegaConf."""
    import itertools

    import pytest
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    from conftest import ROOT
    from vrun.config import schema

    GlobalHydra.instance().clear()
    n = 0
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        for model, algo, opt, cluster in itertools.product(
                ["glm5_1", "kimi_k2_6", "deepseek_v4_flash", "deepseek_v4_pro", "qwen3_5_35b"], ["grpo", "dapo", "sft"],
                ["fsdp2", "dist_opt"], ["local", "slurm"]):
            cfg = compose(config_name="run", overrides=[f"model={model}", f"algo={algo}", f"optimizer={opt}",
                                                        f"cluster={cluster}"])
            fast = schema.typed(cfg, OmegaConf.to_container(cfg, resolve=True))
            assert fast == schema.typed(cfg), (model, algo, opt, cluster)
            assert type(fast.mode) is schema.Mode and type(fast.model.weights) is schema.WeightFormats
            n += 1
        cfg.model.tp_allowed = "???"
        with pytest.raises(MissingMandatoryValue):
            schema.typed(cfg, OmegaConf.to_container(cfg, resolve=True))
    GlobalHydra.instance().clear()
    assert n == 60


def _tree(d: Path) -> dict:
    """Every file under a sweep dir, as text, with the sweep dir's own path written as <sweep>."""
    return {str(p.relative_to(d)): p.read_text().replace(str(d), "<sweep>") for p in sorted(d.rglob("*"))
            if p.is_file()}


def test_forked_planning_writes_what_one_process_writes(tmp_path):
    """A sweep planned on forked workers (vrun_sweeper.workers) writes the same files and prints the same lines
    as one process: 3 workers over 4 group sets, points split across them, parent included."""
    import os

    args = ["-m", "model=glm5_1,kimi_k2_6", "optimizer=fsdp2,dist_opt", "verl.trainer.save_freq=5,10,20",
            "mode=plan", "run.allow_memory_overrun=true"]
    out = {}
    for n in ("1", "3"):
        env = {**os.environ, "VRUN_PLAN_WORKERS": n, "VRUN_STATE_DIR": str(tmp_path / f"state{n}")}
        proc = runner(*args, f"hydra.sweep.dir={tmp_path}/w{n}", env=env)
        assert proc.returncode == 0, proc.stderr
        assert "planning worker" not in proc.stderr, proc.stderr  # the workers planned: none was taken back
        out[n] = (proc.stdout.replace(str(tmp_path / f"w{n}"), "<sweep>"), _tree(tmp_path / f"w{n}"))
    assert len(out["1"][1]) == 12 * 3
    one, many = out["1"][1], out["3"][1]
    assert sorted(one) == sorted(many)
    for name in one:  # the run id is the run dir's (another sweep dir here), the manifest's time its own
        if name.endswith(".json"):
            import json

            a, b = json.loads(one[name]), json.loads(many[name])
            for m in (a, b):
                m.pop("created", None), m.pop("run_id", None)
            assert a == b, name
        else:
            assert one[name] == many[name], name
    assert out["1"][0] == out["3"][0]


def test_forked_planning_refuses_as_one_process(tmp_path):
    """A bad point in a worker's part: the same refusal lines, and nothing written."""
    import os

    args = ["-m", "model=glm5_1,kimi_k2_6", "mesh.cp=8,3", "verl.trainer.save_freq=5,10", "mode=plan"]
    lines = {}
    for n in ("1", "2"):
        proc = runner(*args, f"hydra.sweep.dir={tmp_path}/w{n}", env={**os.environ, "VRUN_PLAN_WORKERS": n})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "4 of 8 point(s) do not plan; nothing was run" in proc.stderr
        assert not (tmp_path / f"w{n}").exists()
        lines[n] = proc.stderr
    assert lines["1"] == lines["2"]


def test_plan_workers_must_be_a_count(tmp_path):
    """Refused for a sweep and for a run alike, before anything is written."""
    import os

    for bad, where in (("0", "-m"), ("two", "-m"), ("-1", "-m"), ("1.5", "-m"), ("²", "-m"), ("x", "")):
        args = ["-m", "model=glm5_1,kimi_k2_6", f"hydra.sweep.dir={tmp_path}/s"] if where else \
            ["model=glm5_1", f"hydra.run.dir={tmp_path}/s"]
        proc = runner(*args, "mode=plan", env={**os.environ, "VRUN_PLAN_WORKERS": bad})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith(f"error: VRUN_PLAN_WORKERS='{bad}'"), proc.stderr
        assert "; fix: " in proc.stderr and not (tmp_path / "s").exists()


def test_a_tree_composed_in_a_worker_is_kept(tmp_path):
    """The worker planning the SFT points composes verl's sft_trainer tree; the parent keeps it in the state dir
    with its own (ppo_trainer), as one process would."""
    import os

    for n in ("1", "2"):
        env = {**os.environ, "VRUN_PLAN_WORKERS": n, "VRUN_STATE_DIR": str(tmp_path / f"state{n}")}
        proc = runner("-m", "model=qwen3_5_35b", "algo=grpo,sft", "verl.trainer.save_freq=5,10", "mode=plan",
                      f"hydra.sweep.dir={tmp_path}/s{n}", env=env)
        assert proc.returncode == 0, proc.stderr
        assert "planning worker" not in proc.stderr, proc.stderr  # the worker composed it, not the runner
    kept = [sorted(p.name for p in (tmp_path / f"state{n}" / "cache").glob("verl-tree-*.json")) for n in "12"]
    assert len(kept[0]) == 2 and kept[0] == kept[1]


def test_points_sharing_a_dir_are_named_by_their_numbers(tmp_path):
    """The points that would share a run dir are named by their point numbers, whatever order they were planned in
    (the workers take the points by group set)."""
    import os

    for n in ("1", "2"):
        proc = runner("-m", "model=kimi_k2_6,glm5_1", "verl.trainer.save_freq=1,2", "mode=plan",
                      "hydra.sweep.subdir=${model.name}", f"hydra.sweep.dir={tmp_path}/s{n}",
                      env={**os.environ, "VRUN_PLAN_WORKERS": n})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "error: hydra.sweep.subdir=kimi_k2_6: points 0 and 1 share one run dir" in proc.stderr, proc.stderr


def test_a_typed_subdir_may_interpolate_the_job_number(tmp_path):
    """hydra.sweep.subdir typed on the command line with ${hydra.job.num} (as conf/run.yaml's own default does):
    resolved per point, not when the sweep reads its overrides."""
    proc = runner("-m", "model=glm5_1,kimi_k2_6", "mode=plan", f"hydra.sweep.dir={tmp_path}/s",
                  "hydra.sweep.subdir=x_${hydra.job.num}_${model.name}")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["x_0_glm5_1", "x_1_kimi_k2_6"]

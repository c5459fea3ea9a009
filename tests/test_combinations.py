"""Every model × algo × optimizer plans on the model's default mesh, against the real verl tree."""
import itertools

import pytest

from conftest import MODELS, PATH_ENV, VERL_VERSION, plan, problems_of, verl_has

ALGOS = ["grpo", "dapo", "sft"]
OPTIMIZERS = ["fsdp2", "dist_opt"]


@pytest.mark.parametrize("model,algo,optimizer", list(itertools.product(MODELS, ALGOS, OPTIMIZERS)))
def test_every_combination_plans(model, algo, optimizer, tmp_path, monkeypatch):
    """All 30 combinations plan with a memory estimate (DAPO: where the installed verl has dynamic sampling); the
    mesh, optimizer and model path reach verl's config."""
    monkeypatch.setenv(PATH_ENV[model], str(tmp_path / "ckpt"))
    if algo == "dapo" and not verl_has("filter_groups"):
        # a verl without dynamic sampling: refused in one line naming the verl, what it lacks and the fix
        lines = problems_of([f"model={model}", f"algo={algo}", f"optimizer={optimizer}", "mode=plan"],
                            run_dir=str(tmp_path / "r"))
        assert len(lines) == 1 and lines[0].startswith("error: algo=dapo: ") and VERL_VERSION in lines[0] \
            and "algorithm.filter_groups" in lines[0] and "fix: install verl main" in lines[0], lines
        return
    # the memory verdicts are tests/test_memory.py's and test_rollout.py's subject: here the estimates over 80 GiB
    # (the dist_opt configs, DeepSeek-V4-Pro under RL) plan with run.allow_memory_overrun, and Pro's rollout gets a
    # replica that holds its weights (the deepseek launcher's TP8 cannot)
    extra = ["run.allow_memory_overrun=true"]
    if model == "deepseek_v4_pro" and algo != "sft":
        extra += ["verl.actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                  "+verl.actor_rollout_ref.rollout.data_parallel_size=16"]
    p = plan([f"model={model}", f"algo={algo}", f"optimizer={optimizer}", "mode=plan"] + extra,
             run_dir=str(tmp_path / "r"))
    eng = p.verl["engine"] if algo == "sft" else p.verl["actor_rollout_ref"]["actor"]["engine"]
    assert (eng["tp"], eng["pp"], eng["cp"], eng["ep"], eng["etp"], eng["vpp"]) == \
        (p.mesh.tp, p.mesh.pp, p.mesh.cp, p.mesh.ep, p.mesh.etp, 1)
    assert eng["impl_cfg"]["optimizer"] == optimizer and eng["model_name"] == p.config.model.mlite_name
    model_path = p.verl["model"]["path"] if algo == "sft" else p.verl["actor_rollout_ref"]["model"]["path"]
    assert model_path == str(tmp_path / "ckpt")
    assert p.verl["trainer"]["default_local_dir"] == f"{tmp_path}/r/checkpoints"
    assert p.memory is not None and (p.memory.rollout_detail is None) == (algo == "sft")

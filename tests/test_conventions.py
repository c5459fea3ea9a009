"""hooks.check_conventions: the real conf/ passes, and each rule catches a violation planted in a copy of it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hooks.check_conventions import check

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

ROOT = Path(__file__).resolve().parents[1]
MESH_8 = {"nnodes": 1, "gpus_per_node": 8, "tp": 1, "pp": 1, "vpp": 1, "ep": 8, "etp": 1, "cp": 8}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the real conf/ under tmp_path, to plant violations in."""
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    return tmp_path


def write(root: Path, rel: str, data: dict, header: str = "") -> None:
    (root / rel).write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def read(root: Path, rel: str) -> dict:
    return yaml.safe_load((root / rel).read_text(encoding="utf-8"))


def edit_model(root: Path, stem: str, fn) -> None:
    """Apply fn to conf/model/<stem>.yaml's data and write it back under its `# @package _global_` header."""
    data = read(root, f"conf/model/{stem}.yaml")
    fn(data)
    write(root, f"conf/model/{stem}.yaml", data, header="# @package _global_\n")


def lines_for(root: Path, rel: str) -> list[str]:
    return [line for line in check(root) if line.startswith(f"{rel}: ")]


def run_cli(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hooks.check_conventions", "--root", str(root)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


# the real repository ---------------------------------------------------------------------------------------

def test_real_repo_passes():
    """The committed conf/ breaks no convention."""
    assert check(ROOT) == []


def test_unchanged_copy_passes(repo):
    """A plain copy of conf/ passes, so every other test's finding comes from its planted violation."""
    assert check(repo) == []


def test_imports_no_hydra_or_verl():
    """Importing the check pulls in neither Hydra, OmegaConf nor verl (it must stay fast)."""
    code = ("import sys, hooks.check_conventions; "
            "print([m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf', 'verl', 'torch')])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# rule 1: mesh preset names and fields ----------------------------------------------------------------------

def test_mesh_name_disagreeing_with_gpu_count(repo):
    """A 64gpu preset holding 16×8 GPUs is reported with the arithmetic."""
    write(repo, "conf/mesh/64gpu.yaml", {**read(repo, "conf/mesh/128gpu.yaml")})
    assert lines_for(repo, "conf/mesh/64gpu.yaml") == [
        "conf/mesh/64gpu.yaml: name says 64 GPUs but nnodes×gpus_per_node = 16×8 = 128"]


def test_mesh_name_without_gpu_count(repo):
    """A preset not named <N>gpu[_suffix] is reported."""
    write(repo, "conf/mesh/single_node.yaml", MESH_8)
    assert any("name must be <N>gpu or <N>gpu_<suffix>" in line
               for line in lines_for(repo, "conf/mesh/single_node.yaml"))


def test_mesh_name_with_suffix_passes(repo):
    """<N>gpu_<suffix> is a valid preset name when N matches."""
    write(repo, "conf/mesh/8gpu_cp4_dp2.yaml", {**MESH_8, "cp": 4})
    assert check(repo) == []


def test_auto_mesh_name_is_exempt(repo):
    """A preset named auto is exempt from the <N>gpu name rule."""
    write(repo, "conf/mesh/auto.yaml", {**MESH_8, "nnodes": 2, "search": True})
    assert check(repo) == []


def test_auto_mesh_must_search(repo):
    """mesh=auto without search: true would silently plan its placeholder mesh."""
    write(repo, "conf/mesh/auto.yaml", {**MESH_8, "nnodes": 2})
    assert any("search: true" in line for line in lines_for(repo, "conf/mesh/auto.yaml"))


def test_search_field_only_in_auto(repo):
    """Only mesh=auto may carry search."""
    write(repo, "conf/mesh/8gpu_s.yaml", {**MESH_8, "search": True})
    assert any("unknown field(s) search" in line for line in lines_for(repo, "conf/mesh/8gpu_s.yaml"))


def test_mesh_missing_field(repo):
    """A preset without cp is reported as lacking it."""
    write(repo, "conf/mesh/8gpu_nocp.yaml", {k: v for k, v in MESH_8.items() if k != "cp"})
    assert any("lacks cp" in line for line in lines_for(repo, "conf/mesh/8gpu_nocp.yaml"))


def test_mesh_unknown_field(repo):
    """A preset setting a derived value (dp) is reported as an unknown field."""
    write(repo, "conf/mesh/8gpu_dp.yaml", {**MESH_8, "dp": 1})
    assert any("unknown field(s) dp" in line for line in lines_for(repo, "conf/mesh/8gpu_dp.yaml"))


def test_mesh_field_not_positive_int(repo):
    """A preset with tp: 0 is reported."""
    write(repo, "conf/mesh/8gpu_tp0.yaml", {**MESH_8, "tp": 0})
    assert lines_for(repo, "conf/mesh/8gpu_tp0.yaml") == [
        "conf/mesh/8gpu_tp0.yaml: tp must be a positive integer, got 0"]


# rule 2: every mesh preset serves some model ----------------------------------------------------------------

def test_mesh_valid_for_no_model(repo):
    """A preset no model can run (EP3 on 8 GPUs) is reported."""
    write(repo, "conf/mesh/8gpu_ep3.yaml", {**MESH_8, "ep": 3})
    assert any("valid for no model option" in line for line in lines_for(repo, "conf/mesh/8gpu_ep3.yaml"))


# rule 3: model options ------------------------------------------------------------------------------------

def test_model_without_global_package(repo):
    """A model file without `# @package _global_` is reported."""
    write(repo, "conf/model/glm5_1.yaml", read(repo, "conf/model/glm5_1.yaml"))
    assert any("# @package _global_" in line for line in lines_for(repo, "conf/model/glm5_1.yaml"))


def test_model_package_after_other_comment(repo):
    """A `# @package _global_` below another comment is not a header (Hydra ignores it) and is reported."""
    path = repo / "conf/model/glm5_1.yaml"
    path.write_text("# GLM-5.1\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
    assert any("# @package _global_" in line for line in lines_for(repo, "conf/model/glm5_1.yaml"))


def test_model_name_differs_from_stem(repo):
    """model.name that is not the file stem is reported."""
    edit_model(repo, "glm5_1", lambda d: d["model"].update(name="glm5"))
    assert lines_for(repo, "conf/model/glm5_1.yaml") == [
        "conf/model/glm5_1.yaml: model.name is 'glm5' but the file is glm5_1.yaml (they must match)"]


def test_model_unknown_mlite_name(repo):
    """An mlite_name that is not a Megatron Lite model family is reported."""
    edit_model(repo, "glm5_1", lambda d: d["model"].update(mlite_name="glm4"))
    assert any("mlite_name is 'glm4'" in line for line in lines_for(repo, "conf/model/glm5_1.yaml"))


def test_model_missing_path_env(repo):
    """A model without path_env is reported."""
    edit_model(repo, "glm5_1", lambda d: d["model"].pop("path_env"))
    assert any("model.path_env" in line for line in lines_for(repo, "conf/model/glm5_1.yaml"))


def test_model_missing_tp_allowed(repo):
    """A model without tp_allowed is reported."""
    edit_model(repo, "glm5_1", lambda d: d["model"].pop("tp_allowed"))
    assert any("model.tp_allowed" in line for line in lines_for(repo, "conf/model/glm5_1.yaml"))


def test_model_missing_etp_allowed(repo):
    """A model without etp_allowed is reported."""
    edit_model(repo, "glm5_1", lambda d: d["model"].pop("etp_allowed"))
    assert any("model.etp_allowed" in line for line in lines_for(repo, "conf/model/glm5_1.yaml"))


def test_model_arch_missing_hidden(repo):
    """A model whose arch lacks hidden is reported."""
    edit_model(repo, "glm5_1", lambda d: d["model"]["arch"].pop("hidden"))
    assert any("model.arch.hidden" in line for line in lines_for(repo, "conf/model/glm5_1.yaml"))


def test_deepseek_v4_without_o_groups(repo):
    """A deepseek_v4 model without arch.o_groups is reported."""
    edit_model(repo, "deepseek_v4_flash", lambda d: d["model"]["arch"].pop("o_groups"))
    assert any("model.arch.o_groups" in line for line in lines_for(repo, "conf/model/deepseek_v4_flash.yaml"))


def test_model_without_mesh_override(repo):
    """A model whose defaults pick no mesh is reported."""
    edit_model(repo, "glm5_1", lambda d: d.update(defaults=[x for x in d["defaults"] if isinstance(x, str)]))
    assert any("exactly one `override /mesh: <preset>`, found 0" in line
               for line in lines_for(repo, "conf/model/glm5_1.yaml"))


def test_model_with_two_mesh_overrides(repo):
    """A model whose defaults pick two meshes is reported."""
    edit_model(repo, "glm5_1", lambda d: d["defaults"].append({"override /mesh": "8gpu"}))
    assert any("exactly one `override /mesh: <preset>`, found 2" in line
               for line in lines_for(repo, "conf/model/glm5_1.yaml"))


def test_model_default_mesh_file_missing(repo):
    """A model whose default mesh has no conf/mesh file is reported."""
    edit_model(repo, "glm5_1", lambda d: d["defaults"].__setitem__(1, {"override /mesh": "1024gpu"}))
    assert lines_for(repo, "conf/model/glm5_1.yaml") == [
        "conf/model/glm5_1.yaml: default mesh 1024gpu: conf/mesh/1024gpu.yaml does not exist"]


def test_model_default_mesh_invalid(repo):
    """A model whose default mesh breaks its Megatron Lite rules (GLM-5.1 at TP2) is reported."""
    write(repo, "conf/mesh/16gpu_tp2.yaml", {**MESH_8, "nnodes": 2, "tp": 2, "cp": 1})
    edit_model(repo, "glm5_1", lambda d: d["defaults"].__setitem__(1, {"override /mesh": "16gpu_tp2"}))
    found = lines_for(repo, "conf/model/glm5_1.yaml")
    assert len(found) == 1 and found[0].startswith(
        "conf/model/glm5_1.yaml: default mesh 16gpu_tp2 fails for glm5_1: mesh.tp=2")


def test_model_default_mesh_rollout_tp_invalid(repo):
    """A launcher rollout TP that does not divide DeepSeek-V4-Flash's 8 o_groups is reported."""
    path = repo / "conf/launcher/deepseek_v4.yaml"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("tensor_model_parallel_size: 8", "tensor_model_parallel_size: 16"), encoding="utf-8")
    found = lines_for(repo, "conf/model/deepseek_v4_flash.yaml")
    assert len(found) == 1 and "rollout TP 16" in found[0] and "o_groups" in found[0]


# rule 4: launcher files -----------------------------------------------------------------------------------

def test_orphan_launcher(repo):
    """A launcher file no model includes is reported."""
    write(repo, "conf/launcher/unused.yaml", {"recipe": {"ppo": {}}}, header="# @package _global_\n")
    assert len(lines_for(repo, "conf/launcher/unused.yaml")) == 1


def test_model_without_launcher(repo):
    """A model that includes no launcher file is reported."""
    edit_model(repo, "qwen3_5_35b", lambda d: d["defaults"].pop(0))
    assert any("exactly one launcher file" in line and "found 0" in line
               for line in lines_for(repo, "conf/model/qwen3_5_35b.yaml"))


def test_model_with_two_launchers(repo):
    """A model that includes two launcher files is reported."""
    edit_model(repo, "glm5_1", lambda d: d["defaults"].insert(0, "/launcher/qwen3_5_35b"))
    assert any("exactly one launcher file" in line and "found 2" in line
               for line in lines_for(repo, "conf/model/glm5_1.yaml"))


def test_model_includes_missing_launcher(repo):
    """A model that includes a launcher file that does not exist is reported."""
    edit_model(repo, "glm5_1", lambda d: d["defaults"].__setitem__(0, "/launcher/glm5"))
    assert any("conf/launcher/glm5.yaml does not exist" in line for line in lines_for(repo, "conf/model/glm5_1.yaml"))


# rule 5: names of the other options -----------------------------------------------------------------------

def test_misnamed_algo(repo):
    """An algo file whose algo.name is not its stem is reported."""
    data = read(repo, "conf/algo/grpo.yaml")
    data["algo"]["name"] = "ppo"
    write(repo, "conf/algo/grpo.yaml", data, header="# @package _global_\n")
    assert lines_for(repo, "conf/algo/grpo.yaml") == [
        "conf/algo/grpo.yaml: algo.name is 'ppo' but the file is grpo.yaml (they must match)"]


def test_algo_unknown_entrypoint(repo):
    """An algo file whose entrypoint is neither ppo nor sft is reported."""
    data = read(repo, "conf/algo/grpo.yaml")
    data["algo"]["entrypoint"] = "dpo"
    write(repo, "conf/algo/grpo.yaml", data, header="# @package _global_\n")
    assert any("algo.entrypoint is 'dpo'" in line for line in lines_for(repo, "conf/algo/grpo.yaml"))


def test_misnamed_optimizer(repo):
    """An optimizer file whose name is not its stem is reported."""
    write(repo, "conf/optimizer/fsdp2.yaml", {"name": "dist_opt"})
    assert any("name is 'dist_opt' but the file is fsdp2.yaml" in line
               for line in lines_for(repo, "conf/optimizer/fsdp2.yaml"))


def test_unknown_optimizer(repo):
    """An optimizer option Megatron Lite does not have is reported."""
    write(repo, "conf/optimizer/adamw.yaml", {"name": "adamw"})
    assert any("not a Megatron Lite optimizer" in line for line in lines_for(repo, "conf/optimizer/adamw.yaml"))


def test_misnamed_cluster(repo):
    """A cluster file whose name is not its stem is reported."""
    write(repo, "conf/cluster/slurm.yaml", {**read(repo, "conf/cluster/slurm.yaml"), "name": "local"})
    assert any("name is 'local' but the file is slurm.yaml" in line
               for line in lines_for(repo, "conf/cluster/slurm.yaml"))


def test_misnamed_data(repo):
    """A data file whose data.name is not its stem is reported."""
    data = read(repo, "conf/data/gsm8k.yaml")
    data["data"]["name"] = "gsm"
    write(repo, "conf/data/gsm8k.yaml", data, header="# @package _global_\n")
    assert any("data.name is 'gsm' but the file is gsm8k.yaml" in line
               for line in lines_for(repo, "conf/data/gsm8k.yaml"))


# rule 6: file names ---------------------------------------------------------------------------------------

def test_option_file_name_with_uppercase_and_dash(repo):
    """An option file named outside [a-z0-9_]+.yaml is reported."""
    write(repo, "conf/data/Big-Math.yaml", {"data": {"name": "Big-Math"}}, header="# @package _global_\n")
    assert lines_for(repo, "conf/data/Big-Math.yaml") == [
        "conf/data/Big-Math.yaml: option file name must match [a-z0-9_]+\\.yaml"]


def test_option_file_with_yml_suffix(repo):
    """A .yml option file (which Hydra never loads) is reported."""
    write(repo, "conf/cluster/lsf.yml", {"name": "lsf"})
    assert len(lines_for(repo, "conf/cluster/lsf.yml")) == 1


def test_unparsable_yaml(repo):
    """An option file that is not valid YAML is reported, not raised."""
    (repo / "conf/cluster/broken.yaml").write_text("name: [unclosed\n", encoding="utf-8")
    assert any("not valid YAML" in line for line in lines_for(repo, "conf/cluster/broken.yaml"))


# the command line -----------------------------------------------------------------------------------------

def test_cli_exits_0_on_real_repo():
    """`python -m hooks.check_conventions` on the repository prints nothing and exits 0."""
    proc = subprocess.run([sys.executable, "-m", "hooks.check_conventions"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "")


def test_cli_exits_1_on_violation(repo):
    """The command exits 1 and prints the violation's line when one is planted."""
    write(repo, "conf/mesh/64gpu.yaml", read(repo, "conf/mesh/128gpu.yaml"))
    proc = run_cli(repo)
    assert proc.returncode == 1
    assert "conf/mesh/64gpu.yaml: name says 64 GPUs but nnodes×gpus_per_node = 16×8 = 128" in proc.stdout.splitlines()

"""Shared helpers: compose the project's run config with Hydra, and plan it, in-process."""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vrun.config import schema  # noqa: E402

from hydra_plugins.vrun_launcher.vrun_launcher import register  # noqa: E402

register()

PY = sys.executable

# every run the tests plan is indexed here, never in the developer's own state dir (runner subprocesses inherit it)
os.environ["VRUN_STATE_DIR"] = tempfile.mkdtemp(prefix="vrun-test-state-")

# The three verls the suite knows and what each one has (measured: ../shared/stack/README.md).
#   filter_groups: algorithm.filter_groups in ppo_trainer.yaml (DAPO's dynamic sampling)
#   grad_offload:  EngineConfig declares grad_offload (so verl_mlite's MegatronLiteEngineConfig can be built)
VERL_VERSION = metadata.version("verl")
KNOWN_VERLS = {
    "0.9.1": {"filter_groups": True, "grad_offload": False},        # PyPI
    "0.9.0.dev0": {"filter_groups": False, "grad_offload": True},   # a6ef5009, the commit Megatron Lite pins
    "0.10.0.dev0": {"filter_groups": True, "grad_offload": True},   # main 1dda039b
}


def verl_has(feature: str) -> bool:
    """What the installed verl has; a test whose expectation depends on it skips on a verl the suite does not know."""
    if VERL_VERSION not in KNOWN_VERLS:
        pytest.skip(f"verl {VERL_VERSION} is not one of the verls this suite knows ({', '.join(KNOWN_VERLS)}): "
                    "what it has is not recorded")
    return KNOWN_VERLS[VERL_VERSION][feature]


def real_mlite_root() -> Path | None:
    """A real Megatron-LM checkout for the tests that compare with or build verl_mlite: MLITE_ROOT as users export
    it, or VRUN_TEST_MLITE_ROOT (a checkout the tests may use without the planner seeing it by default)."""
    for name in ("MLITE_ROOT", "VRUN_TEST_MLITE_ROOT"):
        root = os.environ.get(name)
        if root and (Path(root) / "experimental/lite/examples/verl/verl_mlite/__init__.py").is_file():
            return Path(root)
    return None


def mcore_root() -> Path | None:
    """VRUN_TEST_MCORE_ROOT: a folder holding a megatron/core with the CSA modules Megatron Lite's DeepSeek-V4 imports
    (Megatron-LM 43124b60's; the checkout's own d48bd6be moved them, no released megatron-core has them): put before
    the installed megatron-core for the oracle scripts."""
    root = os.environ.get("VRUN_TEST_MCORE_ROOT")
    ok = root and (Path(root) / "megatron/core/transformer/experimental_attention_variant/csa_cp_utils.py").is_file()
    return Path(root) if ok else None


def run_mlite_script(script: str, cases: list[dict], *, processes: int = 2, timeout: float = 900,
                     cuda_hidden: bool = True) -> list[dict]:
    """tests/support/<script> on the real Megatron Lite: the cases split over `processes` processes (each reads
    its cases as JSON on stdin and prints its results as the last JSON line), every process fed and read at once;
    the results in the cases' order."""
    from concurrent.futures import ThreadPoolExecutor

    lite = real_mlite_root() / "experimental" / "lite"
    path = ":".join([str(lite)] + ([str(mcore_root())] if mcore_root() else []))
    env = {"PYTHONPATH": path, "PATH": "/usr/bin:/bin", **({"CUDA_VISIBLE_DEVICES": ""} if cuda_hidden else {})}
    chunks = [cases[i::processes] for i in range(processes)]
    procs = [subprocess.Popen([PY, "-W", "ignore", str(ROOT / "tests" / "support" / script)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT) for _ in chunks]
    # one after the other, the second would wait for its input until the first ended
    with ThreadPoolExecutor(len(procs)) as pool:
        done = list(pool.map(lambda pc: pc[0].communicate(json.dumps(pc[1]), timeout=timeout), zip(procs, chunks)))
    merged: list = [None] * len(cases)
    for i, (proc, (out, err)) in enumerate(zip(procs, done)):
        assert proc.returncode == 0, err[-3000:]
        merged[i::processes] = json.loads(out.strip().splitlines()[-1])
    return merged


needs_real_mlite = pytest.mark.skipif(
    real_mlite_root() is None, reason="no Megatron-LM checkout: set MLITE_ROOT or VRUN_TEST_MLITE_ROOT to one "
    "(branch dev; ../shared/stack has a tarball) to compare with the real verl_mlite")


def without_mlite(env: dict | None = None) -> dict:
    """The environment with no real verl_mlite in reach (the record path every new user starts on)."""
    return {k: v for k, v in (os.environ if env is None else env).items()
            if not k.startswith("MLITE") and k != "VRUN_TEST_MLITE_ROOT"}


def needs_dapo() -> None:
    """Skip a test of DAPO's own settings where the installed verl has no dynamic sampling (planning refuses
    algo=dapo there: tests/test_combinations.py asserts that refusal)."""
    if not verl_has("filter_groups"):
        pytest.skip(f"verl {VERL_VERSION} has no algorithm.filter_groups: algo=dapo is refused on it")

MODELS = ["deepseek_v4_flash", "deepseek_v4_pro", "kimi_k2_6", "glm5_1", "qwen3_5_35b"]
PATH_ENV = {"deepseek_v4_flash": "FLASH_MODEL_PATH", "deepseek_v4_pro": "PRO_MODEL_PATH",
            "kimi_k2_6": "KIMI_K2_6_MODEL_PATH", "glm5_1": "GLM5_1_MODEL_PATH", "qwen3_5_35b": "QWEN3_5_35B_MODEL_PATH"}


def compose(overrides: list[str], conf_dir: Path = ROOT / "conf") -> dict:
    """The resolved run config for these overrides (as the runner's task would see it)."""
    from hydra import compose as hcompose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
        cfg = hcompose(config_name="run", overrides=overrides)
    GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg, resolve=True)


def plan(overrides: list[str], run_dir: str = "/tmp/vrun-test-run", environ: dict | None = None, **kw):
    from vrun.planning.plan import make_plan

    env = dict(os.environ if environ is None else environ)
    return make_plan(schema.typed(compose(overrides)), run_dir, environ=env, **kw)


def problems_of(overrides: list[str], **kw) -> list[str]:
    """The error lines a plan raises (empty if it plans)."""
    from vrun.core.problems import PlanError

    try:
        plan(overrides, **kw)
    except PlanError as e:
        return [p.line() for p in e.problems]
    return []


def processes_of(pattern: str, marker: str) -> list[str]:
    """Live processes whose command line matches the regex `pattern` and whose start-up environment holds `marker`
    (a test's own directory: every process of a run it started inherits it), as "pid command line". Another test's
    or another user's Ray on this machine is not this test's leftover; an exited process waiting to be reaped
    (state Z) is not running."""
    import re

    out, want, rx = [], marker.encode(), re.compile(pattern)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            if stat[stat.rindex(")") + 2:].startswith("Z"):
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            if rx.search(cmd) and want in (d / "environ").read_bytes():
                out.append(f"{d.name} {cmd}")
        except (OSError, ValueError):
            continue
    return out


LINE = re.compile(r"^(?:error|warning): (?P<key>[^=:\s]+)(?:=(?P<value>.*?))?: .+?; fix: (?P<fix>.+)$")


def fix_repeats_input(line: str) -> bool:
    """Whether a refusal's fix only repeats its input: the fix's first assignment (up to a space, a comma or a
    semicolon) is `KEY=VALUE` as the line quotes them, or the whole fix is."""
    m = LINE.match(line.strip())
    if not m or m.group("value") is None:
        return False
    given, fix = f"{m.group('key')}={m.group('value')}", m.group("fix").strip()
    first = re.split(r"[ ,;]", fix, maxsplit=1)[0]
    return fix == given or first == given


def assert_fixes_differ(text: str) -> None:
    """Every refusal or warning line in a command's output offers a change, not the input repeated."""
    for line in text.splitlines():
        line = line[line.find("error: "):] if "error: " in line else line[line.find("warning: "):] \
            if "warning: " in line else line
        assert not fix_repeats_input(line), f"a fix that repeats the input: {line}"


def runner(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """The runner as a user runs it; every error and warning line it prints is held to a fix other than its input."""
    e = dict(os.environ if env is None else env)
    e.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run([PY, str(ROOT / "runner.py"), *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout)
    assert_fixes_differ(proc.stdout + "\n" + proc.stderr)
    return proc


@pytest.fixture(autouse=True)
def _fixes_differ_from_the_input(monkeypatch):
    """Every Problem line made in a test's own process is held to the same rule as the runner's output."""
    from vrun.core.problems import Problem

    line = Problem.line

    def checked(self):
        text = line(self)
        assert not fix_repeats_input(text), f"a fix that repeats the input: {text}"
        return text

    monkeypatch.setattr(Problem, "line", checked)


def params_from_arch(arch: dict):
    """The memory estimate's units counted from architecture facts (vrun.estimate.params), or (None, why)."""
    from vrun.estimate import params

    c, why = params.count(arch)
    if c is None:
        return None, why
    return params.to_memory_params(c, mtp=True, vision=False), ""


@pytest.fixture
def own_state_dir(tmp_path, monkeypatch):
    """A state dir of the test's own: no calibration record or index from elsewhere is read or written."""
    d = tmp_path / "state"
    monkeypatch.setenv("VRUN_STATE_DIR", str(d))
    return d


@functools.lru_cache(maxsize=1)
def _record_template() -> str:
    from vrun.planning import report

    return json.dumps(report.plan_json(plan(["model=qwen3_5_35b", "mode=plan"], run_dir="/vrun-template-run")))


def record_json(run_dir, **fields) -> dict:
    """A real plan.json's content (vrun.rundir.record) for a run dir the test writes by hand, with `fields` set."""
    from vrun.rundir import records as rundir

    text = _record_template().replace("/vrun-template-run", str(run_dir))
    out = json.loads(text)
    out["run_id"] = rundir.run_id(str(run_dir))
    out.update(fields)
    return out


def assert_a_fix(line: str, typed: str) -> None:
    """`error: KEY=VALUE: why; fix: change`: the key and the change named, the change not the input repeated."""
    m = re.match(r"error: ([^=:\s]+)(?:=(.*?))?: (.+); fix: (.+)$", line)
    assert m, line
    key, fix = m.group(1), m.group(4).strip()
    assert key.lstrip("+~") and key != "hydra" and key != "?", line
    assert fix not in (typed, f"{m.group(1)}={m.group(2)}"), line


def another_models_checkpoint(run_dir) -> tuple:
    """A whole global_step_2 of 8 ranks in <run_dir>/checkpoints (tests/support/standin_ckpt.py), the tracker naming
    it, stamped as this plan's (its plan.json) and then rewritten as saved by model glm5_1. Returns (the stamp's
    path, this plan's stamp text) to put back."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    import standin_ckpt

    from vrun.rundir import checkpoints
    from vrun.rundir.record import PlanRecord

    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for rank in [*range(1, 8), 0]:
        standin_ckpt.save(root, 2, rank, 8, tracker=True)
    assert checkpoints.stamp(root, 2, PlanRecord.load(run_dir))
    stamp = root / "global_step_2" / checkpoints.STAMP
    good = stamp.read_text()
    stamp.write_text(json.dumps({**json.loads(good), "model": "glm5_1"}))
    return stamp, good


# ==================================================================== the checkout left as found
def _untracked() -> set | None:
    """The files `git status --porcelain` shows as untracked (not ignored, not tracked: what a test would leave);
    None outside a git checkout (a user's unpacked copy), where the check cannot be made. Tracked files changed
    meanwhile are not counted: a developer may edit while the suite runs."""
    try:
        p = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {x for x in p.stdout.splitlines() if x.startswith("??")} if p.returncode == 0 else None


def pytest_sessionstart(session):
    # once, in the process that collects the whole session (not in each of pytest-xdist's workers, which would see
    # one another's files come and go)
    if not hasattr(session.config, "workerinput"):
        session.config._vrun_checkout = _untracked()


def pytest_sessionfinish(session, exitstatus):
    """The suite fails when it leaves a file in the checkout that git would show (a test's output belongs in its
    tmp_path, or in a git-ignored dir it names)."""
    before = getattr(session.config, "_vrun_checkout", None)
    after = _untracked() if before is not None else None
    if before is None or after is None:
        return
    left = sorted(after - before)
    if left:
        print(f"\nerror: the tests left {len(left)} file(s) in the checkout {ROOT} (git status): "
              + ", ".join(x[3:] for x in left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
              + "; fix: write them under the test's tmp_path", file=sys.stderr)
        session.exitstatus = 1


# The files that wait longest (real Ray clusters, stalls, restarts: minutes each, mostly waiting) go first, so that
# pytest-xdist starts them while the short files fill the other processes, instead of one of them ending the suite
# alone (make test: --dist loadfile --no-loadscope-reorder hands out whole files in this order; xdist's own order,
# the files with the most tests first, put these one- and two-test files last). Chosen from --durations.
LONG_FIRST = ("test_phase_watch.py", "test_flightrec.py", "test_ray_watch.py", "test_ray_no_progress.py",
              "test_rayjobs.py", "test_run_outlook.py", "test_watchdog.py", "test_stacks.py", "test_handoff.py",
              "test_ray_doors.py", "test_runs.py", "test_fuzz.py", "test_kuberay_kubectl.py")

# Files whose jobs take turns on one two-node Ray cluster (the session's `ray4`): pytest-xdist hands each pair to one
# process as one unit, so the cluster starts once per pair instead of once per file; two pairs, so that the two
# longest files still run side by side.
ONE_CLUSTER = {"test_phase_watch.py": "ray4-a", "test_flightrec.py": "ray4-a",
               "test_ray_watch.py": "ray4-b", "test_ray_no_progress.py": "ray4-b"}


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))  # stable: the rest keep their order


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with each ONE_CLUSTER pair one unit (the files' tests in one process, one after the other)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            scope = super()._split_scope(nodeid)
            return ONE_CLUSTER.get(scope.rsplit("/", 1)[-1], scope)

    return Scheduling(config, log)


@pytest.fixture(scope="session")
def ray4(tmp_path_factory):
    """http address of a real two-node Ray cluster started here: a head and a worker of 4 declared GPUs each, their
    own temp dir and ports (tests/test_rayjobs.py's helpers); the jobs of the tests that use it run one after the
    other; their pids are stopped at the session's end."""
    from test_rayjobs import _get, ports, start_head, start_worker, stop, wait

    tmp = tmp_path_factory.mktemp("ray4")
    p = ports(12)
    temp = Path("/tmp") / f"vw{os.getpid()}"
    procs = [start_head(p, temp, tmp / "head.log", gpus=4, cpus=1, h100=False)]
    url = f"http://127.0.0.1:{p[1]}"
    try:
        wait(lambda: _get(url, "/api/version"), 90, "the head's dashboard")
        procs.append(start_worker(p[0], tmp / "worker.log", cpus=1, gpus=4, h100=False))
        from vrun.launch import rayjobs

        wait(lambda: len(rayjobs.read_shape(url, 5).nodes) == 2, 90, "the worker joining")
        yield url
    finally:
        stop(procs)
        subprocess.run(["rm", "-rf", str(temp)])

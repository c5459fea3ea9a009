"""A property test per guard, on generated inputs (seeded, bounded), rather than only the examples that found the
holes: spellings of a secret interpolation, secret variable names, text around a secret, run-dir names, symlink
and hard-link layouts, pid values, malformed run-dir files, sbatch options and setup lines, value types.
Everything in-process except a few end-to-end runs of the real CLI."""
import json
import os
import random
import string
import subprocess
from pathlib import Path

import pytest

from conftest import PY, ROOT, compose, record_json, runner
from vrun.checks import composed as check_composed, paths as check_paths, sbatch as check_sbatch, secret as check_secrets, values as check_values
from vrun.rundir import records as rundir
from vrun.core import writer
from vrun.runs import owner

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

S = "hf_Q9x7Lk2mZpVw8RtY"  # the secret's value in every test: exported as HF_TOKEN
SEEDS = (3, 29, 1207)


def rng_of(seed):
    return random.Random(seed)


# ---------------------------------------------------------------- secret names and masking

SECRET_SEGMENTS = ["token", "secret", "password", "passwd", "pass", "key", "apikey", "credential", "credentials",
                   "auth", "cookie", "privatekey", "accesskey", "hftoken", "passphrase"]
PLAIN_SEGMENTS = ["path", "home", "cuda", "visible", "devices", "model", "dir", "max", "len", "node", "rank",
                  "world", "size", "port", "addr", "nccl", "debug", "level", "mode", "name", "user", "shell",
                  "tokenizers", "parallelism", "lang", "term", "ray", "slurm", "job", "id", "omp", "threads"]


def spell(segments, rng):
    """A variable name from segments in one of the ways people write them."""
    style = rng.choice(["UPPER", "lower", "Title", "camel"])
    if style == "camel":
        return segments[0].lower() + "".join(s.capitalize() for s in segments[1:])
    sep = rng.choice(["_", "_", "-", "__"])
    word = {"UPPER": str.upper, "lower": str.lower, "Title": str.capitalize}[style]
    return sep.join(word(s) for s in segments)


@pytest.mark.parametrize("seed", SEEDS)
def test_secret_names_by_segment(seed):
    rng = rng_of(seed)
    for _ in range(300):
        plain = rng.sample(PLAIN_SEGMENTS, rng.randint(1, 3))
        secret = plain[:]
        secret.insert(rng.randint(0, len(secret)), rng.choice(SECRET_SEGMENTS))
        name = spell(secret, rng)
        assert writer.is_secret_name(name), name
        clean = [s for s in plain if s not in ("tokenizers", "parallelism")] or ["path"]
        assert not writer.is_secret_name(spell(clean, rng)), clean
    for name in ("TOKENIZERS_PARALLELISM", "PATH", "PWD", "CUDA_VISIBLE_DEVICES", "SSH_AUTH_SOCK", "max_token_len"):
        assert not writer.is_secret_name(name) or name == "max_token_len", name
    for name in ("DB_PASS", "OPENAI_KEY", "Slack_Token", "wandb_token", "WANDB_API_KEY", "HF_TOKEN", "hfToken",
                 "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN_RO"):
        assert writer.is_secret_name(name), name


@pytest.mark.parametrize("seed", SEEDS)
def test_mask_removes_every_occurrence(seed):
    rng = rng_of(seed)
    for _ in range(200):
        value = "".join(rng.choice(string.ascii_letters + string.digits + "-_./+=") for _ in range(rng.randint(8, 40)))
        name = spell([rng.choice(PLAIN_SEGMENTS), rng.choice(SECRET_SEGMENTS)], rng)
        env = {name: value, "PATH": "/usr/bin"}
        noise = lambda: "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 30)))  # noqa: E731
        text = noise() + value + noise() + (value if rng.random() < 0.5 else "") + noise()
        out = writer.mask(text, env)
        assert value not in out and writer.HIDDEN in out
        user, pw = rng.choice(["u", "alice", "svc-1"]), "".join(rng.choice(string.ascii_letters) for _ in range(6))
        url = f"{rng.choice(['https', 'git+ssh', 'postgres'])}://{user}:{pw}@host.example/x"
        assert f"{user}:{pw}" not in writer.mask(noise() + url + noise(), {})
    short = {"HF_TOKEN": "abc123"}
    assert writer.short_secrets(short, ["HF_TOKEN"]) == ["HF_TOKEN"]
    assert writer.mask("abc123 stays", short) == "abc123 stays"  # too short to mask: refused where used instead


# ---------------------------------------------------------------- interpolation of a secret, any spelling

def interpolation(name, rng, depth=0):
    q = rng.choice(["", "'", '"'])
    arg = f"{q}{name}{q}"
    sp = lambda: rng.choice(["", " ", "  "])  # noqa: E731
    resolver = rng.choice(["oc.env", "oc.env"])
    default = rng.choice(["", f",{sp()}x", f", {sp()}'d'", ",null"])
    inner = "${" + sp() + resolver + sp() + ":" + sp() + arg + default + sp() + "}"
    if depth == 0 and rng.random() < 0.3:
        inner = "${oc.decode:" + inner + "}"
    if depth == 0 and rng.random() < 0.2:
        inner = "${oc.env:UNSET_VAR_XYZ," + interpolation(name, rng, depth + 1) + "}"
    return rng.choice(["", "x", "pre-", "a_"]) + inner + rng.choice(["", "y", "-post"])


@pytest.mark.parametrize("seed", SEEDS)
def test_secret_interpolation_in_any_spelling(seed):
    rng = rng_of(seed)
    env = {"HF_TOKEN": S, "DB_PASS": "p4ssw0rd-long", "PATH": "/usr/bin", "HOME": "/home/x"}
    for _ in range(150):
        name = rng.choice(["HF_TOKEN", "DB_PASS", "Slack_Token", "wandb_token"])
        value = interpolation(name, rng)
        assert name in check_secrets.env_refs(value), value
        raw = {"run": {"experiment_name": value}, "pass_env": []}
        found = check_secrets.check(raw, {"run": {"experiment_name": "resolved"}}, env)
        assert found and found[0].key == "run.experiment_name" and S not in found[0].line(), value
    # a variable name built by an interpolation cannot be judged: refused
    for value in ("${oc.env:HF_${x}}", "${oc.env:${name}}", "${oc.decode:${oc.env:${n}}}"):
        assert None in check_secrets.env_refs(value)
        assert check_secrets.check({"run": {"experiment_name": value}}, {}, env)
    # not secrets: plain references, other variables, escaped text
    for value in ("${model.name}", "${oc.env:HOME}", "${oc.env:TOKENIZERS_PARALLELISM,false}", "\\${oc.env:HF_TOKEN}",
                  "plain"):
        assert not check_secrets.check({"run": {"experiment_name": value}}, {"run": {"experiment_name": "ok"}},
                                       env), value


@pytest.mark.parametrize("seed", SEEDS)
def test_secret_values_and_keys_anywhere(seed):
    rng = rng_of(seed)
    env = {"HF_TOKEN": S, "PATH": "/usr/bin"}
    keys = ["verl.trainer.project_name", "env.MY_VAR", "cluster.setup[0]", "run.experiment_name",
            "verl.actor_rollout_ref.rollout.custom.x", "model.env.FOO"]
    for _ in range(200):
        key = rng.choice(keys)
        value = rng.choice(["", "x", "https://h/"]) + S + rng.choice(["", "/y", " z"])
        raw: dict = {}
        node = raw
        parts = key.replace("[0]", "").split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = [value] if key.endswith("[0]") else value
        found = check_secrets.check(raw, raw, env)
        assert found and all(S not in p.line() for p in found), (key, value)
    for name in ("DB_PASS", "OPENAI_KEY", "Slack_Token", "wandb_token", "HF_TOKEN"):
        found = check_secrets.check({"env": {name: "whatever-value"}}, {"env": {name: "whatever-value"}}, env)
        assert found and found[0].key == f"env.{name}"
    assert not check_secrets.check({"env": {"TOKENIZERS_PARALLELISM": "false"}},
                                   {"env": {"TOKENIZERS_PARALLELISM": "false"}}, env)


def test_pass_env_path_env_and_setup_literals():
    env = {"HF_TOKEN": S, "SHORT_TOKEN": "abc12", "PATH": "/usr/bin"}
    refused = lambda raw: check_secrets.check(raw, raw, env)  # noqa: E731
    for entry in (S, "not a name", "A=B", "$HF_TOKEN", "1ABC", ""):
        assert refused({"pass_env": [entry]}), entry
    assert refused({"pass_env": ["SHORT_TOKEN"]})[0].key == "pass_env"
    assert not refused({"pass_env": ["HF_TOKEN", "WANDB_API_KEY"]})
    for name in ("HF_TOKEN", "DB_PASS", "MY_SECRET"):
        assert refused({"model": {"path_env": name}})[0].key == "model.path_env"
    literal = ["export HF_TOKEN=hf_abcdef", "huggingface-cli login --token hf_abcdef", "HF_TOKEN='x y' cmd",
               "tool --password=hunter22", "wandb login --api-key abcdef0123", "export DB_PASS=x"]
    for line in literal:
        assert check_secrets.setup_literal(line), line
        assert refused({"cluster": {"setup": [line]}})[0].key == "cluster.setup[0]"
    for line in ("export HF_TOKEN", 'export HF_TOKEN="$HF_TOKEN"', "huggingface-cli login --token \"${HF_TOKEN}\"",
                 "module load cuda\tgcc", "export TOKENIZERS_PARALLELISM=false", "source ~/.bashrc"):
        assert not check_secrets.setup_literal(line), line


# ---------------------------------------------------------------- run-dir names

NAME_CHARS = string.ascii_letters + string.digits + "._+-/" + "[]='#,{}~ é%$:@"


@pytest.mark.parametrize("seed", SEEDS)
def test_run_dir_names_of_any_character_are_run_dirs(seed, tmp_path):
    """Any name without a control character is a run dir (RL never puts it on a command line); SFT's command line
    takes it as a quoted literal, and SFT refuses it only when Hydra's parser and OmegaConf give back another
    string (a backslash right before `${`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from vrun import entrypoints
    from vrun.core import hydra_text

    rng = rng_of(seed)
    parser = OverridesParser.create()
    sft = entrypoints.SFT()
    chars = NAME_CHARS + "\\\"'"
    for _ in range(120):
        name = "".join(rng.choice(chars) for _ in range(rng.randint(1, 12))).strip("/") or "x"
        if name in (".", "..") or name.startswith("../") or "/../" in f"/{name}/" or name.startswith("~"):
            continue
        path = os.path.normpath(str(tmp_path / name))
        assert not check_paths.run_dir(path, "hydra.run.dir"), (path, check_paths.run_dir(path, "hydra.run.dir"))
        try:
            back = OmegaConf.create({"v": parser.parse_override(f"k={hydra_text.literal(path + '/sft')}").value()}).v
        except Exception:  # noqa: BLE001
            back = None
        assert (back == path + "/sft") == (not sft.run_dir_problems(path, "hydra.run.dir")), path
        if "\\${" not in path:
            assert back == path + "/sft", (path, back)


def test_run_dir_roots_and_empty(tmp_path):
    home = os.path.expanduser("~")
    for path in ("", " ", "/", home, home + "/", "/proc"):
        assert check_paths.run_dir(path, "hydra.run.dir"), path


# ---------------------------------------------------------------- symlink and hard-link layouts

@pytest.mark.parametrize("seed", SEEDS)
def test_writer_never_writes_through_a_link(seed, tmp_path):
    rng = rng_of(seed)
    for i in range(40):
        base = tmp_path / f"l{i}"
        base.mkdir()
        victim = base / "victim"
        victim.write_text("precious")
        run = base / "sweep" / "p0"
        run.parent.mkdir()
        layout = rng.choice(["file-symlink", "file-hardlink", "dir-symlink", "parent-symlink", "plain",
                             "dangling-symlink"])
        if layout == "dir-symlink":
            (base / "elsewhere").mkdir()
            run.symlink_to(base / "elsewhere")
        elif layout == "parent-symlink":
            (base / "other").mkdir()
            (base / "other" / "p0").mkdir()
            os.rmdir(run.parent)
            run.parent.symlink_to(base / "other")
        else:
            run.mkdir()
        target = run / rng.choice(["verl_config.yaml", "plan.json", "progress.jsonl"])
        if layout == "file-symlink":
            target.symlink_to(victim)
        elif layout == "file-hardlink":
            os.link(victim, target)
        elif layout == "dangling-symlink":
            target.symlink_to(base / "nowhere")
        try:
            if target.name == "progress.jsonl" and layout != "file-hardlink":
                writer.append_line(target, "{}", root=run)
            else:
                writer.write_text(target, "new", root=run)
            wrote = True
        except OSError:
            wrote = False
        assert victim.read_text() == "precious", layout
        assert not (base / "nowhere").exists(), layout
        # a link above the run dir (a sweep dir on a linked scratch disk) is the user's choice: written below it
        assert wrote == (layout in ("plain", "file-hardlink", "parent-symlink")), layout
        if layout == "dir-symlink":  # the plan refuses it before the writer is reached
            assert check_paths.run_dir(str(run), "hydra.sweep.subdir", inside=str(base / "sweep"), resume=True)
            assert check_paths.run_dir(str(run), "hydra.run.dir", resume=True)


# ---------------------------------------------------------------- pid values

def test_cancel_signals_only_the_runs_own_process(tmp_path):
    run_id = rundir.run_id(str(tmp_path / "r"))
    own = subprocess.Popen(["sleep", "60"], env={**os.environ, "VRUN_RUN_ID": run_id})
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, "VRUN_RUN_ID": "someone-else"})
    bare = subprocess.Popen(["sleep", "60"])
    try:
        rng = rng_of(5)
        generated = [-1, 0, 1, -os.getpid(), os.getpid(), True, False, None, 1.5, "12", "-1", "x", [1], {},
                     2 ** 31, 2 ** 63, other.pid, bare.pid] + [rng.randint(-2 ** 31, 2 ** 31) for _ in range(50)]
        for pid in generated:
            assert owner.not_proven(pid, run_id) is not None, pid
        assert owner.not_proven(own.pid, run_id) is None
        assert owner.not_proven(str(own.pid), run_id) is None
        assert owner.not_proven(own.pid, None) is not None
    finally:
        for p in (own, other, bare):
            p.kill()
            p.wait()


def _run_dir_with_pid(d: Path, pid, run_id=None):
    d.mkdir(parents=True)
    plan = record_json(d, mode="train")
    if run_id:
        plan["run_id"] = run_id
    (d / "plan.json").write_text(json.dumps(plan))
    import socket
    import time

    lines = [{"event": "started", "t": time.time(), "host": socket.gethostname(), "pid": pid, "attempt": 0},
             {"event": "entrypoint_started", "t": time.time(), "host": socket.gethostname(), "pid": pid,
              "attempt": 0}]
    (d / "progress.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_cancel_cli_refuses_unproven_pids(tmp_path):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        for i, pid in enumerate((victim.pid,)):
            d = tmp_path / f"r{i}"
            _run_dir_with_pid(d, pid, rundir.run_id(str(d)))
            p = subprocess.run([PY, "-m", "vrun", "cancel", str(d), "--no-wait"], cwd=ROOT, capture_output=True,
                               text=True, timeout=60)
            assert p.returncode == 2 and "nothing signalled" in p.stderr and "Traceback" not in p.stderr, p.stderr
            assert victim.poll() is None  # still alive
        d = tmp_path / "own"
        own = subprocess.Popen(["sleep", "60"], env={**os.environ, "VRUN_RUN_ID": rundir.run_id(str(d))})
        _run_dir_with_pid(d, own.pid, rundir.run_id(str(d)))
        p = subprocess.run([PY, "-m", "vrun", "cancel", str(d), "--no-wait"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert own.wait(timeout=10) != 0
    finally:
        victim.kill()
        victim.wait()


# ---------------------------------------------------------------- malformed run-dir files

def _malformed(rng):
    """A plan.json / progress.jsonl / slurm_job.json body the runner never writes."""
    good = record_json("/vrun-malformed")
    kind = rng.choice(["list", "string", "number", "null", "truncated", "binary", "deep", "wrong-type", "huge-int"])
    if kind == "list":
        return b"[1, 2]"
    if kind == "string":
        return b'"plan"'
    if kind == "number":
        return b"3"
    if kind == "null":
        return b"null"
    if kind == "truncated":
        return json.dumps(good).encode()[: rng.randint(1, 40)]
    if kind == "binary":
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + b"\xff\xfe"
    if kind == "deep":
        return b"[" * 100_000 + b"]" * 100_000
    if kind == "huge-int":
        return json.dumps({**good, "format": 10 ** 40}).encode()
    key = rng.choice(["model", "mesh", "env", "argv", "format", "mode", "stack", "batch", "run_id", "torchrun"])
    return json.dumps({**good, key: rng.choice([[1], "x", 3, {"a": [1]}, True])}).encode()


def _bad_events(rng):
    lines = []
    for _ in range(rng.randint(1, 6)):
        e = {"event": rng.choice(["started", "exited", "failed", "submitted", "entrypoint_started", 3, None]),
             "t": rng.choice([1.0, "x", None, float("nan"), True, -1e308, 1e308]),
             rng.choice(["attempt", "pid", "rc", "node", "hosts", "job_id"]): rng.choice(["x", -5, [1], {}, None, 2.5])}
        if rng.random() < 0.3:
            e.pop("t")
        lines.append(json.dumps(e) if rng.random() < 0.9 else "{not json")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", SEEDS)
def test_every_verb_answers_malformed_files_in_one_line(seed, tmp_path, capsys):
    """In-process (the CLI's own main): exit 0 or 2, never an exception; a refusal is one line naming the file."""
    from vrun.runs import cli

    rng = rng_of(seed)
    for i in range(40):
        d = tmp_path / f"r{i}"
        d.mkdir()
        ok_plan = json.dumps(record_json(d, mode="train")).encode()
        broken = rng.choice(["plan", "progress", "slurm", "verl", "manifest"])
        (d / "plan.json").write_bytes(_malformed(rng) if broken == "plan" else ok_plan)
        if broken == "progress":
            (d / "progress.jsonl").write_text(_bad_events(rng))
        if broken == "slurm":
            (d / "slurm_job.json").write_bytes(_malformed(rng))
        (d / "verl_config.yaml").write_bytes(b"a: [1\n" if broken == "verl" else b"a: 1\n")
        if broken == "manifest":
            (d / "manifest.json").write_bytes(_malformed(rng))
        for verb in (["status", str(d)], ["runs", str(d)], ["diff", str(d), str(d)], ["export", str(d)],
                     ["cancel", str(d), "--no-wait", "--yes"], ["logs", str(d)], ["resubmit", str(d)]):
            rc = cli.main(verb)
            err = capsys.readouterr().err
            assert rc in (0, 1, 2), (verb, broken, rc)
            lines = [x for x in err.splitlines() if x.startswith("error: ")]
            assert "Traceback" not in err and len(lines) <= 1, (verb, broken, err)
            if rc == 2:
                assert lines and "; fix: " in lines[0], (verb, broken, err)
            # answered by the file checks, not by the verb's last-resort line
            assert not any(x.startswith(f"error: {verb[0]}: ") for x in lines), (verb, broken, err)


def test_missing_slurm_clients_and_logs_follow(tmp_path):
    """scancel and squeue absent: one line each, and `logs -f` returns."""
    import time

    d = tmp_path / "s"
    d.mkdir()
    (d / "plan.json").write_text(json.dumps(record_json(d, mode="train", cluster="slurm")))
    (d / "slurm_job.json").write_text(json.dumps({"job_id": "123", "folder": str(tmp_path / "logs" / "%j"),
                                                  "spec": {"nodes": 1}}))
    (d / "progress.jsonl").write_text(json.dumps({"event": "submitted", "t": time.time(), "job_id": "123",
                                                  "attempt": 0}) + "\n")
    env = {k: v for k, v in os.environ.items()}
    env["PATH"] = str(Path(PY).parent) + ":/nonexistent"
    for verb in (["cancel", str(d), "--no-wait"], ["logs", "-f", str(d)]):
        p = subprocess.run([PY, "-m", "vrun", *verb], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, (verb, p.stderr)
        assert "Traceback" not in p.stderr and "fix:" in p.stderr


# ---------------------------------------------------------------- exported scripts

@pytest.mark.parametrize("seed", SEEDS[:2])
def test_exported_script_runs_no_injected_line(seed, tmp_path):
    from vrun.runs import export
    from vrun.rundir import state

    rng = rng_of(seed)
    marker = tmp_path / "pwned"
    evil = [f"$(touch {marker})", f"`touch {marker}`", f"\ntouch {marker}\n", "VERL_CONFIG_EOF",
            f"'; touch {marker}; '", f"\nVERL_CONFIG_EOF\ntouch {marker}\n"]
    for i in range(12):
        d = tmp_path / f"r{i}"
        d.mkdir()
        pick = lambda: rng.choice(evil)  # noqa: E731
        config = f"trainer:\n  project_name: '{pick().strip()}'\nnote: |\n  {pick().strip()}\n  VERL_CONFIG_EOF\n"
        (d / "verl_config.yaml").write_text(config)
        plan = record_json(d, algo=pick(), optimizer=pick(),
                           entrypoint=rng.choice(["verl.trainer.main_ppo:run_ppo", "torchrun sft_trainer"]),
                           argv=["python", "-m", "vrun.launch.entry", "ppo", "--task-runner", pick()],
                           env={"A": pick(), pick().strip() or "B": "1", "PYTHONPATH": pick()},
                           env_unset=[pick()], pass_env=[pick(), "HF_TOKEN"])
        plan["model"]["name"] = pick()
        plan["mlite"]["source"] = pick()
        (d / "plan.json").write_text(json.dumps(plan))
        text = export.script(state.load(d))
        script = tmp_path / f"x{i}.sh"
        script.write_text(text)
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, text
        # run it with a python3 that lacks verl (it fails at verl's import, after every line above it ran)
        fake = tmp_path / "bin"
        fake.mkdir(exist_ok=True)
        (fake / "python3").write_text("#!/bin/sh\nexit 3\n")
        (fake / "torchrun").write_text("#!/bin/sh\nexit 3\n")
        os.chmod(fake / "python3", 0o755)
        os.chmod(fake / "torchrun", 0o755)
        subprocess.run(["bash", str(script)], env={"PATH": f"{fake}:/usr/bin:/bin", "HF_TOKEN": S, "HOME": str(tmp_path)},
                       capture_output=True, cwd=tmp_path, timeout=30)
        assert not marker.exists(), text
        assert S not in text


# ---------------------------------------------------------------- types as verl reads them

@pytest.mark.parametrize("seed", SEEDS)
def test_types_as_verl_reads_them(seed):
    rng = rng_of(seed)
    base = {"a": {"flag": False, "on": True, "n": 8, "lr": 1e-6, "free": None, "s": "x", "neg_ok": -1, "zero": 0}}
    for _ in range(200):
        key = rng.choice(["flag", "on", "n", "lr", "free", "s", "neg_ok", "zero"])
        value = rng.choice(["false", "False", "no", "off", "0", "true", "yes", "on", "1", "", float("nan"),
                            float("inf"), -float("inf"), -1, -0.5, 3, 0.1, True, False, None, "8", "1e-5"])
        resolved = {"a": {**base["a"], key: value}}
        found = check_values.type_problems(resolved, base)
        b = base["a"][key]
        expect = (isinstance(value, float) and value != value or value in (float("inf"), -float("inf"))) or \
            (isinstance(b, bool) and isinstance(value, str)) or \
            (isinstance(b, (int, float)) and not isinstance(b, bool) and isinstance(value, str)) or \
            (isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 and isinstance(value, (int, float))
             and not isinstance(value, bool) and value < 0)
        assert bool(found) == bool(expect), (key, value, found)
        if found:
            assert found[0].key == f"verl.a.{key}"


# ---------------------------------------------------------------- sbatch values

SBATCH_OPTIONS = ["export", "tres-per-task", "gpus-per-socket", "time-min", "chdir", "mail-type", "comment",
                  "exclusive", "reservation", "nodelist", "exclude", "dependency", "gres", "uid", "get-user-env",
                  "hold", "begin", "licenses", "mem-per-gpu", "input", "kill-command", "batch", "nice", "requeue",
                  "wckey", "tmp", "propagate", "mincpus", "spread-job", "cpu-freq", "cores-per-socket", "ntasks"]


@pytest.mark.parametrize("seed", SEEDS)
def test_additional_parameters_allow_list(seed):
    rng = rng_of(seed)
    for _ in range(150):
        option = rng.choice(SBATCH_OPTIONS)
        k = option.replace("-", rng.choice(["-", "_"]))
        found = check_sbatch.check({"cluster": {"additional_parameters": {k: "v"}}})
        allowed = option in check_sbatch.SBATCH_ALLOWED and option not in check_sbatch.SBATCH_REFUSED_ANYWAY
        assert bool(found) != allowed, (option, found)


def test_setup_lines_bash_n():
    ok = ["module load cuda/12", "export A=1\tB=2", "source /etc/profile", "if true; then echo x; fi",
          "echo 'a b'", "cd $HOME && ls"]
    bad = ["echo 'unterminated", "if true; then", "echo $(", "fi", "(( ", "echo \"x"]
    for line in ok:
        assert not check_sbatch.setup_problems({"cluster": {"setup": [line]}}, set()), line
    for line in bad:
        found = check_sbatch.setup_problems({"cluster": {"node_setup": ["echo ok", line]}}, set())
        assert [p.key for p in found] == ["cluster.node_setup[1]"], line
    assert check_sbatch.expanded_path("/scratch/a%jb", "hydra.sweep.dir")


# ---------------------------------------------------------------- unknown keys under typed groups

@pytest.mark.parametrize("seed", SEEDS[:1])
def test_unknown_keys_under_typed_groups(seed):
    rng = rng_of(seed)
    cfg = compose(["model=qwen3_5_35b", "mode=plan"])
    for _ in range(30):
        group = rng.choice(["mesh", "cluster", "run", "model", "algo", "data", "cluster.ray", "model.arch"])
        name = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9))) + "_x"
        raw = json.loads(json.dumps(cfg, default=str))
        node = raw
        for part in group.split("."):
            node = node[part]
        node[name] = 1
        found = check_composed.unknown_keys(raw)
        assert [p.key for p in found] == [f"{group}.{name}"], (group, name, found)
    raw = json.loads(json.dumps(cfg, default=str))
    raw["verl"]["anything"] = 1
    raw["env"]["ANY_VAR"] = "1"
    assert not check_composed.unknown_keys(raw)


# ---------------------------------------------------------------- end to end through the real CLI

def _env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MLITE", "RAY_")) and not k.endswith("MODEL_PATH")}
    e.update(HOME=str(tmp_path / "home"), HF_TOKEN=S, DB_PASS="db-pass-value-0042")
    return e


def _no_secret_anywhere(proc, root: Path):
    assert S not in proc.stdout + proc.stderr and "db-pass-value-0042" not in proc.stdout + proc.stderr
    for f in root.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert S.encode() not in data and b"db-pass-value-0042" not in data, f


def test_secret_spellings_end_to_end(tmp_path):
    """The issue's spellings through the runner: refused in one line, nothing written, nothing secret printed."""
    env = _env(tmp_path)
    cases = ["run.experiment_name=x${oc.env:'HF_TOKEN'}", "run.experiment_name=${oc.env: \"DB_PASS\"}",
             "model.path_env=HF_TOKEN", f"pass_env=[{S}]", "+verl.trainer.foo=${oc.decode:'${oc.env:HF_TOKEN}'}",
             "cluster=slurm", f"+env.URL=https://user:{S}@host/x"]
    for i, arg in enumerate(cases):
        args = [arg] if arg != "cluster=slurm" else ["cluster=slurm", "+cluster.setup=['export HF_TOKEN=literal1']"]
        p = runner("model=qwen3_5_35b", "mode=plan", *args, f"hydra.run.dir={tmp_path}/r{i}", env=env, cwd=tmp_path)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (arg, p.stderr[-800:])
        errors = [x for x in p.stderr.splitlines() if "error: " in x]
        assert errors and "; fix: " in errors[0], (arg, p.stderr[-800:])
        assert not (tmp_path / f"r{i}").exists(), arg
        _no_secret_anywhere(p, tmp_path)
    ok = runner("model=qwen3_5_35b", "mode=plan", "+env.TOKENIZERS_PARALLELISM=false",
                "+cluster.setup=['module load x\tfoo']", f"hydra.run.dir={tmp_path}/ok", env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-800:]
    _no_secret_anywhere(ok, tmp_path)


def test_run_dir_is_one_runs(tmp_path):
    env = _env(tmp_path)
    r = tmp_path / "run"
    base = ["model=qwen3_5_35b", "mode=plan", f"hydra.run.dir={r}"]
    assert runner(*base, env=env, cwd=tmp_path).returncode == 0
    again = runner(*base, env=env, cwd=tmp_path)
    assert again.returncode == 2 and "run.resume=true" in again.stderr and "holds another run" in again.stderr
    same = runner(*base, "run.resume=true", env=env, cwd=tmp_path)
    assert same.returncode == 0, same.stderr[-800:]
    other = runner(*base, "run.resume=true", "verl.trainer.save_freq=7", env=env, cwd=tmp_path)
    assert other.returncode == 2 and "run.resume" in other.stderr, other.stderr[-800:]
    for bad in ("''", "/", str(tmp_path / "home")):
        p = runner("model=qwen3_5_35b", "mode=plan", f"hydra.run.dir={bad}", env=env, cwd=tmp_path)
        assert p.returncode == 2 and "hydra.run.dir" in p.stderr, (bad, p.stderr[-500:])
    assert sorted(x.name for x in tmp_path.iterdir()) == ["run"]


def test_sweep_points_own_dirs(tmp_path):
    env = _env(tmp_path)
    sweep = tmp_path / "sweep"
    pts = ["-m", "model=qwen3_5_35b", "mode=plan", "optimizer=fsdp2", "verl.trainer.save_freq=1,2",
           f"hydra.sweep.dir={sweep}"]
    same = runner(*pts, "hydra.sweep.subdir=same", env=env, cwd=tmp_path)
    assert same.returncode == 2 and "share one run dir" in same.stderr, same.stderr[-800:]
    assert runner(*pts, env=env, cwd=tmp_path).returncode == 0
    smaller = runner("-m", "model=qwen3_5_35b", "mode=plan", "optimizer=dist_opt", "verl.trainer.save_freq=3",
                     f"hydra.sweep.dir={sweep}", env=env, cwd=tmp_path)
    assert smaller.returncode == 2 and "earlier sweep" in smaller.stderr, smaller.stderr[-800:]
    big = runner("-m", "model=qwen3_5_35b", "mode=plan", "verl.trainer.save_freq=range(0,100000)",
                 f"hydra.sweep.dir={tmp_path}/big", env=env, cwd=tmp_path)
    assert big.returncode == 2 and "100,000 points" in big.stderr and not (tmp_path / "big").exists()


def test_local_entry_checks_the_plans_stack(tmp_path):
    env = _env(tmp_path)
    r = tmp_path / "r"
    assert runner("model=qwen3_5_35b", "mode=plan", f"hydra.run.dir={r}", env=env, cwd=tmp_path).returncode == 0
    plan = json.loads((r / "plan.json").read_text())
    plan["stack"]["verl"]["version"] = "0.0.1-other"
    (r / "plan.json").write_text(json.dumps(plan))
    p = subprocess.run([PY, "-m", "vrun.launch.entry", "ppo", "--config", str(r / "verl_config.yaml")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "0.0.1-other" in p.stderr and "Traceback" not in p.stderr, p.stderr[-800:]


def test_run_dir_neighbours(tmp_path, monkeypatch):
    """The current directory, a file, a dir with other files, an Authorization header in a setup line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    for path in (".", "", str(tmp_path), str(tmp_path / "notes.txt")):
        assert check_paths.run_dir(path, "hydra.run.dir"), path
    assert not check_paths.run_dir(str(tmp_path / "new"), "hydra.run.dir")
    assert check_secrets.setup_literal('curl -H "Authorization: Bearer sk-0123456789" https://x')
    assert not check_secrets.setup_literal('curl -H "Authorization: Bearer $API_TOKEN" https://x')


def test_checks_layout():
    """One module per concern; cli_errors imports none of them (no cycle); the callback before the run dir keeps
    no module state."""
    import ast

    def imports(path):
        tree = ast.parse((ROOT / path).read_text())
        out = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module:
                out |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}
            elif isinstance(n, ast.Import):
                out |= {a.name for a in n.names}
        return out

    assert not {m for m in imports("vrun/config/cli_errors.py") if "check_" in m or "vrun.checks.plan_checks" in m}
    composed = ast.parse((ROOT / "vrun/checks/composed.py").read_text())
    mutable = [n for n in composed.body if isinstance(n, (ast.Assign, ast.AnnAssign))
               and isinstance(n.value, (ast.List, ast.Dict, ast.Set))]
    assert not mutable


def test_runs_index_with_junk_lines(tmp_path, capsys, monkeypatch):
    from vrun.runs import cli

    monkeypatch.setenv("VRUN_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    rng = rng_of(11)
    junk = ["[1]", '"x"', "{}", '{"run_dir": 3}', '{"run_dir": "/nonexistent", "t": "x"}', "{bad", "\udcff",
            '{"run_dir": "a\\u0000b"}', "null"]
    (tmp_path / "state" / "runs.jsonl").write_text("\n".join(rng.choice(junk) for _ in range(30)) + "\n",
                                                   errors="surrogateescape")
    assert cli.main(["runs"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_stall_that_follows_the_run_is_not_requeued_past_max_requeues():
    """run.on_stall=requeue: the stalls in a row count back from the newest while each earlier one was submitted
    again and the run did not get past its step; a step past it (progress) or a stall not requeued ends the count;
    a step that is not a whole number (the progress file is an input) counts as none."""
    from vrun.launch.watchdog import stalls_in_a_row

    def run(*stalls):
        out = []
        for step, requeued in stalls:
            out.append({"event": "stalled", "t": 1.0, "step": step})
            if requeued:
                out.append({"event": "stall_action", "t": 2.0, "action": "requeued"})
        return out

    assert stalls_in_a_row([]) == 0
    assert stalls_in_a_row(run((4, False))) == 0
    assert stalls_in_a_row(run((4, True), (4, False))) == 1
    assert stalls_in_a_row(run((4, True), (4, True), (None, True), (4, False))) == 3
    assert stalls_in_a_row(run((4, True), (9, False))) == 0          # got past step 4: a new stall
    assert stalls_in_a_row(run((4, True), (9, True), (9, False))) == 1
    assert stalls_in_a_row(run((4, False), (4, True), (4, False))) == 1
    assert stalls_in_a_row(run((4, True), (3, True), (2, False))) == 2  # resumed from an earlier checkpoint each time
    assert stalls_in_a_row(run(("9", True), (True, True), (4, False))) == 2
    # a stall before any step of its job stands where the run stood: past it later is progress
    assert stalls_in_a_row(run((4, True), (None, True), (10, False))) == 0
    assert stalls_in_a_row(run((4, True), (None, True), (None, True), (500, False))) == 0
    assert stalls_in_a_row(run((4, True), (None, True), (None, False))) == 2
    assert stalls_in_a_row(run((4, True), (10, True), (None, True), (None, False))) == 2
    assert stalls_in_a_row(run((4, True), (4.0, True), (900, False))) == 0      # a whole float is a step
    assert stalls_in_a_row(run((4, True), (4.5, True), (float("nan"), False))) == 2
    cancelled = {"event": "stall_action", "t": 2.0, "action": "cancelled"}
    assert stalls_in_a_row(run((4, False)) + [cancelled] + run((4, False))) == 0


def test_the_watchdogs_requeue_becomes_a_cancel_once_max_requeues_stalls_in_a_row(tmp_path, monkeypatch):
    """Node 0's action on a stall past its grace (vrun.launch.slurm.node.Node.act, run as it is on a stand-in node:
    its run dir, job id, cluster and record): after cluster.max_requeues stalls in a row at the same step it cancels
    the job, saying why, and submits nothing; below the cap it tries the resubmission (here without sbatch: it fails,
    records requeue_failed, and cancels). The rule on restarts without progress is off here
    (cluster.no_progress_attempts=0: tests/test_no_progress.py has it)."""
    import types

    from vrun.config.schema import Cluster
    from vrun.launch.slurm.node import Node
    from vrun.rundir import records

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scancel.calls"
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def stand_in(max_requeues):
        node = types.SimpleNamespace(env=types.SimpleNamespace(job_id=77),
                                     job=types.SimpleNamespace(run_dir=str(run_dir)),
                                     cluster=Cluster(max_requeues=max_requeues, no_progress_attempts=0),
                                     plan=None, release=lambda: None)
        node.record = lambda event, **f: records.record(str(run_dir), event, job_id=77, **f)
        return node

    for _ in range(3):
        records.record(str(run_dir), "stalled", step=4)
        records.record(str(run_dir), "stall_action", action="requeued")
    records.record(str(run_dir), "stalled", step=4)
    Node.act(stand_in(3), "requeue", "stalled at step 4", ["n1"])
    last = records.events(str(run_dir))[-1]
    assert last["event"] == "stall_action" and last["action"] == "cancelled", last
    assert last["why"].startswith("stalled 4 times in a row without getting past its step, 3 submitted again "
                                  "(cluster.max_requeues=3)"), last
    assert calls.read_text().split() == ["77"]
    Node.act(stand_in(4), "requeue", "stalled at step 4", ["n1"])
    acts = [e["action"] for e in records.events(str(run_dir)) if e["event"] == "stall_action"]
    assert acts[-2:] == ["requeue_failed", "cancelled"], acts
    assert "why" not in records.events(str(run_dir))[-1]


def test_the_ray_heads_dashboard_takes_a_free_port_when_the_jobs_is_held():
    """A SLURM node's Ray head asks for the job's dashboard port (vrun.launch.slurm.procs.ports) unless something
    still listens there (a process a killed job left behind: no cgroups on every cluster), then a free one, which
    node 0's watchdog asks (vrun.launch.slurm.node.start_watchdog reads Node.dashboard_port)."""
    import socket

    from vrun.launch.slurm.procs import free_port

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        other = free_port("127.0.0.1", port)
        assert other != port and other > 0
    assert free_port("127.0.0.1", port) == port  # free again once its holder is gone

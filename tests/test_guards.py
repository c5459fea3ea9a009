"""A property test per guard, on generated inputs (seeded, bounded), rather than only the examples that found the
holes: spellings of a secret interpolation, secret variable names, text around a secret, run-dir names, symlink
and hard-link layouts, pid values, malformed run-dir files, sbatch options and setup lines, value types.
Everything in-process except a few end-to-end runs of the real CLI."""
import json
import os
import random
import string
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PY, ROOT, compose, runner
from vrun import check_composed, check_paths, check_sbatch, check_secrets, check_values, rundir, writer
from vrun.runs import owner

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
def test_run_dir_names_accepted_only_if_verl_parses_them(seed, tmp_path):
    """A run-dir name is accepted only when Hydra's own override parser reads it back unchanged (verl's command
    line), and it has no comma or control character."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    rng = rng_of(seed)
    parser = OverridesParser.create()
    for _ in range(120):
        name = "".join(rng.choice(NAME_CHARS) for _ in range(rng.randint(1, 12))).strip("/") or "x"
        path = str(tmp_path / name)
        problems = check_paths.run_dir(path, "hydra.run.dir")
        norm = os.path.normpath(path)
        try:
            o = parser.parse_override(f"k={norm}")
            parses = not o.is_sweep_override() and o.value() == norm
        except Exception:  # noqa: BLE001
            parses = False
        if not problems:
            assert parses and "," not in path, path
        elif parses and "," not in path and not path.startswith(str(tmp_path) + "/..") and ".." not in name:
            assert False, (path, [p.line() for p in problems])


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


def test_pickle_validated_before_load(tmp_path):
    from vrun import task
    from vrun.problems import PlanError

    run = tmp_path / "r"
    run.mkdir()
    marker = tmp_path / "ran"
    payload = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    (tmp_path / "elsewhere.pickle").write_bytes(payload)
    (run / task.PLANNED).symlink_to(tmp_path / "elsewhere.pickle")
    with pytest.raises(PlanError):
        task.take_planned(str(run))
    (run / task.PLANNED).unlink()
    (run / task.PLANNED).write_bytes(payload)
    os.chmod(run / task.PLANNED, 0o666)
    with pytest.raises(PlanError):
        task.take_planned(str(run))
    assert not marker.exists()


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
    plan = {"format": rundir.FORMAT, "mode": "train", "cluster": "local", "mesh": {"world": 8}, "model": {"name": "m"}}
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

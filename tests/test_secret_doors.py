"""A value typed on the command line for a secret key, and a secret of the environment that a run dir's files or a
job's output hold, never reach a line or a file, in any encoding; and a terminal gets only text from the `python -m
vrun` verbs. Inputs are generated (seeded): secret key spellings under each door (`+env.*`, `hydra.job.env_set.*`,
a verl key named as a secret), awkward values (quotes, backslashes, non-ASCII, commas, brackets, `=`, spaces, very
long), and control sequences (OSC 52, CSI, C0, 8-bit C1). Every door runs the real CLI: a single run, a sweep planned
on forked workers, Hydra's basic sweeper, an override that does not parse, `status`/`runs`/`logs` (--json too)."""
import json
import os
import random
import re
import string
import subprocess
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from conftest import PY, ROOT, runner
from test_guards import PLAIN_SEGMENTS, SECRET_SEGMENTS, spell
from vrun.config import overrides as check_secret
from vrun.core import writer

pytestmark = pytest.mark.stack_free  # one CI leg: see pyproject.toml

SEEDS = (5, 71, 2024)
AWKWARD = ['"', "\\", "'", "é", "ß", "日", ",", "[", "]", "=", " ", "{", "}", ":", "(", ")", "\\'", "\\\\"]


def secret_name(rng) -> str:
    """A variable name the writer's rule calls secret, in one of the spellings people use."""
    segs = [rng.choice(PLAIN_SEGMENTS[:12]), rng.choice(SECRET_SEGMENTS)]
    rng.shuffle(segs)
    name = spell(segs, rng)
    assert writer.is_secret_name(name), name
    return name.replace("-", "_")


def awkward_value(rng, long: bool = False) -> str:
    """At least MIN_SECRET characters, a unique marker, awkward characters among them."""
    core = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(12))
    parts = [core[:6]] + [rng.choice(AWKWARD) + rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 5))]
    parts.append(core[6:])
    if long:
        parts.append("".join(rng.choice(string.ascii_letters) for _ in range(600)))
    return "".join(parts)


def quoted(v: str) -> str:
    """v as a Hydra single-quoted value (a backslash run before a quote or the end doubled, the quote escaped)."""
    q = "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), v) + "'"
    assert OverridesParser.create().parse_override(f"k={q}").value() == v, (v, q)  # what Hydra reads is v
    return q


def encodings(v: str) -> set:
    """Every form a value may take in a line or a file: raw, JSON (ASCII or not), repr, Python/YAML escapes."""
    forms = {v, json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1], repr(v)[1:-1], repr(v),
             v.encode("unicode_escape").decode("ascii"), v.replace("'", "''")}
    return {f for f in forms if len(f) >= writer.MIN_SECRET}


def assert_nowhere(values, proc, *roots):
    text = proc.stdout + proc.stderr
    for v in values:
        for f in encodings(v):
            assert f not in text, (v, f, text[-1500:])
    for root in roots:
        for p in Path(root).rglob("*"):
            if p.is_file():
                data = p.read_bytes().decode("utf-8", "replace")
                for v in values:
                    for f in encodings(v):
                        assert f not in data, (v, f, p)


def env_of(tmp_path, **extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MLITE", "RAY_")) and not k.endswith("MODEL_PATH")}
    e.update(HOME=str(tmp_path / "home"), VRUN_STATE_DIR=str(tmp_path / "state"), **extra)
    return e


# ---------------------------------------------------------------- in-process: the rule and the encodings

@pytest.mark.parametrize("seed", SEEDS)
def test_typed_secret_rule_and_every_encoding_masked(seed):
    """Each door's key takes the writer's rule (env maps: the broad name rule; elsewhere a secret's name); the
    override as quoted shows key=<hidden>; the value registered is masked raw, JSON-escaped and repr'd."""
    rng = random.Random(seed)
    for _ in range(30):
        name, v = secret_name(rng), awkward_value(rng, long=rng.random() < 0.2)
        for key in (f"+env.{name}", f"hydra.job.env_set.{name}", f"+hydra.job.env_set.{name}", f"env.{name}",
                    f"++verl.trainer.{rng.choice(['hf_token', 'api_key', 'wandb_api_key', 'HF_TOKEN'])}"):
            for given in (quoted(v), v, f"{quoted(v)},{quoted(v[::-1])}", f"[{v}"):
                arg = f"{key}={given}"
                assert check_secret.shown_override(arg) == f"{key}=<hidden>", arg
                found = check_secret.typed_secrets([arg])
                assert given in found, arg
        writer.hide([v])
        for text in (f"x {v} y", json.dumps({"a": f"x{v}y"}), json.dumps([v], ensure_ascii=False), repr({"k": v})):
            assert not any(f in writer.mask(text) for f in encodings(v)), text
    for plain in ("verl.trainer.max_token_len=4096", "+env.TOKENIZERS_PARALLELISM=false", "model=glm5_1",
                  "verl.data.prompt_key=prompt", "hydra.job.env_set.CUDA_VISIBLE_DEVICES=0,1"):
        assert check_secret.shown_override(plain) == plain and check_secret.typed_secrets([plain]) == []


# ---------------------------------------------------------------- the runner's doors

@pytest.mark.parametrize("seed", SEEDS)
def test_single_run_and_env_set(seed, tmp_path):
    """A run: +env.<secret> refused in one line, hydra.job.env_set.<secret> (with + and without), a verl key named
    as a secret: no value in any line or file (manifest.json's command included)."""
    rng = random.Random(seed)
    vals = [awkward_value(rng, long=i == 0) for i in range(4)]
    names = [secret_name(rng) for _ in range(4)]
    env = env_of(tmp_path)
    refused = runner("model=qwen3_5_35b", "mode=plan", f"+env.{names[0]}={quoted(vals[0])}",
                     f"++verl.trainer.hf_token={quoted(vals[1])}", f"hydra.run.dir={tmp_path}/r0", env=env,
                     cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-1500:]
    assert f"env.{names[0]}=<hidden>" in refused.stderr and not (tmp_path / "r0").exists()
    unknown = runner("model=qwen3_5_35b", "mode=plan", f"hydra.job.env_set.{names[2]}={quoted(vals[2])}",
                     f"hydra.run.dir={tmp_path}/r1", env=env, cwd=tmp_path)
    assert unknown.returncode == 2 and f"hydra.job.env_set.{names[2]}=<hidden>" in unknown.stderr, unknown.stderr
    planned = runner("model=qwen3_5_35b", "mode=plan", f"+hydra.job.env_set.{names[3]}={quoted(vals[3])}",
                     f"hydra.run.dir={tmp_path}/r2", env=env, cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr[-1500:]
    assert (tmp_path / "r2" / "manifest.json").is_file()
    for p in (refused, unknown, planned):
        assert_nowhere(vals, p, tmp_path)


@pytest.mark.parametrize("seed", SEEDS)
def test_sweep_on_workers(seed, tmp_path):
    """A sweep over a secret's values, planned on two forked workers: every point line names the override as
    key=<hidden>; nothing written (the points are refused)."""
    rng = random.Random(seed)
    vals = [awkward_value(rng) for _ in range(4)]
    name = secret_name(rng)
    env = env_of(tmp_path, VRUN_PLAN_WORKERS="2")
    p = runner("-m", "model=qwen3_5_35b", "mode=plan", "run.experiment_name=a,b",
               f"+env.{name}={','.join(quoted(v) for v in vals)}", f"hydra.sweep.dir={tmp_path}/s", env=env,
               cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-1500:]
    lines = [x for x in p.stderr.splitlines() if x.startswith("point ")]
    assert len(lines) == 8 and all(f"+env.{name}=<hidden>]" in x for x in lines), p.stderr[-1500:]
    assert not (tmp_path / "s").exists()
    assert_nowhere(vals, p, tmp_path)


@pytest.mark.parametrize("seed", SEEDS)
def test_basic_sweeper_writes_nothing(seed, tmp_path):
    """hydra/sweeper=basic is refused before it writes multirun.yaml (it would hold the overrides)."""
    rng = random.Random(seed)
    v, name = awkward_value(rng), secret_name(rng)
    for where in ([f"hydra.sweep.dir={tmp_path}/s"], []):
        p = runner("-m", "hydra/sweeper=basic", "model=qwen3_5_35b", "mode=plan",
                   f"+env.{name}={quoted(v)},{quoted(v[::-1])}", *where, env=env_of(tmp_path), cwd=tmp_path)
        assert p.returncode == 2 and p.stderr.startswith("error: hydra/sweeper=basic: "), p.stderr[-1500:]
        assert not list(tmp_path.rglob("multirun.yaml")) and not (tmp_path / "s").exists()
        assert_nowhere([v, v[::-1]], p, tmp_path)


@pytest.mark.parametrize("seed", SEEDS)
def test_override_that_does_not_parse(seed, tmp_path):
    """The key is known before the `=`: the line names it with <hidden>, never Hydra's echo of the value."""
    rng = random.Random(seed)
    name = secret_name(rng)
    core = "".join(rng.choice(string.ascii_letters) for _ in range(14))
    for i, (key, given) in enumerate([(f"+env.{name}", f"[{core}"), (f"hydra.job.env_set.{name}", f"{core}]x"),
                                      ("+verl.trainer.hf_token", f"'{core}"), (f"+env.{name}", f"{core}\"q'")]):
        p = runner("model=qwen3_5_35b", "mode=plan", "run.experiment_name=x", f"{key}={given}",
                   f"hydra.run.dir={tmp_path}/r{i}", env=env_of(tmp_path), cwd=tmp_path)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-1500:]
        assert p.stderr.strip() == (f"error: {key}=<hidden>: the override does not parse; fix: quote the value "
                                    "(key='...') or balance its brackets (Hydra's override grammar)"), p.stderr
        assert_nowhere([core, given], p, tmp_path)


# ---------------------------------------------------------------- python -m vrun: secrets and terminals

CONTROLS = ["\x1b]52;c;ZXZpbA==\x07", "\x1b]52;c;ZXZpbA==\x1b\\", "\x1b[2J", "\x1b[H", "\x1b[5;10H", "\x1b[3A",
            "\x07", "\r", "\x9b2J", "\x9d52;c;eA==\x9c", "\x08", "\x1bc", "\x1b[?1049h", "\x00", "\x7f"]


def vrun(*args, env):
    return subprocess.run([PY, "-m", "vrun", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def hostile(rng) -> str:
    return "".join(rng.choice(CONTROLS) + rng.choice(["ok ", "step:1 ", "error ", "日本 "]) for _ in range(6))


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_run_dir_files_reach_no_terminal_and_no_secret(seed, tmp_path):
    """A run dir whose event log and job.log carry control sequences and an environment secret (quotes,
    backslashes, non-ASCII): status, runs and logs print neither (--json too, which stays valid JSON)."""
    from vrun.rundir.records import PROGRESS

    rng = random.Random(seed)
    secret = "hf_" + awkward_value(rng) + rng.choice(['"é\\', '\\"ü', 'ß"\\'])  # JSON escapes each of them
    env = env_of(tmp_path, HF_TOKEN=secret)
    run_dir = tmp_path / "r"
    p = runner("model=qwen3_5_35b", "mode=plan", f"hydra.run.dir={run_dir}", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-1500:]
    junk = [hostile(rng) for _ in range(4)]
    with open(run_dir / PROGRESS, "a", encoding="utf-8") as f:  # as a job writes it: the raw bytes, not masked
        f.write(json.dumps({"event": "started", "t": 1.0, "host": "n0" + junk[0], "attempt": 0, "pid": 1}) + "\n")
        f.write(json.dumps({"event": "failed", "t": 2.0, "host": "n0", "attempt": 0, "node": 0,
                            "error": f"boom {junk[1]} token={secret}"}) + "\n")
    (run_dir / "job.log").write_text(f"{junk[2]}\nline {secret} {junk[3]}\n\x1b[31mred\x1b[0m\n", encoding="utf-8")
    outs = []
    for args in (["status", str(run_dir)], ["runs", str(run_dir)], ["logs", str(run_dir)],
                 ["status", "--json", str(run_dir)], ["runs", "--json", str(run_dir)]):
        q = vrun(*args, env=env)
        assert q.returncode == 0, (args, q.stderr[-1500:])
        text = q.stdout + q.stderr
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]", text), (args, repr(text[-800:]))
        if "--json" in args:
            json.loads(q.stdout)
        assert_nowhere([secret], q)
        outs.append(q.stdout)
    assert "failed   on n0" in outs[0] and ": boom \\x" in outs[0] and "token=<hidden>" in outs[0], outs[0]
    assert "line <hidden>" in outs[2] and "red" in outs[2]


def test_error_lines_quoting_a_file_are_text(tmp_path):
    """A run dir file that does not read (plan.json holding control sequences): the one error line is text."""
    env = env_of(tmp_path)
    run_dir = tmp_path / "r"
    p = runner("model=qwen3_5_35b", "mode=plan", f"hydra.run.dir={run_dir}", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-1500:]
    (run_dir / "plan.json").write_text('{"x": 1' + "".join(CONTROLS), encoding="utf-8")
    for verb in ("status", "runs", "logs"):
        q = vrun(verb, str(run_dir), env=env)
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]", q.stdout + q.stderr), (verb, repr(q.stderr))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_cut_line_is_masked_before_the_cut(seed, monkeypatch):
    """A job log's failure line is cut to 300 characters for status: the secret it holds is masked first, so no
    piece of it survives the cut, wherever the cut falls."""
    from vrun.rundir import cause

    rng = random.Random(seed)
    secret = "hf_" + awkward_value(rng, long=True)
    monkeypatch.setenv("HF_TOKEN", secret)
    for at in rng.sample(range(0, 280), 12):
        line = cause.decisive_line([f"RuntimeError: {'x' * at}{secret} tail"])
        assert line is not None and secret[:8] not in line and "<hid" in line, (at, line)

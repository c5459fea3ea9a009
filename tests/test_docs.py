"""The README and docs/ cannot lie: every command they show is run here, the lines they quote from it are checked
against what it prints, and every link and file path they name resolves.

What counts as a command: in any fenced block, a line that starts with `python runner.py`, `python -m vrun`,
`make help` or `make run` (after an optional `$ ` prompt; a trailing `# comment` is dropped). How it runs:
- `python runner.py …` always in plan mode (`mode=` set to `plan`; the page's own mode is what a user runs, the
  plan is what it would run), its run or sweep dir under the test's tmp dir (`hydra.run.dir`/`hydra.sweep.dir`
  replaced or added; `/tmp/vrun-docs` in a command is the test's tmp dir), exit 0 expected — or 2 where the
  page's quoted output holds an `error:` line.
- `python -m vrun VERB …` on a run the test planned: RUN, RUN_A, DIR, `<run dir>`, `<dir>` and a recorded
  session's run dir stand for it, RUN_B for a sweep planned beside it, FILE for a file in the tmp dir; exit 0, or 2
  with one line (a verb that refuses a planned run: logs, cancel, resubmit).
- A synopsis's `[optional]` parts are left out, a pipe's right side too; `model=<name>` is `model=qwen3_5_35b`.
- `127.0.0.1:8265`, in a command and its quoted output, is a port on this machine that the test holds bound and
  not listening: the page shows a dashboard nobody runs, and a Ray cluster beside the tests must not answer it.
- `make help` and `make run` as the Makefile runs them (`make run` is the plan of `runner.py`).
What counts as quoted output: in a ```console block, the lines after a `$ ` command up to the next one; each must
appear in the command's output, a `…` standing for any text (a line of `…` alone skips lines). Other blocks
(```text: a recorded session on a real cluster) have their commands run, their output not compared.
No command may print a traceback.
"""
from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import PY, ROOT

pytestmark = pytest.mark.stack_free  # the project's own pages and CLI; verl enters only as the planner's input

PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)\s*$")
COMMAND = re.compile(r"^(\$ )?(python runner\.py|python -m vrun|make help|make run)\b")
# a repo path in backticks: a top-level entry of the checkout, then a path
PATH = re.compile(r"`((?:vrun|tests|conf|docs|bench|hooks|hydra_plugins|\.ci)/[^`\s]*|Makefile|runner\.py|"
                  r"pyproject\.toml)`")
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def blocks(page: Path) -> list:
    """(info string, [lines]) of each fenced block."""
    out, cur, info = [], None, ""
    for line in page.read_text().splitlines():
        m = FENCE.match(line)
        if m and cur is None:
            cur, info = [], m.group(1)
        elif line.strip() == "```" and cur is not None:
            out.append((info, cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return out


def commands(page: Path) -> list:
    """(command, quoted output lines or None) in page order."""
    out = []
    for info, lines in blocks(page):
        i = 0
        while i < len(lines):
            m = COMMAND.match(lines[i])
            if not m:
                i += 1
                continue
            cmd = lines[i][2:] if m.group(1) else lines[i]
            cmd = re.sub(r"\s+#.*$", "", cmd).strip()
            quoted = None
            if info == "console" and m.group(1):
                quoted = []
                i += 1
                while i < len(lines) and not lines[i].startswith("$ "):
                    quoted.append(lines[i])
                    i += 1
            else:
                i += 1
            out.append((cmd, quoted))
    return out


ALL = [(p, c, q) for p in PAGES for c, q in commands(p)]


def test_the_pages_show_commands():
    """The README and every cluster page show at least one command each (a page without one says nothing run)."""
    shown = {p.name for p, _, _ in ALL}
    assert {"README.md", "cluster-slurm.md", "cluster-ray.md", "cluster-kuberay.md", "runs.md", "watching.md",
            "memory.md", "time-and-cost.md", "checks.md", "configuration.md", "mesh.md"} <= shown, shown


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_and_link_resolves(page):
    text = page.read_text()
    missing = []
    for m in PATH.finditer(text):
        path = m.group(1).rstrip(".,:;)")
        if any(ch in path for ch in "<*{…") or not re.search(r"(\.[a-z]+|/)$", path.split(":")[0]):
            continue  # a placeholder, or a name that is no file (a label such as vrun/run-id)
        if not (ROOT / path.split(":")[0]).exists():
            missing.append(path)
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z]+://", target):
            continue
        if not (page.parent / target).exists():
            missing.append(f"link {target}")
    assert not missing, f"{page.name} names what is not in the checkout: {missing}"


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A run planned here, for the verbs the pages show: (run dir, sweep dir holding two points)."""
    base = tmp_path_factory.mktemp("docs-runs")
    run = base / "run"
    p = subprocess.run([PY, "runner.py", "model=qwen3_5_35b", "algo=grpo", "mode=plan", f"hydra.run.dir={run}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    sweep = base / "sweep"
    p = subprocess.run([PY, "runner.py", "-m", "model=qwen3_5_35b", "optimizer=fsdp2,dist_opt", "mode=plan",
                        f"hydra.sweep.dir={sweep}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return run, sweep


def as_run(cmd: str, tmp: Path, planned) -> list:
    """The argv a page's command runs as here (see the module's docstring)."""
    run, sweep = planned
    cmd = cmd.replace("/tmp/vrun-docs", str(tmp / "vrun-docs")).replace("model=<name>", "model=qwen3_5_35b")
    cmd = re.sub(r"\s\[[^\]]*\]", "", cmd.split(" | ")[0])  # a synopsis: its [optional] parts left out
    argv = shlex.split(cmd)
    if argv[:2] == ["python", "runner.py"]:
        multirun = any(a in ("-m", "--multirun") for a in argv)
        rest = [a for a in argv[2:] if not a.startswith(("mode=", "hydra.run.dir=", "hydra.sweep.dir="))]
        given = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv[2:] if "=" in a}
        where = [f"hydra.sweep.dir={tmp / 'sweep'}"] if multirun else \
            [f"hydra.run.dir={given.get('hydra.run.dir') if str(tmp) in given.get('hydra.run.dir', '') else tmp / 'run'}"]
        return [PY, "runner.py", *rest, "mode=plan", *where]
    if argv[:3] == ["python", "-m", "vrun"]:
        out = [PY, "-m", "vrun"]
        for a in argv[3:]:
            if a == "RUN_B":
                a = str(sweep)
            elif a == "FILE":
                a = str(tmp / "out")
            elif a in ("RUN", "RUN_A", "DIR") or a.startswith("<") or ("/" in a and not Path(a).exists()):
                a = str(run)  # a placeholder, or a run dir of a recorded session
            elif a.endswith(">"):
                continue
            out.append(a)
        return out
    return argv


def matches(quoted: list, printed: list) -> list:
    """The quoted lines that the printed ones do not hold, in order (`…` stands for any text)."""
    missing, at = [], 0
    for q in quoted:
        q = q.rstrip()
        if not q or q.strip() == "…":
            continue
        parts = [re.escape(x.strip()) for x in q.split("…")]
        rx = re.compile(".*".join(parts))
        for j in range(at, len(printed)):
            if rx.search(printed[j]):
                at = j + 1
                break
        else:
            missing.append(q)
    return missing


NOBODY = "127.0.0.1:8265"  # the pages' dashboard address that nothing answers


@pytest.mark.parametrize("page,cmd,quoted", ALL, ids=[f"{p.name}:{c[:60]}" for p, c, _ in ALL])
def test_every_command_runs_as_the_page_says(page, cmd, quoted, tmp_path, planned):
    with socket.socket() as closed:  # bound, never listening: a connection to it is refused
        closed.bind(("127.0.0.1", 0))
        here = f"127.0.0.1:{closed.getsockname()[1]}"
        cmd = cmd.replace(NOBODY, here)
        quoted = None if quoted is None else [q.replace(NOBODY, here) for q in quoted]
        _runs_as_the_page_says(page, cmd, quoted, tmp_path, planned)


def _runs_as_the_page_says(page, cmd, quoted, tmp_path, planned):
    argv = as_run(cmd, tmp_path, planned)
    (tmp_path / "vrun-docs").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MLITE_ROOT",) and not k.endswith("MODEL_PATH")}
    env["PATH"] = f"{Path(PY).parent}:{env['PATH']}"
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    out = p.stdout + p.stderr
    assert "Traceback" not in out, f"{page.name}: {cmd}\n{out[-3000:]}"
    refuses = quoted is not None and any(q.startswith("error:") for q in quoted)
    if argv[1:3] == ["-m", "vrun"]:
        assert p.returncode in (0, 2), f"{page.name}: {cmd} exited {p.returncode}\n{out[-3000:]}"
        if p.returncode == 2:
            assert p.stderr.count("\n") == 1 and p.stderr.startswith("error:"), p.stderr
    else:
        assert p.returncode == (2 if refuses else 0), f"{page.name}: {cmd} exited {p.returncode}\n{out[-3000:]}"
    if quoted:
        missing = matches(quoted, out.splitlines())
        assert not missing, f"{page.name}: `{cmd}` does not print {missing}\n--- it printed:\n{out[-4000:]}"

"""`python -m vrun diff RUN_A RUN_B`: what differs between two runs, section by section, leaf by leaf
(`key: a → b`). Paths inside each run's own dir are shown as <run dir>, so two sweep points compare by what
they do, not where they live. Environment variables: names and non-secret values only."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from vrun.core.writer import is_secret_name
from vrun.rundir.state import Run
from vrun.core import fs

ABSENT = "(absent)"


def flatten(obj, prefix: str = "") -> dict:
    """Leaves of nested dicts as dotted keys; lists are leaves."""
    if isinstance(obj, dict) and obj:
        out = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj} if prefix else {}


def changes(a: dict, b: dict) -> list[tuple]:
    return [(k, a.get(k, ABSENT), b.get(k, ABSENT)) for k in sorted(set(a) | set(b))
            if a.get(k, ABSENT) != b.get(k, ABSENT)]


def _read(d: Path, name: str):
    p = d / name
    if not fs.is_file(p):
        return None
    from vrun.rundir.state import RunDirError

    from vrun.rundir.files import LIMIT

    raw, why = fs.read_checked(p, LIMIT, own=True, binary=True)
    if raw is None:
        raise RunDirError(str(p), "refused", why, "plan the run again")
    try:
        text = raw.decode("utf-8")
        if name.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError
        raise RunDirError(str(p), "unreadable", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}",
                          "plan the run again") from None
    except Exception as e:  # noqa: BLE001 - yaml.YAMLError
        raise RunDirError(str(p), "not YAML", str(e).splitlines()[0][:120], "plan the run again") from None
    if data is not None and not isinstance(data, dict):
        raise RunDirError(str(p), type(data).__name__, "not a mapping", "plan the run again")
    return data


def _local(obj, run_dir: str):
    """Replace the run's own dir inside values by <run dir>."""
    if isinstance(obj, str):
        return obj.replace(run_dir, "<run dir>")
    if isinstance(obj, list):
        return [_local(v, run_dir) for v in obj]
    if isinstance(obj, dict):
        return {k: _local(v, run_dir) for k, v in obj.items()}
    return obj


def overrides(manifest) -> dict:
    out = {}
    for arg in (manifest or {}).get("overrides") or []:
        key, _, value = arg.partition("=")
        out[key.lstrip("+~")] = value
    return out


def env_view(plan: dict) -> dict:
    out = {}
    for k, v in (plan.get("env") or {}).items():
        out[f"set {k}"] = "<not shown>" if is_secret_name(str(k)) else v
    for k in plan.get("env_unset") or []:
        out[f"unset {k}"] = "unset"
    for k in plan.get("pass_env") or []:
        out[f"pass {k}"] = "from the environment, by name"
    return out


def versions(manifest) -> dict:
    m = manifest or {}
    out = {f"{name}": v.get("version") + (f" @ {v['commit'][:12]}" if v.get("commit") else "")
           for name, v in (m.get("packages") or {}).items()}
    git = m.get("git") or {}
    if git.get("commit"):
        out["vrun (git)"] = git["commit"][:12] + (" + uncommitted changes" if git.get("dirty") else "")
    return out


def sections(a: Run, b: Run) -> list[tuple[str, list]]:
    """(title, [(key, value in A, value in B)]) for every section."""
    ma, mb = _read(a.dir, "manifest.json"), _read(b.dir, "manifest.json")
    va, vb = _read(a.dir, "verl_config.yaml"), _read(b.dir, "verl_config.yaml")
    pa, pb = _local(asdict(a.plan), str(a.dir)), _local(asdict(b.plan), str(b.dir))

    def mlite(p: dict) -> dict:
        m = p.get("mlite") or {}
        return {"verl_mlite": f"{m.get('source')} {m.get('location') or ''}".strip()}

    out = [
        ("run", changes(_head(pa), _head(pb))),
        ("overrides", changes(overrides(ma), overrides(mb))),
        ("verl config", changes(flatten(_local(va or {}, str(a.dir))), flatten(_local(vb or {}, str(b.dir))))),
        ("mesh", changes(pa.get("mesh") or {}, pb.get("mesh") or {})),
        ("batch", changes(flatten(pa.get("batch") or {}), flatten(pb.get("batch") or {}))),
        ("env", changes(env_view(pa), env_view(pb))),
        ("slurm", changes(flatten(submission(a.slurm)), flatten(submission(b.slurm)))),
        ("versions", changes({**versions(ma), **mlite(pa)}, {**versions(mb), **mlite(pb)})),
    ]
    return out


def _head(p: dict) -> dict:
    return {"model": p.get("model", {}).get("name"), "algo": p.get("algo"), "mode": p.get("mode"),
            "optimizer": p.get("optimizer"), "cluster": p.get("cluster"), "model path": p.get("model", {}).get("path")}


def render(a: Run, b: Run) -> str:
    lines = [f"A {a.dir}", f"B {b.dir}"]
    total = 0
    for title, rows in sections(a, b):
        total += len(rows)
        lines.append(f"{title}: {'same' if not rows else f'{len(rows)} difference(s)'}")
        for key, x, y in rows:
            lines.append(f"  {key}: {_show(x)} → {_show(y)}")
    if not total:
        lines.append("the two runs planned the same thing")
    return "\n".join(lines)


def _show(v) -> str:
    if v is ABSENT:
        return ABSENT
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    if v is None:
        return "null"
    return str(v)


def submission(slurm: dict | None) -> dict:
    """slurm_job.json's submission in one form (run dirs written before hold the field-per-knob form)."""
    from vrun.launch.slurm.submit import Submission

    spec = (slurm or {}).get("spec")
    return Submission.load(spec).saved() if spec else {}

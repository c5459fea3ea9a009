"""Step times learned from the runs the project launched: one small record in the user's state dir
(<state dir>/calibration.json; vrun.rundir.records.state_dir), kept per kind of run (model, GPU part, rollout engine,
algorithm). Each entry is a run's measured step time (verl's timing_s/step, its median after the first step) beside
the estimate's uncalibrated middle; the next plan of the same kind scales its estimate by their median ratio and
says so ("calibrated from 3 runs"). Written through the project's writer; a missing or corrupt record is no
calibration.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from vrun.core import writer
from vrun.rundir import records as rundir

FILE = "calibration.json"
KEEP = 20          # runs kept per kind (the newest)
LIMIT = 1 << 20    # bytes: the record holds at most KEEP entries per kind
STEP_S = (0.01, 1e6)   # a step time that is a measurement (seconds), measured and predicted alike
RATIO = (0.02, 50.0)   # measured / predicted a calibration may apply; outside, the entry is not believed


def path(environ: Optional[dict] = None) -> Optional[Path]:
    d = rundir.state_dir(environ)
    return None if d is None else d / FILE


def sane(measured_s, predicted_s) -> Optional[str]:
    """Why an entry is not a calibration (not a number, not finite, outside STEP_S, a ratio outside RATIO), or None."""
    for name, x in (("measured_s", measured_s), ("predicted_s", predicted_s)):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return f"{name} is {type(x).__name__}, not a number"
        if not STEP_S[0] <= x <= STEP_S[1]:  # NaN and inf fail too
            return f"{name}={x} is outside {STEP_S[0]}–{STEP_S[1]:.0e} s"
    if not RATIO[0] <= measured_s / predicted_s <= RATIO[1]:
        return f"measured/predicted={measured_s / predicted_s:.3g} is outside {RATIO[0]}–{RATIO[1]:g}"
    return None


def key(kind: dict) -> str:
    return "|".join(str(kind.get(k)) for k in ("model", "gpu", "engine", "algo"))


def load() -> dict:
    """The record; {} when there is none, or it is refused (not the user's own, a link, a FIFO, too large, not a
    JSON object: said in one line)."""
    from vrun.core import fs

    p = path()
    if p is None:
        return {}
    text, why = fs.read_checked(p, LIMIT, own=True)
    if text is None:
        if why != "no such file":
            fs.ignored(p, why, "no calibration")
        return {}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        fs.ignored(p, "not a JSON object", "no calibration")
        return {}
    return data


def entries(kind: dict) -> list:
    """The kind's entries that are measurements; one outside sane bounds (sane) is ignored, saying so."""
    from vrun.core import fs

    out = []
    es = load().get(key(kind))
    for e in es if isinstance(es, list) else []:
        if not isinstance(e, dict):
            continue
        why = sane(e.get("measured_s"), e.get("predicted_s"))
        if why:
            fs.ignored(path(), f"{key(kind)} entry of run {e.get('run_dir')!s:.200}: {why}", "not a calibration",
                       f"remove the entry, or the file (rm {path()})")
            continue
        out.append({**e, "measured_s": float(e["measured_s"]), "predicted_s": float(e["predicted_s"])})
    return out


def record(kind: dict, run_dir: str, measured_s: float, predicted_s: float, steps: int) -> bool:
    """Add (or replace) a run's entry; never fails the caller. Returns whether the record changed."""
    if sane(measured_s, predicted_s):
        return False
    data = load()
    k = key(kind)
    old = [e for e in data.get(k) or [] if isinstance(e, dict)]
    mine = [e for e in old if e.get("run_dir") == str(run_dir)]
    entry = {"run_dir": str(run_dir), "measured_s": round(measured_s, 2), "predicted_s": round(predicted_s, 2),
             "steps": steps}
    if mine and all(mine[0].get(f) == entry[f] for f in entry):
        return False
    data[k] = ([e for e in old if e.get("run_dir") != str(run_dir)] + [{**entry, "t": round(time.time(), 1)}])[-KEEP:]
    p = path()
    if p is None:
        return False
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        writer.write_text(p, json.dumps(data, indent=1) + "\n", root=str(p.parent))  # whole, masked, no link
    except OSError:
        return False
    return True


def apply(st, kind: dict):
    """The estimate calibrated by the recorded runs of this kind (unchanged when there are none)."""
    from vrun.estimate import steptime

    es = entries(kind)
    if not es or st.model_middle <= 0:
        return st
    ratios = [e["measured_s"] / e["predicted_s"] for e in es]
    return steptime.calibrated(st, ratios, f"calibrated from {len(es)} run{'s' if len(es) > 1 else ''}")

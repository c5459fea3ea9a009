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


def path(environ: Optional[dict] = None) -> Path:
    return rundir.state_dir(environ) / FILE


def key(kind: dict) -> str:
    return "|".join(str(kind.get(k)) for k in ("model", "gpu", "engine", "algo"))


def load() -> dict:
    try:
        data = json.loads(path().read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def entries(kind: dict) -> list:
    out = []
    for e in load().get(key(kind)) or []:
        try:
            m, p = float(e["measured_s"]), float(e["predicted_s"])
        except (KeyError, TypeError, ValueError):
            continue
        if m > 0 and p > 0:
            out.append({**e, "measured_s": m, "predicted_s": p})
    return out


def record(kind: dict, run_dir: str, measured_s: float, predicted_s: float, steps: int) -> bool:
    """Add (or replace) a run's entry; never fails the caller. Returns whether the record changed."""
    if not (measured_s > 0 and predicted_s > 0):
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

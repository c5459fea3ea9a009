"""plan.svg's and overview.svg's panels, drawn with matplotlib (Agg/SVG, imported only here) from plan.json.

plan.svg, three panels: per pipeline stage, the training and rollout phases' memory per GPU as stacked bars against
the GPU's memory line; the step-time estimate per phase (low and high); the GPU grid (nodes × GPUs per node)
coloured by pipeline stage with the rollout replicas outlined. Every artist the tests look for carries an SVG id
(gid): `stage<S>-<phase>-<part>` for a bar segment, `gpu-limit`, `time-<phase>`, `gpu-cells` (a collection: one path
per GPU), `rollout-replicas` (one path per replica); a sweep's overview: `point-<i>-memory`, `point-<i>-time`.
vrun.planning.picture names the files and draws a single run's picture in a child process beside the plan.
"""
from __future__ import annotations

import os
from pathlib import Path

TRAIN_PARTS = ("weights", "grads", "optimizer", "activations", "logits", "transient")


ROLLOUT_PARTS = ("vllm", "residents")


# GPUs drawn one cell each (plan.svg ~850 kB at this many); a larger mesh is drawn a block per pipeline stage
MAX_CELLS = 4096


COLOURS = {"weights": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52",
           "logits": "#8172b3", "transient": "#937860", "vllm": "#64b5cd", "residents": "#8c8c8c"}


def stage_memory(plan: dict) -> list[dict]:
    """Per pipeline stage, GiB per GPU: {"stage", "training": {part: GiB}, "rollout": {part: GiB}}.

    The one place that reads per-stage memory from plan.json: `memory.stages` when the plan carries it, else the
    busiest stage's estimate spread over the stages by their parameters per rank (params.per_stage) and their
    decoder layers (activations); the loss stage alone holds the logits."""
    mem = plan.get("memory") or {}
    if "weights_gib" not in mem:
        return []
    vllm = float(mem.get("rollout_gib") or 0.0)
    stages = mem.get("stages")
    if stages:
        return [{"stage": int(s.get("stage", i)),
                 "training": {"weights": s.get("params_gib", 0.0), "grads": s.get("grads_gib", 0.0),
                              "optimizer": s.get("optimizer_gib", 0.0), "activations": s.get("activations_gib", 0.0),
                              "logits": s.get("logits_gib", 0.0), "transient": s.get("transient_gib", 0.0)},
                 "rollout": {"vllm": vllm, "residents": s.get("rollout_residents_gib",
                                                              mem.get("rollout_residents_gib", 0.0))}}
                for i, s in enumerate(stages)]
    per = ((plan.get("params") or {}).get("per_stage")) or []
    busy = int(mem.get("stage") or 0)
    if not per or busy >= len(per):
        per, busy = [{"stage": 0, "layers": 1, "per_rank": 1, "has_loss": True}], 0
    ref = per[busy]
    out = []
    for s in per:
        w = (s.get("per_rank") or 0) / (ref.get("per_rank") or 1)
        layers = (s.get("layers") or 0) / (ref.get("layers") or 1)
        train = {"weights": mem["weights_gib"] * w, "grads": mem["grads_gib"] * w,
                 "optimizer": mem["optimizer_gib"] * w,
                 "activations": mem["activations_gib"] * layers,
                 "logits": mem["logits_gib"] if s.get("has_loss") and ref.get("has_loss") else 0.0}
        out.append({"stage": int(s.get("stage", len(out))), "training": train,
                    "rollout": {"vllm": vllm, "residents": float(mem.get("rollout_residents_gib") or 0.0) * w}})
    return out


def gpu_layout(plan: dict) -> tuple[int, int, list, list]:
    """(nodes, GPUs per node, pipeline stage per rank, rollout replica per rank). Megatron's rank order puts the
    pipeline outermost (a stage is world/PP consecutive ranks); a rollout replica is TP·DP consecutive ranks."""
    m = plan.get("mesh") or {}
    nodes, gpn = int(m.get("nnodes") or 1), int(m.get("gpus_per_node") or 1)
    world, pp = nodes * gpn, max(int(m.get("pp") or 1), 1)
    stage = [r // max(world // pp, 1) for r in range(world)]
    r = ((plan.get("batch") or {}).get("rollout")) or {}
    size = int(r.get("tp") or 0) * int(r.get("dp") or 1)
    replica = [x // size for x in range(world)] if size > 0 else []
    return nodes, gpn, stage, replica


def figure():
    # matplotlib's font cache goes to vrun's own state dir (beside the runs index), never the user's home
    if "MPLCONFIGDIR" not in os.environ:
        from vrun.rundir import records

        d = records.state_dir()
        if d is not None:
            os.environ["MPLCONFIGDIR"] = str(d / "matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    # text stays text in the SVG (no glyph outlines): smaller and several times faster to write
    matplotlib.rcParams["svg.fonttype"] = "none"
    from matplotlib.figure import Figure

    return Figure


def render(plan: dict, out: str) -> str:
    """Draw plan.json's picture into `out` (SVG). Returns the path."""
    Figure = figure()
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Patch, Rectangle

    fig = Figure(figsize=(14, 9))
    grid = fig.add_gridspec(2, 2, height_ratios=[3, 2], left=0.06, right=0.98, bottom=0.07, top=0.92, hspace=0.3,
                            wspace=0.15)
    ax_mem, ax_time, ax_gpu = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[:, 1])
    model = (plan.get("model") or {}).get("name", "?")
    fig.suptitle(f"{model} · {plan.get('algo')} · {(plan.get('mesh') or {}).get('world')} GPUs — estimates "
                 "(plan.json says how)", fontsize=11)

    stages = stage_memory(plan)
    limit = (plan.get("memory") or {}).get("gpu_mem_gib")
    for s in stages:
        for offset, phase, parts in ((-0.2, "training", s["training"]), (0.2, "rollout", s["rollout"])):
            bottom = 0.0
            for name, gib in parts.items():
                if not gib:
                    continue
                bar = ax_mem.bar(s["stage"] + offset, gib, width=0.38, bottom=bottom, color=COLOURS.get(name, "#999"),
                                 edgecolor="white", linewidth=0.3)
                bar.patches[0].set_gid(f"stage{s['stage']}-{phase}-{name}")
                bottom += gib
    if limit:
        line = ax_mem.axhline(limit, color="black", linestyle="--", linewidth=1)
        line.set_gid("gpu-limit")
        ax_mem.text(0.0, limit, f" GPU memory {limit:g} GiB", va="bottom", fontsize=8,
                    transform=ax_mem.get_yaxis_transform())
    ax_mem.set_xticks([s["stage"] for s in stages], [f"PP{s['stage']}" for s in stages], fontsize=7)
    ax_mem.set_ylabel("GiB per GPU (estimate)")
    ax_mem.set_title("memory per stage: training (left) · rollout (right)", fontsize=9)
    used = [n for n in COLOURS if any(s["training"].get(n) or s["rollout"].get(n) for s in stages)]
    ax_mem.legend(handles=[Patch(color=COLOURS[n], label=n) for n in used], fontsize=7, ncol=4, loc="upper right")

    t = plan.get("time") or {}
    phases = t.get("phases") or {}
    for i, (name, p) in enumerate(phases.items()):
        seg = ax_time.barh(i, p["high_s"] - p["low_s"], left=p["low_s"], color="#c6dbef", edgecolor="#4c72b0")
        seg.patches[0].set_gid(f"time-{name}")
        ax_time.plot([p.get("middle_s", p["low_s"])] * 2, [i - 0.35, i + 0.35], color="#08306b", linewidth=1.5)
    ax_time.set_yticks(range(len(phases)), list(phases), fontsize=8)
    ax_time.invert_yaxis()
    ax_time.set_xlabel("seconds per step (estimate: low–high, the middle marked)")
    title = f"step ≈ {t.get('step_low_s')}–{t.get('step_high_s')} s" if phases else "no step-time estimate"
    if (t.get("calibration") or {}).get("from"):
        title += f" ({t['calibration']['from']})"
    ax_time.set_title(title, fontsize=9)

    nodes, gpn, stage, replica, boxes, note = _gpu_grid(plan)
    cmap = _stage_colours(max(stage) + 1 if stage else 1)
    if note:  # a mesh too large to draw GPU by GPU: one block per pipeline stage
        cells = [_span(first, last, gpn) for first, last in boxes]
        boxes = []
    else:
        cells = [Rectangle((r % gpn, r // gpn), 0.92, 0.92) for r in range(nodes * gpn)]
        boxes = [_span(first, last, gpn) for first, last in _runs(replica)]
    grid_cells = PatchCollection(cells, facecolors=[cmap[s % len(cmap)] for s in stage], edgecolors="none")
    grid_cells.set_gid("gpu-cells")   # one path per GPU, rank order (node-major); per stage when aggregated
    ax_gpu.add_collection(grid_cells)
    if boxes:
        outlines = PatchCollection(boxes, facecolors="none", edgecolors="black", linewidths=0.8)
        outlines.set_gid("rollout-replicas")   # one path per replica
        ax_gpu.add_collection(outlines)
    ax_gpu.set_xlim(-0.2, gpn + 0.1)
    ax_gpu.set_ylim(nodes + 0.1, -0.2)
    ax_gpu.set_xlabel("GPU in node")
    ax_gpu.set_ylabel("node")
    ax_gpu.set_aspect("auto")
    r = ((plan.get("batch") or {}).get("rollout")) or {}
    ax_gpu.set_title(note or (f"GPUs coloured by pipeline stage; rollout replicas (TP{r.get('tp')}·DP{r.get('dp')}) "
                     "outlined" if replica else "GPUs coloured by pipeline stage"), fontsize=9)
    ax_gpu.legend(handles=[Patch(color=cmap[s % len(cmap)], label=f"PP{s}") for s in sorted(set(stage))[:16]],
                  fontsize=7,
                  loc="upper right", ncol=2)
    _save(fig, out)
    return out


def _save(fig, out: str) -> None:
    """The figure as SVG text, written through the project's writer into the picture's own folder (masked, never
    through a link, replaced whole: a reader never sees half a picture)."""
    import io

    from vrun.core import writer

    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    writer.write_text(out, buf.getvalue(), root=str(Path(out).parent))


def _span(first: int, last: int, gpn: int):
    """The rectangle of ranks first..last on the node × GPU grid (a row's part, or whole rows)."""
    from matplotlib.patches import Rectangle

    n0, g0 = divmod(first, gpn)
    n1, g1 = divmod(last, gpn)
    if n0 == n1:
        return Rectangle((g0 - 0.03, n0 - 0.03), g1 - g0 + 0.98, 0.98)
    return Rectangle((-0.03, n0 - 0.03), gpn + 0.02, n1 - n0 + 0.98)


def _gpu_grid(plan: dict) -> tuple:
    """What the GPU panel draws: (nodes, GPUs per node, colour per cell, replica per rank, stage spans, note). Up
    to MAX_CELLS GPUs, a cell per GPU (gpu_layout); beyond, a block per pipeline stage (at most MAX_CELLS of them)
    and no replica outlines, said in the note: the picture's size and drawing time stay bounded at any mesh."""
    m = plan.get("mesh") or {}
    nodes, gpn = _count(m.get("nnodes")), _count(m.get("gpus_per_node"))
    world = nodes * gpn
    if world <= MAX_CELLS:
        nodes, gpn, stage, replica = gpu_layout(plan)
        return nodes, gpn, stage, replica, [], ""
    pp = min(_count(m.get("pp")), world)
    per = max(world // pp, 1)
    spans = [(s * per, min((s + 1) * per, world) - 1) for s in range(min(pp, MAX_CELLS))]
    if pp > MAX_CELLS:
        spans = [(0, world - 1)]
    note = (f"{world:,} GPUs: too many to draw one by one (over {MAX_CELLS:,}); a block per pipeline stage"
            if len(spans) > 1 else f"{world:,} GPUs in {pp:,} pipeline stages: drawn as one block")
    return nodes, gpn, list(range(len(spans))), [], spans, note


def _count(v) -> int:
    """A count from plan.json for drawing: a positive integer, else 1."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1


def _stage_colours(n: int) -> list:
    from matplotlib import colormaps

    cm = colormaps["tab20" if n > 10 else "tab10"]
    return [cm(i % cm.N) for i in range(n)]


def _runs(replica: list) -> list:
    """(first rank, last rank) of each replica."""
    out: list = []
    for r, x in enumerate(replica):
        if not out or replica[out[-1][0]] != x:
            out.append([r, r])
        else:
            out[-1][1] = r
    return [tuple(x) for x in out]


# a sweep point's memory verdict (plan.json memory: fits — the GPU holds the band's high end —, may_fit — its low end)
VERDICT_COLOURS = {"fits": "#4c72b0", "inside the band": "#dd8452", "does not fit": "#c44e52"}


def verdict_of(mem: dict) -> str:
    if mem.get("fits") is True:
        return "fits"
    return "inside the band" if mem.get("may_fit") is True else "does not fit"


def render_overview(points: list, out: str) -> str:
    """A sweep's points: peak memory per GPU (bars, the GPU's line) and the step-time estimate (low–high)."""
    Figure = figure()

    fig = Figure(figsize=(max(8, len(points) * 0.25 + 4), 5))
    fig.subplots_adjust(bottom=0.35)
    ax = fig.add_subplot(111)
    ax2 = ax.twinx()
    limit = None
    for i, (name, plan) in enumerate(points):
        mem = plan.get("memory") or {}
        peak = mem.get("peak_gib")
        limit = limit or mem.get("gpu_mem_gib")
        if peak is not None:
            b = ax.bar(i, peak, color=VERDICT_COLOURS[verdict_of(mem)], width=0.6)
            b.patches[0].set_gid(f"point-{i}-memory")
            band = mem.get("band_gib")
            if isinstance(band, list) and len(band) == 2 and all(isinstance(x, (int, float)) for x in band):
                (ln,) = ax.plot([i, i], band, color="#555555", linewidth=1)
                ln.set_gid(f"point-{i}-band")
        t = plan.get("time") or {}
        if t.get("step_low_s") is not None:
            (ln,) = ax2.plot([i, i], [t["step_low_s"], t["step_high_s"]], color="black", linewidth=2)
            ln.set_gid(f"point-{i}-time")
    if limit:
        ax.axhline(limit, color="black", linestyle="--", linewidth=1).set_gid("gpu-limit")
    ax.set_xticks(range(len(points)), [n for n, _ in points], rotation=90, fontsize=6)
    ax.set_ylabel("peak GiB per GPU (estimate and band; blue: fits, amber: inside the band, red: does not fit)")
    ax2.set_ylabel("step seconds (estimate, low–high)")
    _save(fig, out)
    return out

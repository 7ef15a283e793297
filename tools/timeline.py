"""A run's goodput timeline as a picture (`ddpkit plot RUN_DIR --timeline`): one row per
attempt, its productive time, each failure (kind, rank, node) and what it cost (detection,
restart, reload, steps redone), and the checkpoint saves; from the goodput records, so the run
dir of any backend (a user's script that notes no steps shows its attempts and failures).

The spans are the report's own (train/goodput/report.py): a failure's cost is drawn where the
report counts it, so the picture and `goodput.json` never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# category -> (colour, legend label): one colour per kind of time, the report's names
COLOURS = {
    "startup": ("#b0b0b0", "start-up"),
    "productive": ("#2e9d4a", "productive"),
    "recompute": ("#e07b39", "steps redone"),
    "detection": ("#c0392b", "detection"),
    "restart": ("#8e44ad", "restart"),
    "reload": ("#2c7fb8", "checkpoint reload"),
}


@dataclass
class Span:
    row: int  # the attempt
    start: float  # seconds since the run's first record
    width: float
    what: str  # a COLOURS key


@dataclass
class Timeline:
    spans: list[Span]
    attempts: list[tuple[float, float, str]]  # per row: start, end, its label
    saves: list[tuple[int, float, float, int | None]]  # row, time, blocking s, step
    failures: list[tuple[int, float, str]]  # row, time, its label
    title: str


def build(recs: list[dict[str, Any]], rep: Any) -> Timeline:
    """The timeline of one run's records (train.goodput.read) and its report."""
    t0 = recs[0]["time"]
    groups: dict[tuple[Any, int], list[dict[str, Any]]] = {}
    for r in recs:
        if r["kind"] != "inject":
            groups.setdefault((r.get("launch"), int(r.get("attempt") or 0)), []).append(r)
    order = sorted(groups.values(), key=lambda g: g[0]["time"])
    spans: list[Span] = []
    attempts, saves = [], []
    launches: dict[Any, int] = {}
    for i, g in enumerate(order):
        start, end = g[0]["time"] - t0, g[-1]["time"] - t0
        launch = launches.setdefault(g[0].get("launch"), len(launches))
        label = f"attempt {i}" + (f" (launch {launch + 1})" if launch else "")
        attempts.append((start, end, label))
        ready = next((r for r in g if r["kind"] == "ready"), None)
        done = next((r for r in g if r["kind"] in ("done", "stop")), None)
        g_saves = [r for r in g if r["kind"] == "save"]
        for s in g_saves:
            step = s.get("step") if isinstance(s.get("step"), int) else None
            saves.append((i, s["time"] - t0, float(s.get("blocking_s") or 0), step))
        if ready is None:
            continue
        load = float(ready.get("load_s") or 0)
        r_at = ready["time"] - t0
        if i == 0 or not rep.failures:
            spans.append(Span(i, start, max(0.0, r_at - load - start), "startup"))
        if i == 0 and load:
            spans.append(Span(i, r_at - load, load, "reload"))
        kept_end = ((done or (g_saves[-1] if g_saves else ready))["time"]) - t0
        spans.append(Span(i, r_at, max(0.0, kept_end - r_at), "productive"))
    fails = []
    for f in rep.failures:
        row = min(f.attempt, len(order) - 1)
        at = f.at - t0
        if f.recompute_s:
            spans.append(Span(row, at - f.recompute_s, f.recompute_s, "recompute"))
        # detection on the failing attempt's row; the restart (the next attempt's start-up,
        # a requeue's time in the queue) and the reload on the next attempt's
        nxt = min(row + 1, len(order) - 1) if f.recovered else row
        t = at
        for what, width, on in (("detection", f.detect_s, row), ("restart", f.restart_s, nxt),
                                ("reload", f.load_s, nxt)):  # fmt: skip
            if width:
                spans.append(Span(on, t, width, what))
            t += width
        who = f"rank {f.rank}" if f.rank is not None else ""
        where = f" on {f.node}" if f.node else ""
        redo = "?" if f.recompute_s is None else f"{f.recompute_s:.1f}"
        fails.append((row, at, f"{f.kind} {who}{where}: {f.lost_s:.1f} s lost "
                      f"(detect {f.detect_s:.1f}, restart {f.restart_s:.1f}, reload "
                      f"{f.load_s:.1f}, redo {redo})".replace("  ", " ")))  # fmt: skip
    title = f"{rep.line()} (wall {rep.wall_s:.0f} s, {rep.attempts} attempt(s))"
    return Timeline(spans, attempts, saves, fails, title)


def figure(tl: Timeline, name: str) -> Any:
    """The matplotlib Figure (what `draw` writes; tests read its artists by gid)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed on a cluster node
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = len(tl.attempts)
    fig, ax = plt.subplots(figsize=(11, 1.6 + 1.1 * rows))
    for i, (start, end, _) in enumerate(tl.attempts):
        ax.barh(i, end - start, left=start, height=0.7, color="none", edgecolor="#555555",
                linewidth=0.8, gid="attempt")  # fmt: skip
    for s in tl.spans:
        colour = COLOURS[s.what][0]
        ax.barh(s.row, s.width, left=s.start, height=0.5, color=colour, gid=s.what,
                hatch="//" if s.what == "recompute" else None)  # fmt: skip
    for row, t, blocking, step in tl.saves:
        ax.plot([t], [row + 0.33], marker="v", color="black", markersize=6, gid="save",
                linestyle="none")  # fmt: skip
        if blocking:
            ax.barh(row + 0.3, blocking, left=t - blocking, height=0.08, color="black", gid="save")
        if step is not None and len(tl.saves) <= 24:  # below the marker (rows grow down)
            ax.annotate(f"{step}", (t, row + 0.42), fontsize=7, ha="center", va="top")
    for row, t, label in tl.failures:
        ax.plot([t], [row], marker="X", color="#c0392b", markersize=11, gid="failure",
                markeredgecolor="white", linestyle="none")  # fmt: skip
        ax.annotate(label, (t, row - 0.42), fontsize=8, ha="left", va="top", color="#7b241c",
                    gid="failure-label")  # fmt: skip
    ax.set_yticks(range(rows), [label for *_, label in tl.attempts])
    ax.set_ylim(rows - 0.3, -0.8)  # attempt 0 on top; room for each failure's label above
    ax.set_xlabel("seconds since the run started")
    ax.set_title(f"{name}: {tl.title}", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    shown = [w for w in COLOURS if any(s.what == w for s in tl.spans)]
    handles = [Patch(facecolor=COLOURS[w][0], label=COLOURS[w][1],
                     hatch="//" if w == "recompute" else None) for w in shown]  # fmt: skip
    from matplotlib.lines import Line2D

    if tl.saves:
        handles.append(Line2D([], [], marker="v", color="black", linestyle="none",
                              label="checkpoint saved (step)"))  # fmt: skip
    if tl.failures:
        handles.append(Line2D([], [], marker="X", color="#c0392b", linestyle="none",
                              label="failure"))  # fmt: skip
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.05 / rows),
              ncol=min(len(handles), 4), fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout()
    return fig


def draw(run_dir: Path, out: Path) -> list[Path]:
    """timeline.png and timeline.svg of the run in `run_dir`, into `out`."""
    import matplotlib.pyplot as plt
    from ddpkit.train import goodput
    from ddpkit.train.errors import UserError

    recs = goodput.read(run_dir)
    rep = goodput.report(run_dir) if recs else None
    if rep is None:
        raise UserError(
            f"{run_dir / goodput.GOODPUT_DIR} holds no goodput records; pass the run dir of a "
            "job the kit launched (its launcher writes them on every backend)"
        )
    fig = figure(build(recs, rep), run_dir.resolve().name)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    import matplotlib

    for ext in ("png", "svg"):
        path = out / f"timeline.{ext}"
        with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG text stays text
            fig.savefig(path, dpi=110)
        written.append(path)
    plt.close(fig)
    return written

"""Charts from a run's metrics.jsonl: loss, learning rate, throughput, memory, grad norm.

    ddpkit plot RUN_DIR                 # PNGs next to the metrics, in RUN_DIR
    ddpkit plot RUN_A RUN_B [--out DIR]  # the runs side by side on each chart
    ddpkit plot RUN_DIR --x time         # wall-clock seconds on the x axis
    ddpkit plot RUN_DIR --timeline       # the goodput timeline: attempts, failures, their cost

A run that was preempted and resumed logs the steps since its last checkpoint twice (the
file is appended to); the newest record of each step wins. A half-written last line (a run
still going) is skipped.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpkit.train.contract import METRICS_FILE, SUMMARY_FILE
from ddpkit.train.errors import CliParser, UserError, run_cli
from ddpkit.train.jsonshape import Opt, ShapeError, load, loads

# chart file -> (title, y label, metric keys to draw, scale applied to the values)
CHARTS: dict[str, tuple[str, str, tuple[str, ...], float]] = {
    "loss": ("Training loss", "loss", ("loss",), 1.0),
    "lr": ("Learning rate", "lr", ("lr",), 1.0),
    "throughput": ("Throughput", "{unit}", ("throughput", "samples_per_s"), 1.0),
    "memory": ("Memory per rank (rank 0)", "MiB", ("mem_bytes",), 1 / 2**20),
    "grad_norm": ("Gradient norm", "global L2 norm", ("grad_norm",), 1.0),
}


class PlotError(UserError):
    """Bad input: the message names the problem and the fix."""


@dataclass
class Run:
    name: str
    path: Path
    records: list[dict[str, Any]]
    skipped: int
    summary: dict[str, Any] | None
    evals: list[dict[str, Any]] = field(default_factory=list)

    def series(
        self, key: str, x: str, records: list[dict[str, Any]] | None = None
    ) -> tuple[list[float], list[float]]:
        num = (int, float)
        pts = [
            (r[x], r[key])
            for r in (self.records if records is None else records)
            if isinstance(r.get(key), num) and isinstance(r.get(x), num)
        ]
        return [p[0] for p in pts], [p[1] for p in pts]

    @property
    def throughput_unit(self) -> str:
        units = {r.get("throughput_unit") for r in self.records} - {None}
        return units.pop() if len(units) == 1 else "samples/s"


def load_run(path: Path) -> Run:
    metrics = path / METRICS_FILE
    if not metrics.is_file():
        raise PlotError(
            f"{metrics} not found; pass a run directory written by python -m ddpkit.train (its --run-dir)"
        )
    by_step: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    skipped = 0
    for line in metrics.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = loads(line, {"step": int, "throughput_unit": Opt(str)})
        except ShapeError:
            skipped += 1
            continue
        # --eval-interval records (eval_* keys) beside the training steps of the same
        # number; a resumed run re-logs steps: the newest of each kind wins
        (evals if "eval_loss" in rec else by_step)[rec["step"]] = rec
    if not by_step:
        raise PlotError(f"{metrics} holds no step records yet; wait for the first logged step")
    summary = None
    if (path / SUMMARY_FILE).is_file():
        try:  # what the charts read of it; a bad one: one warning, the charts without it
            summary = load(path / SUMMARY_FILE, {"eval_loss": Opt((float, None))})
        except (OSError, ShapeError) as e:
            print(f"warning: ignoring {path / SUMMARY_FILE} ({e})", file=sys.stderr)
    records = [by_step[s] for s in sorted(by_step)]
    return Run(
        path.resolve().name, path, records, skipped, summary, [evals[s] for s in sorted(evals)]
    )


def _spans_decades(values: list[float]) -> bool:
    """All positive and max/min >= 10: a log axis keeps the late, small changes visible."""
    return bool(values) and min(values) > 0 and max(values) / min(values) >= 10


def figures(runs: list[Run], x: str) -> dict[str, Any]:
    """chart name -> matplotlib Figure (what draw() writes; tests read these objects)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed on a cluster node
    import matplotlib.pyplot as plt

    xlabel = "step" if x == "step" else "wall-clock time (s)"
    figs: dict[str, Any] = {}
    for chart, (title, ylabel, keys, scale) in CHARTS.items():
        # Throughput: one axis per unit, so tokens/s and samples/s never share a scale.
        groups: dict[str, list[Run]] = {}
        for run in runs:
            unit = run.throughput_unit if chart == "throughput" else ""
            groups.setdefault(unit, []).append(run)
        plotted = {
            u: [(r, k) for r in g if (k := next((k for k in keys if r.series(k, x)[0]), None))]
            for u, g in groups.items()
        }
        plotted = {u: rk for u, rk in plotted.items() if rk}
        if not plotted:
            continue
        fig, axes = plt.subplots(len(plotted), 1, figsize=(7, 4.5 * len(plotted)), squeeze=False)
        for ax, (unit, pairs) in zip(axes[:, 0], sorted(plotted.items()), strict=True):
            values: list[float] = []
            for run, key in pairs:
                xs, ys = run.series(key, x)
                ys = [y * scale for y in ys]
                values += ys
                (line,) = ax.plot(xs, ys, marker="." if len(xs) < 50 else None, label=run.name)
                if chart == "loss":
                    values += _draw_eval(ax, run, x, xs, line.get_color())
            if chart in ("memory", "throughput"):
                # From zero: a 7 MiB wobble on 700 MiB must look like 1%, not a cliff.
                ax.set_ylim(bottom=0, top=max(values) * 1.08 if max(values) > 0 else 1)
            elif _spans_decades(values):
                ax.set_yscale("log")
            ax.set_title(title if len(plotted) == 1 else f"{title} ({unit})")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel.format(unit=unit))
            ax.grid(True, alpha=0.3)
            if len(runs) > 1 or (chart == "loss" and any(r.evals for r, _ in pairs)):
                ax.legend()
        fig.tight_layout()
        figs[chart] = fig
    return figs


def _draw_eval(ax: Any, run: Run, x: str, xs: list[float], color: str) -> list[float]:
    """Held-out loss on the loss chart: the --eval-interval curve, else summary's final one."""
    ex, ey = run.series("eval_loss", x, run.evals)
    if ex:
        ax.plot(ex, ey, linestyle="--", marker="o", color=color, label=f"{run.name} eval")
        return ey
    if run.summary and run.summary.get("eval_loss") is not None:
        ev = run.summary["eval_loss"]
        ax.scatter([xs[-1]], [ev], marker="*", s=120, zorder=3, color=color)
        ax.annotate(f"eval {ev:.3f}", (xs[-1], ev), ha="right", va="top")
        return [ev]
    return []


def draw(runs: list[Run], out: Path, x: str) -> list[Path]:
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for chart, fig in figures(runs, x).items():
        path = out / f"{chart}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def describe(run: Run) -> str:
    first, last = run.records[0], run.records[-1]
    line = f"{run.name}: steps {first['step']}..{last['step']}"
    if "loss" in first and "loss" in last:
        line += f", loss {first['loss']:.4f} -> {last['loss']:.4f}"
    tps = sorted(
        r["throughput"] for r in run.records if isinstance(r.get("throughput"), (int, float))
    )
    if tps:
        line += f", median {tps[len(tps) // 2]:.0f} {run.throughput_unit}"
    if run.skipped:
        line += f" ({run.skipped} unreadable line(s) skipped)"
    return line


def main(argv: list[str] | None = None) -> int:
    return run_cli(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    p = CliParser(
        prog="ddpkit plot",
        description="PNG charts (loss, lr, throughput, memory, grad norm) from metrics.jsonl; "
        "--timeline: the run's goodput timeline (PNG and SVG).",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--out",
        help="where to write the PNGs (default: the run dir, or "
        "<parent of the first>/compare for several runs)",
    )
    p.add_argument("--x", choices=["step", "time"], default="step", help="x axis")
    p.add_argument(
        "--timeline",
        action="store_true",
        help="draw the run's goodput timeline instead (timeline.png and .svg: attempts, "
        "productive time, each failure and its cost, checkpoint saves), from its goodput records",
    )
    args = p.parse_args(argv)
    dirs = [Path(d) for d in args.run_dirs]
    if args.timeline:
        from ddpkit.tools import timeline

        if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
            raise PlotError(f"--out {args.out} is a file; pass a directory")
        for d in dirs:
            out = Path(args.out) / d.resolve().name if args.out and len(dirs) > 1 else None
            written = timeline.draw(d, out or (Path(args.out) if args.out else d))
            print("wrote " + ", ".join(str(w) for w in written))
        return 0
    if len(dirs) > 1:  # `ddpkit.tools.plot runs/*` also matches runs/compare (charts, no metrics)
        for d in [d for d in dirs if not (d / METRICS_FILE).is_file()]:
            print(f"skipped {d}: no metrics.jsonl (not a run dir)", file=sys.stderr)
        dirs = [d for d in dirs if (d / METRICS_FILE).is_file()] or dirs[:1]
    runs = [load_run(d) for d in dirs]
    x = "step" if args.x == "step" else "time_s"
    if x == "time_s" and any(not r.series("loss", "time_s")[0] for r in runs):
        raise PlotError(
            "--x time needs time_s in every record; these metrics lack it, use --x step"
        )
    if args.out:
        out = Path(args.out)
    elif len(runs) == 1:
        out = runs[0].path
    else:
        out = runs[0].path.resolve().parent / "compare"
    if out.exists() and not out.is_dir():
        raise PlotError(f"--out {out} is a file; pass a directory")
    names = [r.name for r in runs]
    if len(set(names)) < len(names):  # same dir names under different parents
        for r in runs:
            r.name = str(r.path)
    for run in runs:
        print(describe(run))
    written = draw(runs, out, x)
    print("wrote " + ", ".join(str(w) for w in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())

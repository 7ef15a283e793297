"""A run's figures for Prometheus: step, samples/s, loss, goodput and the time lost by
category, failures by kind, restarts, checkpoint blocking and the newest checkpoint's age,
each rank's step time (exposition.METRICS lists them).

    <run dir>/metrics.prom       every run's final figures (the launcher of node 0 writes it
                                 at its exit, from the goodput report it also writes to
                                 goodput.json; the kit's trainer writes it first at its end)
    DDPKIT_METRICS_PORT=N        rank 0 of the kit's trainer serves them over HTTP (/metrics)
    DDPKIT_METRICS_TEXTFILE_DIR  ... and keeps DIR/ddpkit-<run>.prom fresh, for node_exporter's
                                 textfile collector (SLURM nodes often take no inbound port)

The job file's `metrics_port` and `metrics_textfile_dir` set the two variables on every rank.
Nothing here may fail or slow a run: a port that cannot be bound or a dir that cannot be
written is one warning line, and the training goes on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpkit.train.observe.names import (
    METRICS_PROM,
    PORT_ENV,
    REFRESH_S,
    TEXTFILE_DIR_ENV,
    port_from_env,
    textfile_path,
)

__all__ = [
    "METRICS_PROM",
    "PORT_ENV",
    "REFRESH_S",
    "TEXTFILE_DIR_ENV",
    "port_from_env",
    "start",
    "textfile_path",
    "write_final",
]


def start(
    run_dir: str | Path,
    total_steps: int,
    world_size: int,
    say: Callable[[str], None],
    records: Any,
) -> Any:
    """Rank 0 of the kit's trainer: its exporter (live.Exporter), or None when
    prometheus_client is missing (one warning line where the job asked for an endpoint or a
    textfile). records: the goodput package (its read and report), handed in: it imports
    this package itself (write_final, at the launcher's exit)."""
    try:
        from ddpkit.train.observe.live import Exporter
    except ImportError as e:
        if port_from_env() or os.environ.get(TEXTFILE_DIR_ENV):
            say(f"warning: metrics: no endpoint or textfile ({e}; pip install prometheus-client)")
        return None
    return Exporter(
        Path(run_dir),
        total_steps,
        world_size,
        port_from_env(),
        os.environ.get(TEXTFILE_DIR_ENV) or None,
        say,
        records,
    )


def write_final(run_dir: str | Path, rep: Any, recs: list[dict[str, Any]]) -> None:
    """The launcher of node 0 at its exit: the run's final figures into <run dir>/metrics.prom
    (and the textfile), from the report it just wrote to goodput.json. Figures only the live
    trainer had (each rank's step time) are kept from the file it wrote, when that file is
    this run's. `recs`: the run's goodput records. Never raises; a textfile that cannot be
    written is one line on stderr."""
    try:
        from ddpkit.train.observe import exposition, figures
    except ImportError:
        return
    try:
        fig = figures.from_run_dir(run_dir, rep, recs)
        path = Path(run_dir) / METRICS_PROM
        extra = carried(path, fig)
        exposition.write(path, fig, extra)
    except Exception:  # the run is over; its figures are a courtesy, never its failure
        return
    directory = os.environ.get(TEXTFILE_DIR_ENV)
    if directory:
        try:
            exposition.write(textfile_path(directory, fig.run), fig, extra)
        except Exception as e:
            print(f"ddpkit: warning: metrics textfile not written in {directory}: {e}",
                  file=sys.stderr, flush=True)  # fmt: skip


def carried(path: Path, fig: Any) -> list[Any]:
    """The families the file at `path` has and `fig` lacks, when that file is of the same
    run (its ddpkit_run_info's run_id): what only the live trainer knew."""
    from ddpkit.train.observe import exposition

    try:
        old = exposition.parse(path.read_text())
    except (OSError, ValueError):
        return []
    info = old.get("ddpkit_run_info")
    old_id = info.samples[0].labels.get("run_id") if info and info.samples else None
    if not fig.run_id or old_id != fig.run_id:
        return []
    have = {m.name for m in exposition.families(fig)}
    return [m for name, m in old.items() if name in exposition.METRICS and name not in have]

"""The names the job, the trainer's exporter and the launcher share (the package docstring
says what each does)."""

from __future__ import annotations

import os
from pathlib import Path

PORT_ENV = "DDPKIT_METRICS_PORT"
TEXTFILE_DIR_ENV = "DDPKIT_METRICS_TEXTFILE_DIR"
METRICS_PROM = "metrics.prom"  # in the run dir: the run's final figures
REFRESH_S = 10.0  # the textfile's refresh, and how often the goodput part is re-read


def textfile_path(directory: str | Path, run: str) -> Path:
    """node_exporter's textfile: one file per run, so two jobs on a node never share one."""
    return Path(directory) / f"ddpkit-{run}.prom"


def port_from_env(env: dict[str, str] | None = None) -> int:
    """The metrics port the job names (0: none); a value that is not a port is none."""
    value = (os.environ if env is None else env).get(PORT_ENV, "").strip()
    try:
        port = int(value or 0)
    except ValueError:
        return 0
    return port if 0 < port < 65536 else 0

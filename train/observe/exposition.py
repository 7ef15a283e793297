"""A run's figures in the Prometheus text format, through the Prometheus project's own Python
client (prometheus_client): the families (METRICS names them all, with their help), an HTTP
endpoint, and files written atomically (a temporary name, then a rename: node_exporter's
textfile collector reads only *.prom, so it never sees half a file).

Every series carries the label `run` (the run dir's name): node_exporter's textfile
collector merges the files of every job on a node, and two jobs' series must not collide.
Counters are monotonic within a run (a run's failures, restarts and blocked checkpoint time
only grow); everything recomputed from the records is a gauge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ddpkit.train import failure
from ddpkit.train.observe.figures import BADPUT, Figures
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

# name -> (type, help): the one list of what a run exposes (docs/observability.md shows it;
# a test holds the Grafana dashboard's queries to it). Counters without their `_total`.
METRICS: dict[str, tuple[str, str]] = {
    "ddpkit_run_info": ("gauge", "The run these figures are of: 1, its id in the label run_id."),
    "ddpkit_step": ("gauge", "The last step completed (the trainer's last logging step)."),
    "ddpkit_steps_planned": ("gauge", "The steps the run trains in all."),
    "ddpkit_loss": ("gauge", "Training loss at the last logging step, averaged over ranks."),
    "ddpkit_samples_per_second": (
        "gauge",
        "Samples per second over all ranks: the last logging interval's while training, the "
        "run's median (summary.json) once it finished.",
    ),
    "ddpkit_eta_seconds": ("gauge", "Seconds to the last step at the pace so far."),
    "ddpkit_world_size": ("gauge", "Ranks in the job."),
    "ddpkit_step_duration_seconds": (
        "gauge",
        "Each rank's mean step time over the last logging interval (a slow rank stands out).",
    ),
    "ddpkit_goodput_ratio": ("gauge", "Productive time over wall time, 0 to 1."),
    "ddpkit_wall_seconds": ("gauge", "The run's wall time so far (to its last step once done)."),
    "ddpkit_productive_seconds": ("gauge", "Training time that was kept (goodput seconds)."),
    "ddpkit_badput_seconds": (
        "gauge",
        "Wall time that was not productive, by category: startup, checkpoint (saves that "
        "blocked training), detection, restart, reload, recompute (a failure's cost), other.",
    ),
    "ddpkit_failures": ("counter", "Failures of the run, by kind."),
    "ddpkit_failure_lost_seconds": ("gauge", "Seconds the run's failures cost, by kind."),
    "ddpkit_restarts": ("counter", "Attempts after the first (in-place restarts, requeues)."),
    "ddpkit_checkpoint_blocking_seconds": ("counter", "Seconds checkpoint saves blocked training."),
    "ddpkit_checkpoint_step": ("gauge", "The step of the newest complete checkpoint."),
    "ddpkit_checkpoint_timestamp_seconds": (
        "gauge",
        "When the newest complete checkpoint was done (Unix time).",
    ),
    "ddpkit_checkpoint_age_seconds": (
        "gauge",
        "Age of the newest complete checkpoint when these figures were taken.",
    ),
    "ddpkit_run_finished": ("gauge", "1 once the run finished its last step, else 0."),
    "ddpkit_last_update_timestamp_seconds": (
        "gauge",
        "When these figures were taken (Unix time): a stale textfile shows here.",
    ),
}

_TYPES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}


def families(fig: Figures) -> list[Metric]:
    """The metric families of `fig`; a figure not known is left out, never shown as 0."""
    run = fig.run
    out: dict[str, Metric] = {}

    def family(name: str, labels: tuple[str, ...] = ()) -> Metric:
        if name not in out:
            kind, text = METRICS[name]
            out[name] = _TYPES[kind](name, text, labels=["run", *labels])
        return out[name]

    def one(name: str, value: float | int | None) -> None:
        if value is not None:
            family(name).add_metric([run], float(value))

    family("ddpkit_run_info", ("run_id",)).add_metric([run, fig.run_id or ""], 1)
    one("ddpkit_step", fig.step)
    one("ddpkit_steps_planned", fig.total_steps)
    one("ddpkit_loss", fig.loss)
    one("ddpkit_samples_per_second", fig.samples_per_s)
    one("ddpkit_eta_seconds", fig.eta_s)
    one("ddpkit_world_size", fig.world_size)
    for rank, seconds in sorted(fig.rank_step_s.items()):
        family("ddpkit_step_duration_seconds", ("rank",)).add_metric([run, str(rank)], seconds)
    one("ddpkit_goodput_ratio", fig.goodput)
    one("ddpkit_wall_seconds", fig.wall_s)
    one("ddpkit_productive_seconds", fig.productive_s)
    cats = [c for c in BADPUT if c in fig.badput_s] + sorted(set(fig.badput_s) - set(BADPUT))
    for cat in cats:
        family("ddpkit_badput_seconds", ("category",)).add_metric([run, cat], fig.badput_s[cat])
    if fig.wall_s is not None:  # the report was read: every kind from 0, so rate() sees the first
        counts = {**dict.fromkeys(failure.KINDS, 0), **fig.failures}
        for kind, n in counts.items():
            family("ddpkit_failures", ("kind",)).add_metric([run, kind], n)
        for kind, seconds in sorted(fig.failure_lost_s.items()):
            family("ddpkit_failure_lost_seconds", ("kind",)).add_metric([run, kind], seconds)
    one("ddpkit_restarts", fig.restarts)
    one("ddpkit_checkpoint_blocking_seconds", fig.ckpt_blocking_s)
    one("ddpkit_checkpoint_step", fig.ckpt_step)
    one("ddpkit_checkpoint_timestamp_seconds", fig.ckpt_time)
    one("ddpkit_checkpoint_age_seconds", fig.ckpt_age_s)
    if fig.wall_s is not None:
        one("ddpkit_run_finished", 1 if fig.finished else 0)
    one("ddpkit_last_update_timestamp_seconds", fig.updated)
    return list(out.values())


class FiguresCollector:
    """A prometheus_client collector that asks `source` for the figures at each scrape;
    `extra`: families read back from an earlier file, shown as they were."""

    def __init__(self, source: Callable[[], Figures], extra: Sequence[Metric] = ()):
        self.source, self.extra = source, list(extra)

    def collect(self) -> Iterator[Metric]:
        yield from families(self.source())
        yield from self.extra


def registry_of(source: Callable[[], Figures], extra: Sequence[Metric] = ()) -> CollectorRegistry:
    """A private registry (the global one carries the process's own collectors, and a second
    exporter in one process would clash with it) holding only the run's figures."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FiguresCollector(source, extra))  # type: ignore[arg-type]
    return reg


def text(fig: Figures) -> str:
    """The figures in the Prometheus text format (0.0.4, what promtool and node_exporter read)."""
    from prometheus_client import generate_latest

    return generate_latest(registry_of(lambda: fig)).decode()


def write(path: str | Path, fig: Figures, extra: Sequence[Metric] = ()) -> None:
    """Write the figures to `path` atomically (prometheus_client writes a temporary file
    beside it, then renames it into place). Raises OSError when it cannot."""
    from prometheus_client import write_to_textfile

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry_of(lambda: fig, extra))


def serve(port: int, source: Callable[[], Figures], addr: str = "0.0.0.0") -> Any:
    """An HTTP endpoint on `port` (every path answers, /metrics included) in a daemon
    thread; returns the server (its .server_port is the port taken, for port 0). Raises
    OSError when the port cannot be bound."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=addr, registry=registry_of(source))
    return server


def parse(text_: str) -> dict[str, Any]:
    """A file in this format read back with the official parser: family name -> Metric."""
    from prometheus_client.parser import text_string_to_metric_families

    return {m.name: m for m in text_string_to_metric_families(text_)}

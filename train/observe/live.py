"""The exporter on rank 0 of the kit's trainer: the trainer hands it each logging step's
figures (a callback of its Reporter: a few assignments, nothing else on the training thread);
a scrape of its endpoint, and a daemon thread that refreshes the textfile every REFRESH_S,
read the goodput records and build the text off the training thread. At the run's end it
writes <run dir>/metrics.prom (the launcher then writes it again with the final report)."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpkit.train.observe import exposition as expo
from ddpkit.train.observe import figures as figs
from ddpkit.train.observe.names import METRICS_PROM, REFRESH_S, textfile_path


class Exporter:
    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        world_size: int,
        port: int,
        textfile_dir: str | None,
        say: Callable[[str], None],
        records: Any,
    ):
        self.run_dir, self.say, self.records = run_dir, say, records
        self.live = figs.Figures(
            run=figs.run_name(run_dir), total_steps=total_steps, world_size=world_size
        )
        self.last: tuple[dict[str, Any] | None, list[float] | None] = (None, None)
        self.lock = threading.Lock()  # the goodput part is swapped whole under it
        self.report_fig: figs.Figures | None = None
        self.report_at = 0.0
        self.server: Any = None
        self.textfile = textfile_path(textfile_dir, self.live.run) if textfile_dir else None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.warned: set[str] = set()
        if port:
            try:
                self.server = expo.serve(port, self.current)
            except OSError as e:
                self.warn("port", f"no metrics endpoint on port {port} ({e.strerror or e})")
        if self.textfile is not None:
            self.thread = threading.Thread(target=self._refresh, name="ddpkit-metrics", daemon=True)
            self.thread.start()

    @property
    def port(self) -> int | None:
        return None if self.server is None else int(self.server.server_port)

    def warn(self, what: str, why: str) -> None:
        if what not in self.warned:  # once per run: a full disk does not fill the log
            self.warned.add(what)
            self.say(f"warning: metrics: {why}; training goes on ({METRICS_PROM} at the end)")

    # --- the trainer's side (Reporter callbacks) ----------------------------------------------

    def on_log(self, rec: dict[str, Any], ranks: list[float] | None) -> None:
        """A logging step's record (what metrics.jsonl gets) and each rank's step time: kept
        as they are (one assignment on the training thread), read at the next scrape."""
        self.last = (rec, ranks)

    def on_goodput(self, rep: Any) -> None:
        """The report at the run's last step (the trainer's goodput.note_done)."""
        if rep is not None:
            self._set_report(rep)

    def close(self) -> None:
        """The run ends (finished, stopped, diverged): its figures into the run dir."""
        self.stop.set()
        if self.thread is not None:  # its last write must not land after the final one
            self.thread.join(timeout=5)
        fig = self.current(fresh=True)
        if fig.finished and (summary := figs.read_summary(self.run_dir, fig.run_id)):
            figs.add_summary(fig, summary)
        try:
            expo.write(self.run_dir / METRICS_PROM, fig)
        except OSError as e:
            self.warn("run dir", f"{METRICS_PROM} not written ({e.strerror or e})")
        self._write_textfile(fig)

    # --- the figures ------------------------------------------------------------------------

    def current(self, fresh: bool = False) -> figs.Figures:
        """The live figures with the goodput part: re-read when older than REFRESH_S (a
        scrape's thread or the refresher's, never the training thread) or when `fresh`."""
        now = time.time()
        if fresh or self.report_fig is None or now - self.report_at >= REFRESH_S:
            self._read_report()
        with self.lock:
            base = self.report_fig
        fig = copy.copy(self.live)
        rec, ranks = self.last
        if rec is not None:
            figs.add_step_record(fig, rec)
        fig.rank_step_s = dict(enumerate(ranks)) if ranks else {}
        fig.updated = now
        if base is not None:
            for name in ("run_id", "goodput", "wall_s", "productive_s", "badput_s", "failures",
                         "failure_lost_s", "last_failures", "restarts", "ckpt_blocking_s",
                         "ckpt_step", "ckpt_time", "finished"):  # fmt: skip
                setattr(fig, name, getattr(base, name))
        return fig

    def _read_report(self) -> None:
        try:
            recs = self.records.read(self.run_dir)
            rep = self.records.report(self.run_dir, now=time.time()) if recs else None
        except Exception:  # a record being written, a report that cannot be made: next time
            return
        self._set_report(rep, recs)

    def _set_report(self, rep: Any, recs: list[dict[str, Any]] | None = None) -> None:
        fig = figs.Figures(run=self.live.run)
        if rep is not None:
            figs.add_report(fig, rep)
        figs.add_records(fig, self.records.read(self.run_dir) if recs is None else recs)
        with self.lock:
            self.report_fig, self.report_at = fig, time.time()

    def _refresh(self) -> None:
        while True:  # at once (node_exporter sees the run start), then every REFRESH_S
            self._write_textfile(self.current())
            if self.stop.wait(REFRESH_S):
                return

    def _write_textfile(self, fig: figs.Figures) -> None:
        if self.textfile is None:
            return
        try:
            expo.write(self.textfile, fig)
        except OSError as e:
            self.warn("textfile", f"{self.textfile} not written ({e.strerror or e})")

"""`ddpkit status BACKEND [JOB] --watch`: one job, looked at every few seconds until it ends.

On a terminal the block is redrawn in place: the job's state, a progress bar (step / total,
ETA), samples/s and loss, the goodput so far, the last failures and what they cost, and the
slowest rank. Piped (not a terminal), one plain line each time something in it changed.

Where the figures come from: the job's run dir when it is on this machine (local, SLURM on a
shared filesystem, a container's bind mount: its metrics.jsonl and goodput records, as the
exporter reads them, train/observe/figures.py); on Kubernetes, where the run dir is on the
claim, the host pod's last lines (the trainer's progress line and the launcher's goodput).
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ddpkit.tools.backends import JobState, JobStatus, last_job
from ddpkit.train.jsonshape import Opt
from ddpkit.train.observe.figures import Figures, from_run_dir

BAR = 30  # the progress bar's cells (fewer on a narrow terminal)


def run_dir_of(backend: str, job: str) -> Path | None:
    """The job's run dir when this machine has it (its job record names it)."""
    from ddpkit.tools.jobspec import SpecError

    try:
        rec = last_job(backend, {"run_dir": Opt((str, None))})
    except SpecError:
        return None
    if str(rec["job"]) != str(job) or not rec.get("run_dir"):
        return None
    path = Path(rec["run_dir"])
    return path if path.is_dir() else None


def figures_of_run_dir(run_dir: Path) -> Figures:
    from ddpkit.train import goodput

    recs = goodput.read(run_dir)
    rep = goodput.report(run_dir, now=time.time()) if recs else None
    return from_run_dir(run_dir, rep, recs)


# The trainer's plain progress line (train/metrics.py Reporter.log) and the launcher's lines.
_STEP = re.compile(
    r"^step\s+(?P<step>\d+)/(?P<total>\d+) loss (?P<loss>\S+) .*? (?P<tput>[\d.]+) samples/s"
    r"(?: .*?slowest rank (?P<slow>\d+) (?P<slow_ms>[\d.]+)ms)?(?: .*eta (?P<eta>\S+))?"
)
_GOODPUT = re.compile(r"goodput (?P<pct>\d+)%")
_DURATION = re.compile(r"^(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?$")


def figures_of_log(text: str, run: str) -> Figures:
    """The figures a pod's log says: its last progress line, the launcher's goodput lines."""
    fig = Figures(run=run)
    lines = [ln.strip().removeprefix("ddpkit: ") for ln in text.splitlines()]
    for line in lines:
        if m := _STEP.match(line):
            fig.step, fig.total_steps = int(m["step"]), int(m["total"])
            fig.loss, fig.samples_per_s = float(m["loss"]), float(m["tput"])
            fig.eta_s = _seconds(m["eta"]) if m["eta"] else None
            fig.slowest_rank = int(m["slow"]) if m["slow"] else None
            fig.slowest_step_s = float(m["slow_ms"]) / 1e3 if m["slow_ms"] else None
        elif line.startswith("goodput") and (g := _GOODPUT.match(line)):
            fig.goodput = int(g["pct"]) / 100
            fig.last_failures = []
        elif line.startswith("failure: "):
            fig.last_failures.append({"text": line.removeprefix("failure: ")})
    return fig


def _seconds(text: str) -> float | None:
    m = _DURATION.match(text)
    if not m or not any(m.groups()):
        return None
    return sum(int(m[k] or 0) * f for k, f in (("h", 3600), ("m", 60), ("s", 1)))


def look(backend: Any, job: str, opts: Any) -> tuple[JobStatus, Figures | None]:
    """One look: the job's state and its figures (None where nothing says them)."""
    st = backend.poll(job)
    run_dir = run_dir_of(backend.name, job)
    if run_dir is not None:
        return st, figures_of_run_dir(run_dir)
    if backend.name == "k8s":
        from ddpkit.k8s import api

        return st, figures_of_log(api.host_log(job, opts), job)
    return st, None


def format_duration(seconds: float) -> str:
    from ddpkit.train.metrics import format_duration  # the progress line's (imports torch)

    return format_duration(seconds)


def frame(st: JobStatus, fig: Figures | None, width: int) -> list[str]:
    """The block a terminal shows (each line cut to `width`)."""
    out = [st.line()]
    if fig is None:
        out.append("  (no figures: the run dir is not on this machine)")
        return [ln[:width] for ln in out]
    if fig.step is not None:
        total = fig.total_steps
        cells = max(10, min(BAR, width - 40))
        if total:
            done = min(cells, round(cells * fig.step / total))
            bar = "[" + "#" * done + "." * (cells - done) + "]"
            where = f"{bar} {fig.step}/{total} steps {fig.step / total:4.0%}"
        else:
            where = f"step {fig.step}"
        if fig.eta_s is not None and not fig.finished:
            where += f"  ETA {format_duration(fig.eta_s)}"
        out.append("  " + where)
    rate = []
    if fig.samples_per_s is not None:
        rate.append(f"{fig.samples_per_s:,.0f} samples/s")
    if fig.loss is not None:
        rate.append(f"loss {fig.loss:.4f}")
    if fig.goodput is not None:
        wall = f" of {fig.wall_s:.0f} s" if fig.wall_s is not None else ""
        rate.append(f"goodput {'' if fig.finished else 'so far '}{fig.goodput:.0%}{wall}")
    if rate:
        out.append("  " + "   ".join(rate))
    step = f"step {fig.step_time_s * 1e3:.1f} ms" if fig.step_time_s is not None else ""
    if fig.slowest_rank is not None and fig.slowest_step_s is not None:
        # the ranks' own work per step (waiting for peers left out: stragglers.py's measure)
        slow = f"slowest rank {fig.slowest_rank} ({fig.slowest_step_s * 1e3:.1f} ms own work)"
        step = f"{step}   {slow}" if step else slow
    if step:
        out.append("  " + step)
    n = sum(fig.failures.values()) if fig.failures else len(fig.last_failures)
    if n:
        lost = sum(fig.failure_lost_s.values())
        out.append(f"  failures: {n}" + (f", {lost:.0f} s lost" if lost else ""))
        for f in fig.last_failures[-3:]:
            out.append("    " + _failure(f))
    return [ln[:width] for ln in out]


def _failure(f: dict[str, Any]) -> str:
    if "text" in f:
        return f["text"]
    who = f" rank {f['rank']}" if f.get("rank") is not None else ""
    where = f" on {f['node']}" if f.get("node") else ""
    state = "recovered" if f.get("recovered") else "not recovered (yet)"
    return f"{f['kind']}{who}{where} in attempt {f['attempt']}: {f['lost_s']:.0f} s lost, {state}"


def plain(st: JobStatus, fig: Figures | None) -> str:
    """One line for a pipe: the same figures, no bar."""
    parts = [st.line()]
    if fig is not None:
        if fig.step is not None:
            parts.append(f"step {fig.step}" + (f"/{fig.total_steps}" if fig.total_steps else ""))
        if fig.eta_s is not None and not fig.finished:
            parts.append(f"eta {format_duration(fig.eta_s)}")
        if fig.samples_per_s is not None:
            parts.append(f"{fig.samples_per_s:.0f} samples/s")
        if fig.goodput is not None:
            parts.append(f"goodput {fig.goodput:.0%}")
        n = sum(fig.failures.values()) if fig.failures else len(fig.last_failures)
        if n:
            parts.append(f"failures {n}")
        if fig.slowest_rank is not None:
            parts.append(f"slowest rank {fig.slowest_rank}")
    return " | ".join(parts)


def watch(backend: Any, job: str | None, opts: Any, out: TextIO | None = None) -> int:
    """Look every opts.every seconds until the job ends; the status's exit code."""
    out = out or sys.stdout
    job = backend.job_or_last(job)
    tty = out.isatty()
    every = max(0.2, float(getattr(opts, "every", 2.0) or 2.0))
    drawn, last = 0, ""
    try:
        if tty:
            out.write("\x1b[?25l")  # no cursor blinking through the block
        while True:
            st, fig = look(backend, job, opts)
            if tty:
                lines = frame(st, fig, shutil.get_terminal_size((100, 24)).columns - 1)
                # back to the block's first line, each line rewritten, what is left cleared
                up = f"\x1b[{drawn}F" if drawn else ""
                out.write(up + "".join(f"\x1b[2K{ln}\n" for ln in lines) + "\x1b[J")
                drawn = len(lines)
            else:
                line = plain(st, fig)
                if line != last:
                    out.write(line + "\n")
                    last = line
            out.flush()
            if st.state.terminal:
                return 1 if st.state in (JobState.FAILED, JobState.UNKNOWN) else 0
            time.sleep(every)
    except KeyboardInterrupt:
        out.write("\n")
        return 130
    finally:
        if tty:
            out.write("\x1b[?25h")
            out.flush()

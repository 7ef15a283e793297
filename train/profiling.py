"""--profile-steps A-B: a torch.profiler trace of those steps, and a CUDA memory snapshot.

Every rank writes its own files under <run_dir>/profile/ (a straggler shows up as the rank
whose trace differs): trace-rank<R>.json opens in chrome://tracing or ui.perfetto.dev; on CUDA
memory-rank<R>.pickle opens in pytorch.org/memory_viz. Each traced step is a
`ddpkit_step_<N>` range in the trace.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch


class StepProfiler:
    def __init__(
        self, steps: tuple[int, int] | None, run_dir: Path, rank: int, device: torch.device
    ):
        self.steps, self.rank, self.device = steps, rank, device
        self.dir = run_dir / "profile"
        self.prof: torch.profiler.profile | None = None
        self.range: contextlib.AbstractContextManager | None = None
        self.done = False
        self.written: list[Path] = []

    def before(self, step: int) -> None:
        """Called before step `step` (1-based) runs."""
        if self.steps is None or self.done or not self.steps[0] <= step <= self.steps[1]:
            return
        if self.prof is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                # Allocation history from here on: the snapshot shows what lived when.
                torch.cuda.memory._record_memory_history(max_entries=200_000)
            self.prof = torch.profiler.profile(activities=activities, profile_memory=True)
            self.prof.start()
        self.range = torch.profiler.record_function(f"ddpkit_step_{step}")
        self.range.__enter__()

    def after(self, step: int) -> None:
        """Called after step `step` finished; writes the files after the last traced step."""
        if self.range is not None:
            self.range.__exit__(None, None, None)
            self.range = None
        if self.prof is not None and step >= self.steps[1]:
            self.close()

    def close(self) -> list[Path]:
        """Stop and write what was traced (also when training ends before step B)."""
        if self.prof is None or self.done:
            return self.written
        self.done = True
        self.prof.stop()
        self.dir.mkdir(parents=True, exist_ok=True)
        trace = self.dir / f"trace-rank{self.rank}.json"
        self.prof.export_chrome_trace(str(trace))
        self.written.append(trace)
        if self.device.type == "cuda":
            snap = self.dir / f"memory-rank{self.rank}.pickle"
            torch.cuda.memory._dump_snapshot(str(snap))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.written.append(snap)
        self.prof = None
        return self.written

"""How a run ends, once the loop has decided that it ends: finished (the summary and the
done line), stopped by a signal (a final save, then requeue or not) or diverged (nothing saved
from a non-finite state). Each writes its last words and returns the process's exit code.

`RunEnd` is the trainer's base: the loop (trainer.py) decides when; this module decides
what is written and which code the process returns. It reads the trainer's state, declared
below, and calls four of its methods: `save`, `evaluate`, `log_eval` and `end_log`.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from ddpkit.train import goodput
from ddpkit.train.ckpt import Checkpointer
from ddpkit.train.config import EXIT_REQUEUE, TrainConfig
from ddpkit.train.contract import (
    CKPT_STEP_PREFIX,
    EXIT_DIVERGED,
    EXIT_INTERRUPTED,
    LAUNCH_ID_ENV,
    SUMMARY_FILE,
    asks_requeue,
    ckpt_join,
    requeue_signals,
    write_requeue_marker,
)
from ddpkit.train.data import DataBundle
from ddpkit.train.distributed import World
from ddpkit.train.divergence import Diverged
from ddpkit.train.metrics import Reporter, cuda_memory, gather_objects, param_digest, state_bytes
from ddpkit.train.profiling import StepProfiler
from ddpkit.train.signals import StopRequest


class RunEnd:
    """The ends of a run; the trainer sets this state up front (Trainer.__init__)."""

    cfg: TrainConfig
    world: World
    run_dir: Path
    data: DataBundle
    model: Any
    raw_model: Any
    optimizer: Any
    num_params: int
    global_batch: int
    peak_lr: float
    t_start: float
    step: int
    phase: str
    first_loss: float | None
    last_loss: float | None
    throughputs: list[float]
    mfus: list[float]
    resumed_from: str | None
    time_to_first_step: float | None
    last_saved: int
    late_signal: int
    stop: StopRequest
    ckpt: Checkpointer
    reporter: Reporter
    profiler: StepProfiler

    def preempted(self, signum: int) -> int:
        import signal as _signal

        self.end_log()  # the last logging step's line before this one
        self.stop.drain()
        self.profiler.close()
        name = _signal.Signals(signum).name
        self.reporter.info(f"{name} received: saving a checkpoint at step {self.step}")
        if self.last_saved != self.step:  # else (stopped right after a resume) it is on disk
            self.save(force_sync=True)
        self.ckpt.close()
        took = time.time() - self.stop.received_at
        budget = self.cfg.shutdown_timeout_s
        if signum == _signal.SIGINT or not asks_requeue(name):
            # Ctrl-C, or a cancel (SLURM's scancel sends SIGTERM; its requeue signal is the
            # --signal the kit asks for): the stop is the user's, never a requeue.
            code = EXIT_INTERRUPTED if signum == _signal.SIGINT else 128 + signum
            why = (
                ""
                if signum == _signal.SIGINT
                else f" (this job requeues on {'/'.join(requeue_signals())} only)"
            )
            self.reporter.info(
                f"stopped by {name} at step {self.step} (checkpoint saved, {took:.1f} s); "
                f"exit {code}, not requeued{why}: --resume auto continues"
            )
            self.reporter.close()
            return code
        if took <= budget:
            self.reporter.info(
                f"preemption save finished {took:.1f} s after {name}, within the "
                f"{budget:g} s shutdown timeout; exiting {EXIT_REQUEUE} (requeue)"
            )
        else:
            self.reporter.info(
                f"warning: preemption save took {took:.1f} s after {name}, MORE "
                f"than the {budget:g} s shutdown timeout: raise torchrun's "
                "--shutdown-timeout or the scheduler's grace time"
            )
        # One writer per node (the marker carries DDPKIT_LAUNCH_ID: only this launch's counts):
        # each node's launcher reads its own run dir, which only a shared filesystem makes one
        # (a Kubernetes pod without a claim has its own; its launcher said "without a requeue
        # request" and exited 143 after the save). On a shared dir the writes replace
        # atomically.
        if self.world.local_rank == 0:
            write_requeue_marker(
                self.run_dir,
                signal=name,
                step=self.step,
                save_s=round(took, 3),
                checkpoint=ckpt_join(self.cfg.ckpt_dir, f"{CKPT_STEP_PREFIX}{self.step}"),
            )
        self.reporter.close()
        return EXIT_REQUEUE

    def diverged(self, e: Diverged) -> int:
        """Stop on a non-finite state: nothing saved from it; name the checkpoint to use."""
        self.stop.drain()
        self.ckpt.close()  # a save in flight was started from a checked, finite state
        if self.world.is_main:
            import sys

            newest = self.ckpt.newest()
            skipped = f" after skipping {e.skipped} (--max-bad-steps)" if e.skipped else ""
            fix = "lower --lr, or add --clip-grad or --max-bad-steps N"
            where = (
                f"the last finite checkpoint is {newest}: {fix} and rerun with --resume {newest}"
                if newest
                else f"no checkpoint was saved before it: {fix} and start over"
            )
            print(
                f"error: training diverged: non-finite loss or gradient norm at step "
                f"{e.step}{skipped}; nothing was saved from that state; {where}",
                file=sys.stderr,
                flush=True,
            )
        self.reporter.close()
        dist.barrier()
        return EXIT_DIVERGED

    def finish(self) -> int:
        self.profiler.close()
        ev = self.evaluate()
        trained = self.last_loss is not None  # False: resumed at the last step, nothing ran
        every = self.cfg.eval_interval
        if trained and every and self.step % every:
            self.log_eval(ev)  # the eval curve's last point (unless the interval just logged it)
        self.phase = "summary gather"
        per_rank = gather_objects(state_bytes(self.model, self.optimizer))
        digest = param_digest(self.raw_model)
        good = goodput.note_done(self.run_dir, self.step) if self.world.is_main else None
        self.reporter.log_goodput(self.step, good)
        if self.world.is_main and (trained or not (self.run_dir / SUMMARY_FILE).exists()):
            summary = {
                "world_size": self.world.size,
                "nnodes": self.world.nnodes,
                "backend": self.world.backend,
                "parallel": self.cfg.parallel,
                "sharding": self.cfg.sharding,
                "mixed_precision": self.cfg.mixed_precision,
                "model": self.cfg.model,
                "num_params": self.num_params,
                "steps": self.step,
                "global_batch": self.global_batch,
                "peak_lr": self.peak_lr,
                "first_loss": self.first_loss,
                "final_loss": self.last_loss,
                **ev,
                "samples_per_s": statistics.median(self.throughputs)
                / (self.data.tokens_per_sample or 1)
                if self.throughputs
                else None,
                "tokens_per_s": statistics.median(self.throughputs)
                if self.throughputs and self.data.tokens_per_sample
                else None,
                "mfu": statistics.median(self.mfus) if self.mfus else None,
                **cuda_memory(self.world.device),
                "time_to_first_step_s": self.time_to_first_step,
                "total_time_s": time.perf_counter() - self.t_start,
                "resumed_from": self.resumed_from,
                "signal": _signal_name(self.late_signal) if self.late_signal else None,
                "launch_id": os.environ.get(LAUNCH_ID_ENV),  # the launcher's "it finished"
                "state_bytes_per_rank": per_rank,
                "param_digest": digest,
                "goodput": good.to_dict() if good else None,
            }
            text = json.dumps(summary, indent=2) + "\n"
            (self.run_dir / SUMMARY_FILE).write_text(text)
            self._summary_to_store(text)
        if self.world.is_main:
            losses = (
                f"loss {self.first_loss:.4f} -> {self.last_loss:.4f}"
                if self.last_loss is not None
                else "nothing left to train (resumed at the last step; summary.json kept; "
                "--resume never or a new --run-dir starts over)"
            )
            self.reporter.info(
                f"done: {self.step} steps, {losses}"
                + (f", eval accuracy {ev['eval_accuracy']:.3f}" if "eval_accuracy" in ev else "")
                + f"; outputs in {self.run_dir}"
            )
            if self.late_signal:
                self.reporter.info(
                    f"{_signal_name(self.late_signal)} received during the last steps: the "
                    "run finished instead of stopping (nothing to requeue; summary.json "
                    "records it)"
                )
        self.reporter.close()
        self.phase = "final barrier"  # leave together: gloo can abort a rank whose peer left
        dist.barrier()
        return 0

    def _summary_to_store(self, text: str) -> None:
        """A store's ckpt_dir also gets summary.json beside its steps: a pod with no volume
        loses its run dir with it, the store keeps what the run ended with."""
        store = self.ckpt.store  # a local dir's put keeps nothing: the run dir has it
        try:
            store.put(SUMMARY_FILE, text.encode())
        except Exception as e:  # the run finished; a summary it could not copy does not undo that
            self.reporter.info(f"warning: {SUMMARY_FILE} not copied: {store.problem(e)}")


def _signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name

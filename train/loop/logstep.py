"""The trainer's logging steps (a base of loop.trainer.Trainer, as ending.RunEnd is): the loss,
grad norm and step time all-reduced while the next step fetches its batch, then the line,
the metrics record, the stop-check interval and the divergence check."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from ddpkit.train.divergence import Health
from ddpkit.train.metrics import cuda_memory, memory_bytes
from ddpkit.train.signals import stop_check_every


@dataclass
class PendingLog:
    """A logging step's all-reduce in flight (Trainer.log_step), and what its line needs."""

    work: Any  # dist.Work
    stats: torch.Tensor
    record: dict[str, Any]  # the line's fields known at the logging step
    cuda: dict[str, int]  # peak CUDA memory, last in the line


class LogSteps:
    """log_step / end_log of the Trainer; the state they read is the Trainer's own."""

    # set by Trainer.__init__
    world: Any
    cfg: Any
    data: Any
    health: Health
    optimizer: Any
    sampler: Any
    reporter: Any
    pending_log: PendingLog | None

    def log_step(self, loss: torch.Tensor, gnorm: torch.Tensor | None, step_time: float) -> None:
        """Start the logging step's all-reduce: the loss, the grad norm and the step time
        summed over ranks, and the divergence flags (Health.flags). It runs while the next
        step fetches its batch; end_log() then waits for it, writes the line and names a
        non-finite step (Diverged). Waiting here instead held every logging step for the
        collective's round trip (~0.5 ms of a 4 ms step on 2 gloo ranks)."""
        self.phase = "loss all_reduce (logging)"
        zero = torch.zeros((), device=loss.device)
        g = zero
        if gnorm is not None:
            g = (gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm).float()
        stats = torch.stack([loss.float().detach(), g, zero + step_time, *self.health.flags()])
        work = dist.all_reduce(stats, async_op=True)
        main = self.world.is_main  # the only rank that writes the line
        self.pending_log = PendingLog(
            work,
            stats,
            {
                "step": self.step,
                "lr": self.optimizer.param_groups[0]["lr"],
                "step_time_s": step_time,
                "mem_bytes": memory_bytes(self.world.device) if main else 0,
                "epoch": self.sampler.epoch,
                "time_s": time.perf_counter() - self.t_start,
            },
            cuda_memory(self.world.device) if main else {},
        )

    def end_log(self) -> None:
        """Finish the logging step's all-reduce started by log_step (if any): its line,
        the stop-check interval, and the divergence check. Every rank calls it at the same
        point, before anything that reads what it sets (a save, an evaluation, the end)."""
        p = self.pending_log
        if p is None:
            return
        self.pending_log = None
        self.phase = "loss all_reduce (logging)"
        self.guarded(self._report, p, when=f"at step {p.record['step']}")

    def _report(self, p: PendingLog) -> None:
        p.work.wait()
        loss_sum, gn_sum, time_sum, kept_sum, bad = p.stats.tolist()  # the one host sync
        n, rec = self.world.size, p.record
        loss_avg = loss_sum / n
        self.stop_every = stop_check_every(self.cfg.stop_check_s, time_sum / n)
        self.first_loss = loss_avg if self.first_loss is None else self.first_loss
        self.last_loss = loss_avg
        per_sample = self.data.tokens_per_sample or 1
        step_time = rec["step_time_s"]
        throughput = self.global_batch * per_sample / step_time
        mfu = self.mfu(throughput)
        if rec["step"] > 1:
            self.throughputs.append(throughput)
            if mfu is not None:
                self.mfus.append(mfu)
        self.reporter.log(
            {
                "step": rec["step"],
                "loss": loss_avg,
                "lr": rec["lr"],
                "grad_norm": gn_sum / n,
                "throughput": throughput,
                "throughput_unit": "tokens/s" if self.data.tokens_per_sample else "samples/s",
                "samples_per_s": self.global_batch / step_time,
                "step_time_s": step_time,
                "mem_bytes": rec["mem_bytes"],
                "epoch": rec["epoch"],
                "time_s": rec["time_s"],
                "mfu": mfu,
                **p.cuda,
            }
        )
        if Health.flagged(kept_sum, bad):  # the same on every rank: all join the MIN
            self.phase = "divergence check all_reduce"
            self.health.check()

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilisation (models that give FLOPs per token): achieved / (peak x GPUs)."""
        if self.flops_per_token is None or self.peak_flops is None:
            return None
        return tokens_per_s * self.flops_per_token / (self.peak_flops * self.world.size)

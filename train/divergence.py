"""Loss health: a non-finite loss or gradient norm stops the run (EXIT_DIVERGED), found without
a host sync per step."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class Diverged(Exception):
    """A non-finite loss or gradient norm: the run stops (EXIT_DIVERGED) and saves nothing."""

    def __init__(self, step: int, skipped: int = 0) -> None:
        super().__init__(step)
        self.step, self.skipped = step, skipped


_NO_BAD_STEP = 2**62


class Health:
    """Non-finite loss / gradient norm detection without a host sync per step.

    A step hands over its loss (plus its gradient norm when it computed one: the sum is
    non-finite when either is), and the tensor is only kept: no kernel, no sync. Every
    WINDOW steps the kept values are folded into a device tensor holding the first bad step
    (a few kernels for the whole window). The logging step's all-reduce carries `flags()`:
    non-finite or non-zero where some rank saw a bad step; then `check()`, one MIN
    all-reduce, names the step (Diverged). `check()` also runs before every save. With
    --max-bad-steps N the step itself must know (to skip the optimizer), so `step_ok()`
    syncs and agrees every step: the opt-in cost.
    """

    WINDOW = 64  # steps kept before a fold: 64 scalar tensors

    def __init__(self, device: torch.device, max_bad_steps: int) -> None:
        self.first = torch.full((), _NO_BAD_STEP, dtype=torch.int64, device=device)
        self.bad = torch.zeros((), device=device)  # 1.0 once a fold found a bad step
        self.max_bad_steps = max_bad_steps
        self.skipped = 0
        self._kept: list[torch.Tensor] = []  # one value per step from `_start` on
        self._start = 0
        self._offsets = torch.arange(self.WINDOW, dtype=torch.int64, device=device)

    @staticmethod
    def local(gnorm: torch.Tensor) -> torch.Tensor:
        # FSDP: the local part of the norm; a non-finite global norm has a non-finite part
        # on some rank, and the all-reduces below bring it to every rank.
        return gnorm.to_local() if hasattr(gnorm, "to_local") else gnorm

    @staticmethod
    def finite(loss: torch.Tensor, gnorm: torch.Tensor | None) -> torch.Tensor:
        ok = torch.isfinite(loss)
        if gnorm is not None:
            ok = ok & torch.isfinite(Health.local(gnorm))
        return ok

    def observe(self, step: int, loss: torch.Tensor, gnorm: torch.Tensor | None) -> None:
        """Keep step `step`'s values. Steps come in order; a step seen again (a torchft
        group retries a step it could not commit) starts a new window."""
        n = len(self._kept)
        if n and (step != self._start + n or n == self.WINDOW):
            self._fold()
        if not self._kept:
            self._start = step
        self._kept.append(loss if gnorm is None else loss + Health.local(gnorm))

    def _fold(self) -> None:
        if not self._kept:
            return
        n = len(self._kept)
        bad = torch.isfinite(torch.stack(self._kept)).logical_not_()
        at = torch.where(bad, self._offsets[:n], _NO_BAD_STEP).min()  # the first bad row
        # a window with no bad row gives _NO_BAD_STEP + start: above, so `first` stays
        self.first = torch.minimum(self.first, at + self._start)
        self.bad = (self.first != _NO_BAD_STEP).float()
        self._kept.clear()

    def flags(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Local, no sync, for a SUM all-reduce that runs anyway: (the kept values' sum, the
        folds' verdict). Some rank saw a non-finite step when, summed over ranks, the first
        is not finite or the second is not 0 (`flagged`). Finite values whose sum overflows
        flag too, harmlessly: check() is exact."""
        kept = torch.stack(self._kept).sum(dtype=torch.float32) if self._kept else self.bad
        return kept, self.bad

    @staticmethod
    def flagged(kept_sum: float, bad: float) -> bool:
        return not math.isfinite(kept_sum) or bad != 0

    def check(self) -> None:
        """Raise Diverged if any rank saw a non-finite step since the start (collective)."""
        self._fold()
        t = self.first.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        if int(t) != _NO_BAD_STEP:
            raise Diverged(int(t), self.skipped)

    def step_ok(self, step: int, ok: torch.Tensor) -> bool:
        """--max-bad-steps: True to apply this step, False to skip it (agreed by all ranks);
        past the budget, Diverged (the bad step is never applied)."""
        t = ok.to(torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        if int(t):
            return True
        self.skipped += 1
        if self.skipped > self.max_bad_steps:
            raise Diverged(step, self.skipped - 1)
        return False

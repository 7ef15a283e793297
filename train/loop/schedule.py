"""Learning-rate rules: scaling with the global batch, warmup, decay. Pure functions."""

from __future__ import annotations

import math


def scaled_lr(base_lr: float, rule: str, global_batch: int, base_batch: int | None) -> float:
    """The peak LR for a global batch.

    linear: lr * B / B0 (Goyal et al. 2017, "Accurate, Large Minibatch SGD");
    sqrt:   lr * sqrt(B / B0) (Krizhevsky 2014; the usual rule for Adam-type optimizers);
    none:   lr unchanged.
    """
    if rule == "none":
        return base_lr
    assert base_batch, "base_batch_size is required for lr scaling"
    ratio = global_batch / base_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    raise ValueError(f"unknown lr scaling rule {rule!r}")


def lr_multiplier(step: int, warmup: int, total: int, decay: str, min_ratio: float = 0.0) -> float:
    """Multiplier of the peak LR for optimizer step `step` (0-based).

    Linear warmup from 1/warmup to 1 over the first `warmup` steps (step 0 already trains,
    at lr/warmup), then constant or cosine decay from 1 at step `warmup` down to `min_ratio`
    at step `total`.
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if decay == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

"""The held-out evaluation: training's micro-batch, at most --eval-steps batches per rank.

Every rank evaluates the same number of samples (FSDP needs lockstep), its own contiguous
slice of the held-out split, and the sums meet in one all-reduce. The logits of one eval batch
are what training already holds, so evaluation fits wherever training fits.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddpkit.train import registry

if TYPE_CHECKING:
    from ddpkit.train.config import TrainConfig
    from ddpkit.train.distributed import World


@torch.no_grad()
def held_out(
    model: torch.nn.Module,
    val: Any,
    loss_fn: Callable,
    cfg: TrainConfig,
    world: World,
    autocast: Callable[[], AbstractContextManager],
) -> dict[str, float]:
    """{eval_loss[, eval_accuracy]}, the same on every rank; {} without a split to use.
    Collective: every rank calls it."""
    if val is None or len(val) < world.size:
        return {}
    model.eval()
    n = len(val) // world.size
    micro = cfg.batch_size
    if cfg.eval_steps:
        n = min(n, micro * cfg.eval_steps)
    start = world.rank * (len(val) // world.size)
    idx = list(range(start, start + n))
    stats = torch.zeros(3, device=world.device)
    # Accuracy means something only for a cross-entropy over classes or tokens.
    classes = loss_fn is registry.LOSSES["cross_entropy"]
    for lo in range(0, n, micro):
        batch = [val[i] for i in idx[lo : lo + micro]]
        x = torch.stack([b[0] for b in batch]).to(world.device)
        y = torch.stack([torch.as_tensor(b[1]) for b in batch]).to(world.device)
        with autocast():
            out = model(x).float()
        if classes:
            stats[0] += F.cross_entropy(out.flatten(0, -2), y.flatten(), reduction="sum")
            stats[1] += (out.argmax(-1) == y).sum()
            stats[2] += y.numel()
        else:  # the user's loss is a mean over the batch: weight it by the batch size
            stats[0] += loss_fn(out, y).float() * len(batch)
            stats[2] += len(batch)
    dist.all_reduce(stats)
    model.train()
    ev = {"eval_loss": float(stats[0] / stats[2])}
    if classes:
        ev["eval_accuracy"] = float(stats[1] / stats[2])
    return ev

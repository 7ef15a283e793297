"""Points around class centres in `dim` dimensions: learnable in a few steps."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset


def build_dataset(cfg, samples: int = 2048, dim: int = 16, classes: int = 4):
    """The kit calls this as build_dataset(cfg, **dataset_args) on every rank: the same
    samples in the same order everywhere (seeded), so the kit's sampler can shard them."""
    g = torch.Generator().manual_seed(cfg.seed)
    centres = 2.0 * torch.randn(classes, dim, generator=g)

    def make(n: int) -> TensorDataset:
        y = torch.randint(0, classes, (n,), generator=g)
        return TensorDataset(centres[y] + torch.randn(n, dim, generator=g), y)

    return make(samples), make(samples // 8), {"num_classes": classes}

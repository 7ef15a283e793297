"""A residual MLP classifier: the kit wraps each ResBlock (the repeated layers in the largest
nn.ModuleList) as one FSDP2 unit, with no `blocks()` method needed."""

from __future__ import annotations

import torch
from torch import nn


class ResBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class ResMLP(nn.Module):
    def __init__(self, in_dim: int, width: int, depth: int, classes: int):
        super().__init__()
        self.inp = nn.Linear(in_dim, width)
        self.layers = nn.ModuleList(ResBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)

    def flops_per_token(self, seq_len: int) -> float:
        # One "token" is one sample here: forward + backward = 6 FLOPs per parameter.
        return 6.0 * sum(p.numel() for p in self.parameters())


def build_model(cfg, width: int = 64, depth: int = 3, in_dim: int = 16, classes: int = 4):
    """The kit calls this as build_model(cfg, **model_args); cfg is ddpkit's TrainConfig."""
    return ResMLP(in_dim, width, depth, classes)

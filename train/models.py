"""Models: the article's MLPs, torchvision's ResNet-18 and a small decoder-only GPT.

They are registered in train/builtins.py like a user's model. Every model here exposes
`blocks()`: the submodules that parallel.py wraps one by one (one FSDP unit, one compile
region, one activation-checkpoint region each).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from ddpkit.train.config import TrainConfig
from torch import nn


class MLP(nn.Module):
    """784-in MLP: `hidden` widths, ReLU between layers. One block per Linear(+ReLU)."""

    def __init__(self, in_dim: int, hidden: list[int], out_dim: int):
        super().__init__()
        dims = [in_dim, *hidden, out_dim]
        layers: list[nn.Module] = []
        for i in range(len(dims) - 1):
            lin = nn.Linear(dims[i], dims[i + 1])
            layers.append(nn.Sequential(lin, nn.ReLU()) if i < len(dims) - 2 else lin)
        self.layers = nn.ModuleList(layers)

    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.layers:
            x = layer(x)
        return x


class ResNet(nn.Module):
    """torchvision ResNet-18 (random init); its four stages are the blocks."""

    def __init__(self, num_classes: int, in_channels: int):
        super().__init__()
        from torchvision.models import resnet18  # torchvision only when this model is used

        self.net = resnet18(num_classes=num_classes)
        if in_channels != 3:
            self.net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)

    def blocks(self) -> list[nn.Module]:
        return [self.net.layer1, self.net.layer2, self.net.layer3, self.net.layer4]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x MLP."""

    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)), p, self.training)
        return x + F.dropout(self.out(F.gelu(self.fc(self.ln2(x)))), p, self.training)


class GPT(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.seq_len = cfg.seq_len
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.layers = nn.ModuleList(
            Block(cfg.d_model, cfg.n_head, cfg.dropout) for _ in range(cfg.n_layer)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith(("proj.weight", "out.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


def gpt_flops_per_token(cfg: TrainConfig, num_params: int) -> float:
    """Training FLOPs per token: 6N for the matmuls plus attention's 12*L*d*T (PaLM, app. B)."""
    return 6 * num_params + 12 * cfg.n_layer * cfg.d_model * cfg.seq_len


def build_model(cfg: TrainConfig, in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build through the registry on the CPU from the current RNG state (the caller seeds it
    identically on all ranks); in_shape/num_classes are what the data gives."""
    from ddpkit.train import resolve
    from ddpkit.train.data import DataBundle

    return resolve.model_spec(cfg).build(cfg, DataBundle(None, None, in_shape, num_classes))

"""ddpkit's public API in one script: your model and data, the kit's training.
python examples/fit_script.py --steps 50
torchrun --nproc-per-node 2 examples/fit_script.py --parallel fsdp
"""

import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the ddpkit checkout
from ddpkit.train import fit  # noqa: E402


def build_model(cfg, width=64):
    layers = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(3)]
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), *layers, nn.Linear(width, 2))


def build_dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(2048, 8, generator=g)
    return TensorDataset(x, (x.sum(1) > 0).long()), None


if __name__ == "__main__":
    raise SystemExit(fit(build_model, build_dataset, steps=100, batch_size=32, lr=3e-3))

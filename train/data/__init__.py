"""Datasets and the resumable, world-size-independent sampler.

One concern per module, imported downward only:
- permutation.py: the seeded bijection the epoch order is (pure numpy);
- sampler.py: GlobalBatchSampler, the (epoch, consumed) state that makes data exactly-once
  across restarts and world sizes;
- bundle.py: DataBundle, what a dataset builder returns;
- tokens.py: token files and corpora read per window, and the token datasets;
- vision.py: synthetic classes, MNIST, CIFAR-10, image folders;
- user_dataset.py: a user's dataset factory checked and named before training;
- loader.py: this rank's micro-batches from the sampler's position.

The names below are the package's interface (the trainer, the registry's built-ins, a user's
code and the benchmarks import them from here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddpkit.train.data.bundle import DataBundle
from ddpkit.train.data.loader import iterate_batches
from ddpkit.train.data.sampler import GlobalBatchSampler
from ddpkit.train.data.tokens import (
    TokenChunks,
    TokenFile,
    WindowBatches,
    open_corpus,
    synthetic_tokens,
    token_dtype,
    token_file,
)
from ddpkit.train.data.user_dataset import bundle_from_user
from ddpkit.train.data.vision import mnist, synthetic_classification, torchvision_dataset

if TYPE_CHECKING:
    from ddpkit.train.config import TrainConfig

__all__ = [
    "DataBundle",
    "GlobalBatchSampler",
    "TokenChunks",
    "TokenFile",
    "WindowBatches",
    "build_data",
    "bundle_from_user",
    "iterate_batches",
    "mnist",
    "open_corpus",
    "synthetic_classification",
    "synthetic_tokens",
    "token_dtype",
    "token_file",
    "torchvision_dataset",
]


def build_data(cfg: TrainConfig, rank0_download: bool = True) -> DataBundle:
    """The job's dataset, as the registry names it (model's data kind, dataset spec)."""
    from ddpkit.train import resolve

    kind = resolve.model_spec(cfg).data_kind
    return resolve.dataset_spec(cfg).build(cfg, rank0_download, kind)

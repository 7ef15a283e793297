"""What a dataset builder hands the trainer: the splits and the shapes the model is built for."""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import Dataset


@dataclass
class DataBundle:
    train: Dataset
    val: Dataset | None
    in_shape: tuple[int, ...]
    num_classes: int  # vocabulary size for token data
    tokens_per_sample: int = 0  # > 0 for language-model data (tokens/s logging)

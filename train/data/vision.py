"""Image datasets: synthetic classes, MNIST from its IDX files, CIFAR-10 and image folders."""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from ddpkit.train import registry
from ddpkit.train.data.bundle import DataBundle
from ddpkit.train.errors import ConfigError
from torch.utils.data import TensorDataset

if TYPE_CHECKING:
    from ddpkit.train.config import TrainConfig


def _shape(name: str) -> tuple[int, ...]:
    """x's shape for a built-in image dataset: the registry's (the planner reads it there)."""
    shape = registry.DATASETS[name].in_shape
    assert shape is not None, name
    return shape


def synthetic_classification(cfg: TrainConfig) -> DataBundle:
    """Gaussian clusters around per-class prototypes in a 28x28 'image': learnable in seconds."""
    g = torch.Generator().manual_seed(10_007 + cfg.seed)
    k, shape = cfg.synthetic_classes, _shape("synthetic")
    protos = torch.randn(k, *shape, generator=g)
    n_val = max(cfg.synthetic_samples // 8, k)

    def make(n: int) -> TensorDataset:
        y = torch.randint(0, k, (n,), generator=g)
        x = 0.15 * protos[y] + torch.randn(n, *shape, generator=g)
        return TensorDataset(x, y)

    return DataBundle(make(cfg.synthetic_samples), make(n_val), shape, k)


def _read_idx(path: Path) -> torch.Tensor:
    """Read an IDX file (MNIST's format), gzipped or not; ConfigError for a damaged one."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise ConfigError(f"{path}: not a readable gzip file ({e}); re-download it") from None
    if len(raw) < 4:
        raise ConfigError(f"{path}: {len(raw)} bytes, shorter than an IDX header; re-download it")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08 or ndim == 0:
        raise ConfigError(f"{path} is not an IDX file of unsigned bytes; re-download it")
    if len(raw) < 4 + 4 * ndim:
        raise ConfigError(f"{path}: truncated IDX header ({len(raw)} bytes); re-download it")
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    want, have = math.prod(dims), len(raw) - 4 - 4 * ndim
    if have < want:
        raise ConfigError(
            f"{path}: the header promises {' x '.join(map(str, dims))} = {want} bytes of data, "
            f"the file holds {have} (truncated); re-download it"
        )
    data = np.frombuffer(raw, dtype=np.uint8, count=want, offset=4 + 4 * ndim)
    return torch.from_numpy(data.copy()).view(*dims)


def _check_mnist(img_path: Path, x: torch.Tensor, lbl_path: Path, y: torch.Tensor) -> None:
    """The shapes and labels the models and the loss expect, named before training."""
    if x.dim() != 3 or tuple(x.shape[1:]) != (28, 28):
        raise ConfigError(
            f"{img_path}: images of {' x '.join(map(str, x.shape[1:]))}, MNIST's are 28 x 28; "
            "use MNIST's files (or --dataset imagefolder for other images)"
        )
    if y.dim() != 1 or len(y) != len(x):
        raise ConfigError(
            f"{img_path} holds {len(x)} images, {lbl_path} {len(y)} labels; use a matching pair"
        )
    if len(y) and int(y.max()) >= 10:
        raise ConfigError(
            f"{lbl_path}: label {int(y.max())} >= 10 classes; MNIST's labels are 0..9"
        )


_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _find(raw: Path, stem: str) -> Path | None:
    for cand in (raw / stem, raw / f"{stem}.gz"):
        if cand.is_file():
            return cand
    return None


def mnist(cfg: TrainConfig, rank0_download: bool) -> DataBundle:
    raw = Path(cfg.data_dir) / "MNIST" / "raw"
    if _find(raw, _MNIST_FILES["train"][0]) is None and cfg.download and rank0_download:
        try:
            from torchvision.datasets import MNIST

            MNIST(cfg.data_dir, train=True, download=True)
            MNIST(cfg.data_dir, train=False, download=True)
        except Exception as e:  # no network: fall through to the clear error below
            print(f"warning: MNIST download failed ({type(e).__name__}: {e})", flush=True)
    splits = {}
    for split, (img_stem, lbl_stem) in _MNIST_FILES.items():
        img, lbl = _find(raw, img_stem), _find(raw, lbl_stem)
        if img is None or lbl is None:
            if split == "val":
                continue
            raise ConfigError(
                f"MNIST not found under {raw}; put train-images-idx3-ubyte(.gz) and "
                f"train-labels-idx1-ubyte(.gz) there (from yann.lecun.com/exdb/mnist), "
                "or allow the download"
            )
        x, y = _read_idx(img), _read_idx(lbl)
        _check_mnist(img, x, lbl, y)
        # The article's transform: ToTensor() scales to [0, 1].
        splits[split] = TensorDataset(x.float().div_(255.0).unsqueeze(1), y.long())
    return DataBundle(splits["train"], splits.get("val"), _shape("mnist"), 10)


def torchvision_dataset(cfg: TrainConfig, rank0_download: bool) -> DataBundle:
    from torchvision import datasets, transforms

    tf = transforms.ToTensor()
    if cfg.dataset == "cifar10":
        try:
            train = datasets.CIFAR10(
                cfg.data_dir, True, tf, download=cfg.download and rank0_download
            )
            val = datasets.CIFAR10(cfg.data_dir, False, tf, download=False)
        except RuntimeError as e:
            raise ConfigError(
                f"CIFAR-10 not found under {cfg.data_dir} ({e}); put cifar-10-batches-py "
                "there (extract cifar-10-python.tar.gz) or allow the download"
            ) from None
        return DataBundle(train, val, _shape("cifar10"), 10)
    shape = _shape("imagefolder")
    tf = transforms.Compose([transforms.Resize(shape[1:]), transforms.ToTensor()])
    root = Path(cfg.data_dir)
    train_root = root / "train" if (root / "train").is_dir() else root
    try:
        train = datasets.ImageFolder(str(train_root), tf, loader=_image_loader)
    except (FileNotFoundError, RuntimeError) as e:
        raise ConfigError(
            f"--data-dir {cfg.data_dir}: not an image folder ({e}); use <dir>/<class>/<image> "
            "(optionally under train/ and val/)"
        ) from None
    val = (
        datasets.ImageFolder(str(root / "val"), tf, loader=_image_loader)
        if (root / "val").is_dir()
        else None
    )
    return DataBundle(train, val, shape, len(train.classes))


def _image_loader(path: str):
    """torchvision's loader, with a damaged or non-image file named in one line (the rank
    that meets it says so; the others leave quietly) instead of PIL's traceback."""
    from torchvision.datasets.folder import default_loader

    try:
        return default_loader(path)
    except (OSError, ValueError, SyntaxError) as e:  # PIL: UnidentifiedImageError, truncated
        raise ConfigError(
            f"{path}: not a readable image ({type(e).__name__}: {e}); remove or replace it"
        ) from None

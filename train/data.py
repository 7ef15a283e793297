"""Datasets and the resumable, world-size-independent sampler.

The sampler is the heart of exactly-once data: every rank computes the same permutation of
the dataset for an epoch (seed + epoch), the epoch is cut into global batches of
`batch * world` samples, and rank r takes slice r of each. The permutation is a seeded
bijection evaluated per batch (train/permutation.py), never materialized: O(batch) memory
and time whatever the dataset's size. The only state is (epoch, samples consumed in the
epoch), so a checkpoint taken with one world size resumes on another at the same sample:
nothing seen twice, nothing skipped. A partial global batch at the end of an epoch is dropped
(like DistributedSampler(drop_last=True)): every rank runs the same number of steps, so an
uneven tail can never hang a collective.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import math
import os
import struct
import weakref
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ddpkit.train.config import ConfigError, TrainConfig
from ddpkit.train.errors import UserError
from ddpkit.train.permutation import epoch_key, permute
from ddpkit.train.tokens import TokenChunks, WindowBatches, find_token_files, open_corpus
from ddpkit.train.tokens import TokenFile as TokenFile  # re-exported: callers import it here
from ddpkit.train.tokens import token_dtype as token_dtype
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate


@dataclass
class DataBundle:
    train: Dataset
    val: Dataset | None
    in_shape: tuple[int, ...]
    num_classes: int  # vocabulary size for token data
    tokens_per_sample: int = 0  # > 0 for language-model data (tokens/s logging)


class GlobalBatchSampler:
    """Yields this rank's index list per micro-batch; state = (epoch, consumed)."""

    def __init__(self, n: int, batch: int, world: int, rank: int, seed: int, shuffle: bool = True):
        self.n, self.batch, self.world, self.rank = n, batch, world, rank
        self.seed, self.shuffle = seed, shuffle
        self.epoch = 0
        self.consumed = 0  # samples of this epoch already handed out, summed over ranks

    @property
    def global_batch(self) -> int:
        return self.batch * self.world

    def batches_per_epoch(self) -> int:
        return self.n // self.global_batch

    def indices(self, epoch: int, start: int, count: int) -> list[int]:
        """Positions start .. start+count-1 of the epoch's order, as sample indices.
        Older kits drew the order with torch.randperm: their checkpoint taken mid-epoch resumes
        that epoch in this order, so its rest is not exactly-once (the epochs after it are)."""
        pos = np.arange(start, start + count, dtype=np.int64)
        if not self.shuffle:
            return pos.tolist()
        return permute(pos, self.n, epoch_key(self.seed, epoch)).tolist()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        # A checkpoint from another world size can stop where less than one of OUR global
        # batches is left in the epoch: that rest is this world's dropped tail, so move on
        # (staying would yield no batch and the data loop would spin forever).
        self._roll_over()

    def advance(self) -> None:
        """Mark one global batch as consumed (called by the trainer after each micro-step)."""
        self.consumed += self.global_batch
        self._roll_over()

    def _roll_over(self) -> None:
        if self.consumed + self.global_batch > self.n:  # the rest is a dropped partial batch
            self.epoch, self.consumed = self.epoch + 1, 0

    def epoch_indices(self) -> Iterator[list[int]]:
        """This rank's batches for the rest of the current epoch (does not mutate state).
        The position is read now, not at the first next(): advance() may run in between."""
        return self._batches(self.epoch, self.consumed)

    def _batches(self, epoch: int, start: int) -> Iterator[list[int]]:
        while start + self.global_batch <= self.n:
            yield self.indices(epoch, start + self.rank * self.batch, self.batch)
            start += self.global_batch


# --- datasets -------------------------------------------------------------------------------


def synthetic_classification(cfg: TrainConfig) -> DataBundle:
    """Gaussian clusters around per-class prototypes in a 28x28 'image': learnable in seconds."""
    g = torch.Generator().manual_seed(10_007 + cfg.seed)
    k, shape = cfg.synthetic_classes, (1, 28, 28)
    protos = torch.randn(k, *shape, generator=g)
    n_val = max(cfg.synthetic_samples // 8, k)

    def make(n: int) -> TensorDataset:
        y = torch.randint(0, k, (n,), generator=g)
        x = 0.15 * protos[y] + torch.randn(n, *shape, generator=g)
        return TensorDataset(x, y)

    return DataBundle(make(cfg.synthetic_samples), make(n_val), shape, k)


def synthetic_tokens(cfg: TrainConfig) -> DataBundle:
    """A Markov chain where each token has two likely successors: a learnable language."""
    g = torch.Generator().manual_seed(20_011 + cfg.seed)
    v = cfg.vocab_size
    succ = torch.randint(0, v, (v, 2), generator=g).tolist()
    n = cfg.synthetic_samples * cfg.seq_len + 1
    choice = torch.randint(0, 2, (n,), generator=g).tolist()
    out = [0] * n
    for i in range(1, n):  # a chain is sequential; plain lists make 1M tokens take ~0.3 s
        out[i] = succ[out[i - 1]][choice[i]]
    toks = np.asarray(out, dtype=np.int64)
    split = int(n * 7 / 8)
    return DataBundle(
        TokenChunks(toks[:split], cfg.seq_len),
        TokenChunks(toks[split:], cfg.seq_len),
        (cfg.seq_len,),
        v,
        cfg.seq_len,
    )


def token_file(cfg: TrainConfig) -> DataBundle:
    """Token ids from --data-dir (a file, nanoGPT's train.bin/val.bin, or a directory of
    *.bin shards: tokens.find_token_files), read per window: uint16, or uint32 when
    --vocab-size is above 65536. Start-up stats the files and reads none of their bytes."""
    train_paths, val_paths = find_token_files(Path(cfg.data_dir))
    if not train_paths or not train_paths[0].is_file():
        expected = train_paths[0] if train_paths else f"{cfg.data_dir}/train.bin or *.bin shards"
        raise ConfigError(f"--data-dir {cfg.data_dir}: no token file (expected {expected})")
    train = open_corpus(train_paths, cfg.seq_len, cfg.vocab_size, "training")
    val = open_corpus(val_paths, cfg.seq_len, cfg.vocab_size, "held-out") if val_paths else None
    return DataBundle(train, val, (cfg.seq_len,), cfg.vocab_size, cfg.seq_len)


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
    return DataBundle(splits["train"], splits.get("val"), (1, 28, 28), 10)


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
        return DataBundle(train, val, (3, 32, 32), 10)
    tf = transforms.Compose([transforms.Resize((64, 64)), transforms.ToTensor()])
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
    return DataBundle(train, val, (3, 64, 64), len(train.classes))


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


def build_data(cfg: TrainConfig, rank0_download: bool = True) -> DataBundle:
    from ddpkit.train import lookup as registry

    kind = registry.model_spec(cfg).data_kind
    return registry.dataset_spec(cfg).build(cfg, rank0_download, kind)


def bundle_from_user(out: object, path: str, contract: str) -> DataBundle:
    """A dataset factory's (train, val[, info]) as a DataBundle, or a ConfigError."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"--dataset {path} returned {why}; expected {contract}")

    if not isinstance(out, tuple) or len(out) not in (2, 3):
        return_type = type(out).__name__
        raise bad(f"a {return_type}" + (f" of {len(out)}" if isinstance(out, tuple) else ""))
    train, val, info = (*out, {}) if len(out) == 2 else out
    for name, ds in (("train", train), ("val", val)):
        if ds is None and name == "val":
            continue
        if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
            raise bad(f"a {type(ds).__name__} as {name} (no len() / [i])")
    if len(train) == 0:
        raise bad("an empty train dataset")
    first = train[0]
    if not (isinstance(first, (tuple, list)) and len(first) == 2):
        raise bad(f"items of type {type(first).__name__} (train[0]); items must be (x, y) pairs")
    if not isinstance(info, dict):
        raise bad(f"info of type {type(info).__name__}; info must be a dict")
    counts = {}
    for key in ("tokens_per_sample", "num_classes"):
        v = info.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad(f"info[{key!r}] = {v!r}; it must be an integer >= 0")
        counts[key] = v
    shapes = _item_shapes(first, f"--dataset {path}: train[0]")
    for name, ds in (("train", train), ("val", val)):
        if ds is not None:
            _probe_items(ds, name, shapes, f"--dataset {path}")
    for ds in (train, val):
        _name_dataset(ds, f"--dataset {path}")
    x_shape = shapes[0]
    return DataBundle(train, val, x_shape, counts["num_classes"], counts["tokens_per_sample"])


# A user's samples must stack into batches: every x of one shape, every y of one shape. A
# handful of items spread over each split is checked before training, so the usual mistakes
# (a short last sample, a val split of another width, a string label) are one line up front,
# not a collate traceback on some rank mid-epoch; the rest are checked as batches form.
_PROBES = 8
_DATASET_NAMES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _name_dataset(ds: object, name: str) -> None:
    with contextlib.suppress(TypeError):  # not weak-referenceable or not hashable: unnamed
        _DATASET_NAMES[ds] = name


def _dataset_name(ds: object) -> str:
    try:
        return _DATASET_NAMES.get(ds, "the dataset")
    except TypeError:
        return "the dataset"


def _item_shapes(item: object, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(x shape, y shape) of one (x, y) item, or a ConfigError naming what it holds."""
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise ConfigError(
            f"{where} is a {type(item).__name__}"
            + (f" of {len(item)}" if isinstance(item, (tuple, list)) else "")
            + "; every item must be an (x, y) pair"
        )
    out = []
    for part, v in zip(("x", "y"), item, strict=True):
        try:
            t = torch.as_tensor(v)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ConfigError(
                f"{where}: its {part} is a {type(v).__name__} that is not a tensor of numbers "
                f"({e}); return tensors, arrays or numbers"
            ) from None
        out.append(tuple(t.shape))
    return out[0], out[1]


def _show(shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    return f"x {list(shapes[0])}, y {list(shapes[1])}"


def _probe_items(ds, split: str, want: tuple, name: str) -> None:
    n = len(ds)
    picks = sorted({min(n - 1, (n - 1) * k // (_PROBES - 1)) for k in range(_PROBES)} | {1})
    for i in (i for i in picks if 0 <= i < n):
        try:
            item = ds[i]
        except UserError:
            raise
        except Exception as e:  # the user's __getitem__ may raise anything
            raise ConfigError(
                f"{name}: {split}[{i}] raised {type(e).__name__}: {e}; len({split}) is {n}, "
                "so every index below it must load"
            ) from None
        got = _item_shapes(item, f"{name}: {split}[{i}]")
        if got != want:
            raise ConfigError(
                f"{name}: {split}[{i}] has {_show(got)}, train[0] has {_show(want)}; every "
                "sample must have the same shapes to stack into a batch (pad or crop them in "
                "the dataset)"
            )


def _collate_checked(items: list[tuple[int, object]]) -> object:
    """default_collate of (index, item) pairs; a batch that does not stack comes back as a
    _BadBatch naming the first item whose shapes differ (raised by the main process: an
    exception raised in a DataLoader worker arrives as a multi-line re-raise)."""
    try:
        return default_collate([item for _, item in items])
    except (RuntimeError, TypeError, ValueError) as e:
        i0, first = items[0]
        try:
            want = _item_shapes(first, f"item {i0}")
            for i, item in items[1:]:
                got = _item_shapes(item, f"item {i}")
                if got != want:
                    return _BadBatch(
                        f"item {i} has {_show(got)}, item {i0} of the same batch has "
                        f"{_show(want)}; every sample must have the same shapes to stack into "
                        "a batch (pad or crop them in the dataset)"
                    )
        except ConfigError as bad_item:
            return _BadBatch(str(bad_item))
        return _BadBatch(f"items {i0}.. do not stack into a batch ({type(e).__name__}: {e})")


@dataclass
class _BadBatch:
    why: str


class _Indexed(Dataset):
    """The user's dataset, each item with its index (for _collate_checked's message)."""

    def __init__(self, ds: Dataset):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[int, object]:
        return i, self.ds[i]


# --- iteration --------------------------------------------------------------------------------


def iterate_batches(
    ds: Dataset, sampler: GlobalBatchSampler, device: torch.device, num_workers: int, rank: int
) -> Iterator[tuple[torch.Tensor, ...]]:
    """This rank's micro-batches forever, epoch after epoch, from the sampler's position.

    The caller advances the sampler after consuming each batch; the index lists of an epoch
    are fixed when the epoch starts, so DataLoader workers can prefetch them.
    """
    trace = _trace_file(rank)
    while True:
        if sampler.consumed + sampler.global_batch > sampler.n:
            # the sampler rolls over before this; never spin on an empty epoch
            raise RuntimeError(
                f"sampler at epoch {sampler.epoch}, {sampler.consumed} of {sampler.n} samples "
                f"consumed, has no global batch of {sampler.global_batch} left"
            )
        epoch = sampler.epoch
        # A generator, not a list: a 10M-sample epoch as Python lists would cost ~400 MB per
        # rank. tee: each batch's indices computed once for both readers (the loader runs a
        # few batches ahead; the permutation is ~0.1 ms a batch, a fifth of the data path).
        index_lists, for_loader = itertools.tee(sampler.epoch_indices())
        batches = _epoch_batches(ds, for_loader, device, num_workers)
        for idx, batch in zip(index_lists, batches, strict=True):
            if trace is not None:  # test hook: the samples this rank trains on, as handed over
                # (here, not where the sampler hands lists to DataLoader workers: they
                # prefetch batches that a stop may leave unconsumed)
                trace.write(f"{epoch} {' '.join(map(str, idx))}\n")
            yield batch


def _epoch_batches(
    ds: Dataset, index_lists: Iterator[list[int]], device: torch.device, num_workers: int
) -> Iterator[tuple[torch.Tensor, ...]]:
    """One epoch's batches for the given index lists, in their order."""
    if isinstance(ds, TensorDataset) and num_workers == 0:
        # In-memory tensors: one gather per batch instead of per-sample collation.
        for idx in index_lists:
            t = torch.tensor(idx)
            yield tuple(x[t].to(device, non_blocking=True) for x in ds.tensors)
        return
    if isinstance(ds, TokenChunks) and num_workers == 0:
        for idx in index_lists:  # windows read from the file, widened per batch
            yield tuple(x.to(device, non_blocking=True) for x in ds.batch(idx))
        return
    if isinstance(ds, TokenChunks):
        # Workers read whole batches (one vectorized read, no per-window collation); the ids
        # are checked here so a bad one is the kit's one line, not a worker's traceback.
        windows = DataLoader(
            WindowBatches(ds),
            sampler=index_lists,
            batch_size=None,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
        )
        for idx, w in windows:
            ds.check(idx.tolist(), w)
            yield w[:, :-1].to(device, non_blocking=True), w[:, 1:].to(device, non_blocking=True)
        return
    # Workers: DataLoader keeps batch_sampler order (in_order), so batch k is index_lists[k].
    loader = DataLoader(
        _Indexed(ds),
        batch_sampler=index_lists,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        collate_fn=_collate_checked,
    )
    for batch in loader:
        if isinstance(batch, _BadBatch):
            raise ConfigError(f"{_dataset_name(ds)}: {batch.why}")
        yield tuple(x.to(device, non_blocking=True) for x in batch)


def _trace_file(rank: int):
    d = os.environ.get("DDPKIT_TRACE_SAMPLES")
    return open(Path(d) / f"rank{rank}.txt", "a", buffering=1) if d else None  # noqa: SIM115

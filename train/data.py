"""Datasets and the resumable, world-size-independent sampler.

The sampler is the heart of exactly-once data: every rank computes the same permutation of
the dataset for an epoch (seed + epoch), the epoch is cut into global batches of
`batch * world` samples, and rank r takes slice r of each. The only state is (epoch,
samples consumed in the epoch), so a checkpoint taken with one world size resumes on another
at the same sample: nothing seen twice, nothing skipped. A partial global batch at the end of
an epoch is dropped (like DistributedSampler(drop_last=True)): every rank runs the same number
of steps, so an uneven tail can never hang a collective.
"""

from __future__ import annotations

import gzip
import itertools
import math
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from ddpkit.train.config import ConfigError, TrainConfig
from torch.utils.data import DataLoader, Dataset, TensorDataset


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

    def permutation(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g)

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
        """This rank's batches for the rest of the current epoch (does not mutate state)."""
        perm = self.permutation(self.epoch)
        start = self.consumed
        while start + self.global_batch <= self.n:
            lo = start + self.rank * self.batch
            yield perm[lo : lo + self.batch].tolist()
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


class TokenFile:
    """A flat file of token ids, read window by window with pread.

    Nothing of the file is mapped into the process: a np.memmap would be the obvious tool, but
    the kernel maps whole page-cache folios (2 MiB here) on each fault, so 40 random batches
    from a 2 GB file showed up as +1 GB of RSS per rank even with MADV_RANDOM. pread copies
    only the bytes asked for, needs no file position (safe in forked DataLoader workers),
    and pickles as its path.
    """

    def __init__(self, path: Path, dtype: np.dtype | type):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self.n = self.path.stat().st_size // self.dtype.itemsize
        self._fd: int | None = None
        self._pid = 0

    def __len__(self) -> int:
        return self.n

    def read(self, start: int, count: int) -> np.ndarray:
        if self._fd is None or self._pid != os.getpid():  # one descriptor per process
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        size = self.dtype.itemsize
        return np.frombuffer(os.pread(self._fd, count * size, start * size), dtype=self.dtype)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None, "_pid": 0}


class TokenChunks(Dataset):
    """Non-overlapping (input, target) chunks of seq_len tokens from a 1-D token sequence.

    The ids stay as stored (uint16/uint32 in a TokenFile, or an in-memory array): only the
    windows a batch needs are read and widened to int64, so a 10 GB file costs a batch, not
    40 GB per rank.
    """

    def __init__(self, tokens: np.ndarray | torch.Tensor | TokenFile, seq_len: int):
        self.tokens = tokens.numpy() if isinstance(tokens, torch.Tensor) else tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def _window(self, i: int) -> np.ndarray:
        lo, n = i * self.seq_len, self.seq_len + 1
        if isinstance(self.tokens, TokenFile):
            return self.tokens.read(lo, n)
        return self.tokens[lo : lo + n]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = torch.from_numpy(self._window(i).astype(np.int64))
        return chunk[:-1], chunk[1:]

    def batch(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole batch's windows into one int64 array: one conversion, no collation."""
        out = np.empty((len(idx), self.seq_len + 1), dtype=np.int64)
        for row, i in enumerate(idx):
            out[row] = self._window(i)
        chunk = torch.from_numpy(out)
        return chunk[:, :-1], chunk[:, 1:]


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


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """The id width of a token file: uint16 (nanoGPT's) while ids fit, uint32 above 65536."""
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def _max_id(path: Path, dtype: type[np.unsignedinteger]) -> int:
    """Largest id in the file, read in 64 MiB pieces with plain reads: no mapping of the
    whole file (its pages would count in this process's RSS) and no full copy."""
    hi, count = 0, 2**26 // np.dtype(dtype).itemsize
    with open(path, "rb") as f:
        while (piece := np.fromfile(f, dtype=dtype, count=count)).size:
            hi = max(hi, int(piece.max()))
    return hi


def _open_tokens(path: Path, cfg: TrainConfig, role: str) -> TokenFile:
    """A token file to read windows from, or ConfigError naming what is wrong with it."""
    dtype = token_dtype(cfg.vocab_size)
    width = np.dtype(dtype).itemsize
    size = path.stat().st_size
    if size == 0:
        raise ConfigError(
            f"{role} token file {path} is empty; write token ids into it"
            + (" or remove it (no held-out eval)" if role == "held-out" else "")
        )
    if size % width:
        raise ConfigError(
            f"{role} token file {path} has {size} bytes, not a multiple of {width} "
            f"({np.dtype(dtype).name} ids for --vocab-size {cfg.vocab_size}): truncated, or "
            "written with another id width"
        )
    n = size // width
    if n < cfg.seq_len + 1:
        raise ConfigError(
            f"{role} token file {path} has {n} tokens, fewer than one sequence "
            f"(--seq-len {cfg.seq_len} + 1); use a larger file or a smaller --seq-len"
        )
    top = _max_id(path, dtype)
    if top >= cfg.vocab_size:
        raise ConfigError(
            f"{role} token file {path} holds id {top} >= --vocab-size {cfg.vocab_size}; "
            "raise --vocab-size"
        )
    return TokenFile(path, dtype)


def token_file(cfg: TrainConfig) -> DataBundle:
    """Flat binary token ids (nanoGPT's train.bin, optional val.bin beside it), read per
    window: uint16, or uint32 when --vocab-size is above 65536."""
    p = Path(cfg.data_dir)
    train_path = p / "train.bin" if p.is_dir() else p
    if not train_path.is_file():
        raise ConfigError(f"--data-dir {cfg.data_dir}: no token file (expected {train_path})")
    toks = _open_tokens(train_path, cfg, "training")
    val_path = train_path.with_name("val.bin")
    val = None
    if val_path.is_file() and val_path != train_path:
        val = TokenChunks(_open_tokens(val_path, cfg, "held-out"), cfg.seq_len)
    return DataBundle(
        TokenChunks(toks, cfg.seq_len), val, (cfg.seq_len,), cfg.vocab_size, cfg.seq_len
    )


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
    x = torch.as_tensor(first[0])
    tokens = int(info.get("tokens_per_sample", 0))
    classes = int(info.get("num_classes", 0))
    return DataBundle(train, val, tuple(x.shape), classes, tokens)


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
        # rank. tee: one permutation for both readers (the loader runs a few batches ahead).
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
    # Workers: DataLoader keeps batch_sampler order (in_order), so batch k is index_lists[k].
    loader = DataLoader(
        ds,
        batch_sampler=index_lists,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
    )
    for batch in loader:
        yield tuple(x.to(device, non_blocking=True) for x in batch)


def _trace_file(rank: int):
    d = os.environ.get("DDPKIT_TRACE_SAMPLES")
    return open(Path(d) / f"rank{rank}.txt", "a", buffering=1) if d else None  # noqa: SIM115

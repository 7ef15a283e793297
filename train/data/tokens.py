"""Token corpora: flat files of token ids, one or many, read a batch of windows at a time.

Nothing here grows with the corpus. Opening a corpus stats its files (their sizes give the
window count) and reads none of their bytes; ids are checked against the vocabulary as the
batches read them (a vectorized compare per batch), so a 1 TB corpus starts as fast as a
1 MB one, and a bad id still stops the run with one line naming the file and its offset.

A corpus of several files (FineWeb-style shards: a directory of `*.bin`, sorted by name) is
one dataset whose windows never cross a file boundary: a window spanning two shards would
join the end of one document stream to the start of another, and the bookkeeping would
need the neighbour's bytes. Each shard loses at most seq_len tokens to its own tail.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from ddpkit.train.data.bundle import DataBundle
from ddpkit.train.errors import ConfigError
from torch.utils.data import Dataset

if TYPE_CHECKING:
    from ddpkit.train.config import TrainConfig

MAX_OPEN = 64  # descriptors a corpus keeps open per process; random windows touch every shard


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """The id width of a token file: uint16 (nanoGPT's) while ids fit, uint32 above 65536."""
    return np.uint16 if vocab_size <= 2**16 else np.uint32


class TokenFile:
    """A flat file of token ids, read window by window with pread.

    Nothing of the file is mapped into the process: a np.memmap would be the obvious tool, but
    the kernel maps whole page-cache folios (2 MiB here) on each fault, so 40 random batches
    from a 2 GB file showed up as +1 GB of RSS per rank even with MADV_RANDOM. pread copies
    only the bytes asked for, needs no file position (safe in forked DataLoader workers),
    and pickles as its path. The file is opened on the first read, not before.
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

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():  # a forked parent's is not ours
            os.close(self._fd)
        self._fd = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None, "_pid": 0}


Tokens = np.ndarray | torch.Tensor | TokenFile


class TokenChunks(Dataset):
    """Non-overlapping (input, target) windows of seq_len tokens from one or more sequences.

    The ids stay as stored (uint16/uint32 in a TokenFile, or an in-memory array): only the
    windows a batch needs are read and widened to int64, so a 10 GB file costs a batch, not
    40 GB per rank. With `vocab_size`, every id read is checked against it.
    """

    def __init__(
        self,
        tokens: Tokens | Sequence[Tokens],
        seq_len: int,
        vocab_size: int | None = None,
        role: str = "training",
    ):
        many = isinstance(tokens, (list, tuple))
        parts = [
            t.numpy() if isinstance(t, torch.Tensor) else t for t in (tokens if many else [tokens])
        ]
        self.parts: list[np.ndarray | TokenFile] = parts
        self.tokens = parts if many else parts[0]
        self.seq_len, self.vocab_size, self.role = seq_len, vocab_size, role
        counts = [max(len(p) - 1, 0) // seq_len for p in parts]
        # first[k]: the first window of part k; first[-1]: the total. O(files), not O(tokens).
        self.first = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._open: OrderedDict[int, None] = OrderedDict()  # parts with a descriptor, LRU

    def __len__(self) -> int:
        return int(self.first[-1])

    def locate(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(part, window within the part) of each global window index."""
        part = np.searchsorted(self.first, idx, side="right") - 1
        return part, idx - self.first[part]

    def _read(self, part: int, start: int, count: int) -> np.ndarray:
        src = self.parts[part]
        if not isinstance(src, TokenFile):
            return src[start : start + count]
        self._open[part] = None
        self._open.move_to_end(part)
        if len(self._open) > MAX_OPEN:  # thousands of shards must not exhaust descriptors
            old, _ = self._open.popitem(last=False)
            self.parts[old].close()  # type: ignore[union-attr]
        return src.read(start, count)

    def windows(self, idx: Sequence[int]) -> np.ndarray:
        """The windows (seq_len + 1 tokens each) as one int64 array; ids not checked."""
        at = np.asarray(idx, dtype=np.int64)
        if at.size and (at.min() < 0 or at.max() >= len(self)):
            raise IndexError(f"window index out of range [0, {len(self)}): {idx}")
        out = np.empty((len(at), self.seq_len + 1), dtype=np.int64)
        part, local = self.locate(at)
        for row, (p, j) in enumerate(zip(part.tolist(), local.tolist(), strict=True)):
            out[row] = self._read(p, j * self.seq_len, self.seq_len + 1)
        return out

    def check(self, idx: Sequence[int], windows: np.ndarray | torch.Tensor) -> None:
        """ConfigError naming the file and offset of the first id >= vocab_size, if any."""
        if self.vocab_size is None or len(idx) == 0 or int(windows.max()) < self.vocab_size:
            return  # the common case: one max over the batch
        row, col = divmod(int(np.argmax(np.asarray(windows) >= self.vocab_size)), windows.shape[1])
        part, j = self.locate(np.asarray([idx[row]], dtype=np.int64))
        offset = int(j[0]) * self.seq_len + col
        src = self.parts[int(part[0])]
        where = src.path if isinstance(src, TokenFile) else f"part {int(part[0])}"
        raise ConfigError(
            f"{self.role} token file {where} holds id {int(windows[row, col])} at token "
            f"{offset} (byte {offset * src.dtype.itemsize}) >= --vocab-size "
            f"{self.vocab_size}; raise --vocab-size, or rewrite the file with ids below it"
        )

    def batch(self, idx: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole batch's windows into one int64 array: one conversion, no collation."""
        out = self.windows(idx)
        self.check(idx, out)
        chunk = torch.from_numpy(out)
        return chunk[:, :-1], chunk[:, 1:]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.batch([i])
        return x[0], y[0]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": OrderedDict()}  # a new process opens its own


class WindowBatches(Dataset):
    """A TokenChunks read a whole batch per DataLoader fetch (batch_size=None): workers read
    and widen the windows, the main process checks the ids (TokenChunks.check), so a bad id
    is the kit's one line there, not a worker's re-raised traceback."""

    def __init__(self, chunks: TokenChunks):
        self.chunks = chunks

    def __getitem__(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(idx), torch.from_numpy(self.chunks.windows(idx))


# --- finding and opening files -----------------------------------------------------------


def _is_held_out(path: Path) -> bool:
    """val.bin, fineweb_val_000000.bin, tokens-val-3.bin: 'val' as a whole name part."""
    return "val" in re.split(r"[._-]", path.stem.lower())


def find_token_files(data_dir: Path) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files) for --data-dir.

    A file: itself, with val.bin beside it. A directory with train.bin: nanoGPT's layout,
    train.bin and val.bin. Any other directory: its `*.bin` shards sorted by name, those
    with a `val` name part (FineWeb's fineweb_val_*.bin) held out, the rest for training.
    """
    if data_dir.is_dir() and not (data_dir / "train.bin").is_file():
        shards = sorted(p for p in data_dir.glob("*.bin") if p.is_file())
        return [p for p in shards if not _is_held_out(p)], [p for p in shards if _is_held_out(p)]
    train = data_dir / "train.bin" if data_dir.is_dir() else data_dir
    val = train.with_name("val.bin")
    return [train], [val] if val.is_file() and val != train else []


def open_token_file(path: Path, vocab_size: int, role: str) -> TokenFile:
    """A token file to read windows from, or ConfigError naming what is wrong with it: its
    size and id width are checked here (a stat), its ids as batches read them."""
    dtype = token_dtype(vocab_size)
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
            f"({np.dtype(dtype).name} ids for --vocab-size {vocab_size}): truncated, or "
            "written with another id width"
        )
    return TokenFile(path, dtype)


def open_corpus(paths: list[Path], seq_len: int, vocab_size: int, role: str) -> TokenChunks:
    """The files as one dataset of windows, or ConfigError when it holds no window. Among
    shards a short one is allowed (a split's last shard): it adds no window."""
    files = [open_token_file(p, vocab_size, role) for p in paths]
    chunks = TokenChunks(files if len(files) > 1 else files[0], seq_len, vocab_size, role)
    if len(chunks) > 0:
        return chunks
    if len(files) == 1:
        raise ConfigError(
            f"{role} token file {paths[0]} has {len(files[0])} tokens, fewer than one sequence "
            f"(--seq-len {seq_len} + 1); use a larger file or a smaller --seq-len"
        )
    raise ConfigError(
        f"{role} token files: none of the {len(files)} in {paths[0].parent} holds one sequence "
        f"(the longest has {max(map(len, files))} tokens, --seq-len {seq_len} + 1 needed); "
        "use larger shards or a smaller --seq-len"
    )


# --- the token datasets the registry names -------------------------------------------------


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

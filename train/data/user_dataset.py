"""A user's dataset factory: its (train, val[, info]) checked and named before training.

A user's samples must stack into batches: every x of one shape, every y of one shape. A
handful of items spread over each split is checked before training, so the usual mistakes
(a short last sample, a val split of another width, a string label) are one line up front,
not a collate traceback on some rank mid-epoch; the rest are checked as batches form
(loader.py, with the names kept here).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch
from ddpkit.train.data.bundle import DataBundle
from ddpkit.train.errors import ConfigError, UserError


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
    shapes = item_shapes(first, f"--dataset {path}: train[0]")
    for name, ds in (("train", train), ("val", val)):
        if ds is not None:
            _probe_items(ds, name, shapes, f"--dataset {path}")
    for ds in (train, val):
        _name_dataset(ds, f"--dataset {path}")
    x_shape = shapes[0]
    return DataBundle(train, val, x_shape, counts["num_classes"], counts["tokens_per_sample"])


_PROBES = 8
_DATASET_NAMES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _name_dataset(ds: object, name: str) -> None:
    with contextlib.suppress(TypeError):  # not weak-referenceable or not hashable: unnamed
        _DATASET_NAMES[ds] = name


def dataset_name(ds: object) -> str:
    try:
        return _DATASET_NAMES.get(ds, "the dataset")
    except TypeError:
        return "the dataset"


def item_shapes(item: object, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
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


def show_shapes(shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
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
        got = item_shapes(item, f"{name}: {split}[{i}]")
        if got != want:
            raise ConfigError(
                f"{name}: {split}[{i}] has {show_shapes(got)}, train[0] has {show_shapes(want)}; every "
                "sample must have the same shapes to stack into a batch (pad or crop them in "
                "the dataset)"
            )

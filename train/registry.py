"""One registry for models, datasets and losses: built-ins register the way user code does.

A config names each part with a string:

    model   = "mlp" | "mlp-deep" | "resnet18" | "gpt"        built-in
            | "pkg.module:factory"                            your model
            | "hf:PATH"                                       a Hugging Face causal LM (local dir)
    dataset = "synthetic" | "mnist" | "cifar10" | "imagefolder" | "tokens"
            | "pkg.module:build_dataset"                      your data
            | "hf:PATH"                                       local text/JSON lines/parquet files
    loss    = "cross_entropy" | "pkg.module:loss"

The contracts (docs/training.md "Your own model, data and loss" says the same):

- Model factory: `factory(cfg, **model_args) -> torch.nn.Module`. `cfg` is the resolved
  TrainConfig, `model_args` the `[train.model_args]` table (`--model-args '{"k": 1}'`). It is
  called once under `torch.device("meta")` before any process group starts (to check it and
  for `ddpkit memory`), then once per rank on the CPU after `torch.manual_seed(cfg.seed)`, so
  every rank starts from the same weights. It must not move the model to a device.
  Every rank builds the same parameter names, shapes and dtypes, and under DDP every
  parameter that requires grad takes part in forward (both checked, one line each).
  Blocks (one FSDP2 unit, activation-checkpoint and compile region each): `model.blocks()`
  if it exists, else the attribute `model.fsdp_blocks` (a list), else the children of the
  largest `nn.ModuleList` whose members all have one class (the repeated layers).
  FLOPs for MFU: optional `model.flops_per_token(seq_len) -> float` (training FLOPs, forward
  and backward, per token); without it MFU is not reported. Optional
  `model.data_kind = "tokens"` picks the synthetic token data instead of synthetic images.
- Dataset factory: `build_dataset(cfg, **dataset_args)` returns `(train, val)` or
  `(train, val, info)`: map-style datasets (`len()` and `ds[i]`) whose items are `(x, y)`
  pairs of tensors; `val` may be None; `info` a dict, optional key `tokens_per_sample`
  (> 0 for language-model data: throughput in tokens/s and MFU). Every rank calls it; it must
  return the same samples in the same order on every rank (the kit's sampler shards them).
- Loss: `loss(output, target) -> scalar tensor` (the mean over the micro-batch).

Anything wrong (no such module or attribute, not callable, a factory that raises or returns
something else) is a ConfigError naming the path and what was expected: one line, exit 2,
raised by `resolve.precheck()` before any process group starts.

This module holds the specs and the tables only. What fills them sits above it:
ddpkit.train.builtins (the built-in names, and how hf:PATH and pkg.module:attr resolve),
imported by the package itself, so the tables are full before any ddpkit.train module runs.
What reads them sits above it too: ddpkit.train.resolve (a config's names -> specs).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch import nn

DataKind = Literal["classes", "tokens", "any"]
HF_PREFIX = "hf:"
# What the specs hand on: the resolved TrainConfig (ddpkit.train.config) and the data's
# DataBundle (ddpkit.train.data). Both live above the registry, which does not import them.
Config = Any
Bundle = Any


@dataclass(frozen=True)
class ModelSpec:
    """How to build, wrap and measure one model (torchtitan's ModelSpec, smaller)."""

    name: str
    build: Callable[[Config, Bundle], nn.Module]  # on the CPU or under a meta device
    data_kind: DataKind = "classes"  # which built-in data fits: image classes or tokens
    loss: str = "cross_entropy"  # the default loss when cfg.loss is unset
    # Training FLOPs per token for MFU, or None when the model does not say.
    flops_per_token: Callable[[Config, nn.Module], float | None] | None = None
    # Config rules of this model (torch-free; raises ConfigError), run by config validation.
    check: Callable[[Config], None] | None = None


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    # (cfg, rank0_download, the model's data kind) -> DataBundle
    build: Callable[[Config, bool, DataKind], Bundle]
    data_kind: DataKind = "classes"
    # What its samples look like without building it (the builder uses the same values, the
    # memory planner reads them): x's shape, and the classes (None: from the config or data).
    in_shape: tuple[int, ...] | None = None
    classes: int | None = None


@dataclass(frozen=True)
class Source:
    """How a name outside the tables becomes a spec: one per kind of name, "hf" (hf:PATH)
    and "import" (pkg.module:attr). Each resolver may import what it names."""

    model: Callable[[Config], ModelSpec]  # for cfg.model
    dataset: Callable[[Config], DatasetSpec]  # for cfg.dataset
    loss: Callable[[str], Callable[..., Any]] | None = None  # for cfg.loss, where it may name one


MODELS: dict[str, ModelSpec] = {}
DATASETS: dict[str, DatasetSpec] = {}
LOSSES: dict[str, Callable[..., Any]] = {}
SOURCES: dict[Literal["hf", "import"], Source] = {}
# Callables handed to train.fit() directly, under their module:qualname (never imported).
OBJECTS: dict[str, Callable[..., Any]] = {}


def register_model(spec: ModelSpec) -> ModelSpec:
    MODELS[spec.name] = spec
    return spec


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    DATASETS[spec.name] = spec
    return spec


def register_loss(name: str, fn: Callable[..., Any]) -> None:
    LOSSES[name] = fn


def register_source(kind: Literal["hf", "import"], source: Source) -> None:
    SOURCES[kind] = source


def name_callable(fn: Callable[..., Any]) -> str:
    """Register a callable given to fit() and return the name the config records for it."""
    name = f"{getattr(fn, '__module__', None) or 'fit'}:{getattr(fn, '__qualname__', 'fn')}"
    name = re.sub(r"[^\w.:]", "_", name)  # <lambda>, <locals>: still a valid-looking path
    OBJECTS[name] = fn
    return name

"""One registry for models, datasets and losses: built-ins register the way user code does.

A config names each part with a string:

    model   = "mlp" | "mlp-deep" | "resnet18" | "gpt"        built-in
            | "pkg.module:factory"                            your model
            | "hf:PATH"                                       a Hugging Face causal LM (local dir)
    dataset = "synthetic" | "mnist" | "cifar10" | "imagefolder" | "tokens"
            | "pkg.module:build_dataset"                      your data
            | "hf:PATH"                                       local text/JSON lines/parquet files
    loss    = "cross_entropy" | "pkg.module:loss"

The contracts (README "Your own model" says the same):

- Model factory: `factory(cfg, **model_args) -> torch.nn.Module`. `cfg` is the resolved
  TrainConfig, `model_args` the `[train.model_args]` table (`--model-args '{"k": 1}'`). It is
  called once under `torch.device("meta")` before any process group starts (to check it and
  for `ddpkit.tools.memory`), then once per rank on the CPU after `torch.manual_seed(cfg.seed)`, so
  every rank starts from the same weights. It must not move the model to a device.
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
raised by `precheck()` before any process group starts.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ddpkit.train.errors import UserError

if TYPE_CHECKING:
    from ddpkit.train.config import TrainConfig
    from ddpkit.train.data import DataBundle
    from torch import nn

DataKind = Literal["classes", "tokens", "any"]
IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
HF_PREFIX = "hf:"


def RegistryError(msg: str) -> UserError:  # noqa: N802  (reads like the class it returns)
    """A ConfigError (one line, exit 2); imported late because ddpkit.train.config imports us."""
    from ddpkit.train.config import ConfigError

    return ConfigError(msg)


@dataclass(frozen=True)
class ModelSpec:
    """How to build, wrap and measure one model (torchtitan's ModelSpec, smaller)."""

    name: str
    build: Callable[[TrainConfig, DataBundle], nn.Module]  # on the CPU or under a meta device
    data_kind: DataKind = "classes"  # which built-in data fits: image classes or tokens
    loss: str = "cross_entropy"  # the default loss when cfg.loss is unset
    # Training FLOPs per token for MFU, or None when the model does not say.
    flops_per_token: Callable[[TrainConfig, nn.Module], float | None] | None = None
    # Config rules of this model (torch-free; raises ConfigError), run by config validation.
    check: Callable[[TrainConfig], None] | None = None


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    # (cfg, rank0_download, the model's data kind) -> DataBundle
    build: Callable[[TrainConfig, bool, DataKind], DataBundle]
    data_kind: DataKind = "classes"


MODELS: dict[str, ModelSpec] = {}
DATASETS: dict[str, DatasetSpec] = {}
LOSSES: dict[str, Callable[..., Any]] = {}


def register_model(spec: ModelSpec) -> ModelSpec:
    MODELS[spec.name] = spec
    return spec


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    DATASETS[spec.name] = spec
    return spec


def register_loss(name: str, fn: Callable[..., Any]) -> None:
    LOSSES[name] = fn


# --- names (torch-free: config validation and the launcher use these) ----------------------


def _kind_of(value: str, table: dict[str, Any]) -> str:
    if value in table:
        return "builtin"
    if value.startswith(HF_PREFIX):
        return "hf"
    if IMPORT_PATH.match(value):
        return "import"
    return "bad"


def check_names(cfg: TrainConfig, local_paths: bool = True) -> None:
    """Syntax of cfg.model / dataset / loss, without importing anything; with local_paths,
    also that an hf:PATH exists on this machine."""
    _builtins()
    for flag, value, table, what in (
        ("--model", cfg.model, MODELS, "pkg.module:factory or hf:PATH"),
        ("--dataset", cfg.dataset, DATASETS, "pkg.module:build_dataset or hf:PATH"),
        ("--loss", cfg.loss, LOSSES, "pkg.module:loss"),
    ):
        if value is None:  # the model's default loss
            continue
        kind = _kind_of(value, table)
        if kind == "bad" or (kind == "hf" and flag == "--loss"):
            raise RegistryError(
                f"{flag} {value}: not a built-in ({', '.join(table)}) nor an import path "
                f"{what}; pick a built-in name or write module:attribute"
            )
        if kind == "hf" and local_paths and not Path(value[len(HF_PREFIX) :]).exists():
            raise RegistryError(
                f"{flag} {value}: {value[len(HF_PREFIX) :]} does not exist; point hf: at a "
                "local directory (or file) on this machine"
            )


def check_model(cfg: TrainConfig) -> None:
    """A built-in model's own config rules (e.g. gpt: heads divide the width)."""
    _builtins()
    spec = MODELS.get(cfg.model)
    if spec is not None and spec.check is not None:
        spec.check(cfg)


def model_kind(cfg: TrainConfig) -> DataKind | None:
    """The built-in model's data kind, None for one that must be imported to know."""
    _builtins()
    spec = MODELS.get(cfg.model)
    return spec.data_kind if spec else ("tokens" if cfg.model.startswith(HF_PREFIX) else None)


def dataset_kind(cfg: TrainConfig) -> DataKind:
    _builtins()
    spec = DATASETS.get(cfg.dataset)
    return spec.data_kind if spec else ("tokens" if cfg.dataset.startswith(HF_PREFIX) else "any")


# --- import paths ------------------------------------------------------------------------------


# Callables handed to train.fit() directly, under their module:qualname (never imported).
OBJECTS: dict[str, Callable[..., Any]] = {}


def name_callable(fn: Callable[..., Any]) -> str:
    """Register a callable given to fit() and return the name the config records for it."""
    name = f"{getattr(fn, '__module__', None) or 'fit'}:{getattr(fn, '__qualname__', 'fn')}"
    name = re.sub(r"[^\w.:]", "_", name)  # <lambda>, <locals>: still a valid-looking path
    OBJECTS[name] = fn
    return name


def load_object(path: str, flag: str, expected: str) -> Any:
    """The attribute at `pkg.module:attr`, or a RegistryError saying what went wrong."""
    if path in OBJECTS:
        return OBJECTS[path]
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # the user's module may raise anything at import
        raise RegistryError(
            f"{flag} {path}: cannot import {module_name} ({type(e).__name__}: {e}); put its "
            "package on PYTHONPATH or run from the directory that holds it"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RegistryError(
                f"{flag} {path}: module {module_name} has no attribute {attr}; expected {expected}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise RegistryError(
            f"{flag} {path}: {attr} is a {type(obj).__name__}, not callable; expected {expected}"
        )
    return obj


MODEL_CONTRACT = "a factory (cfg, **model_args) -> torch.nn.Module"
DATASET_CONTRACT = "a function (cfg, **dataset_args) -> (train, val) or (train, val, info)"
LOSS_CONTRACT = "a function (output, target) -> scalar tensor"


def call_factory(fn: Callable[..., Any], cfg: TrainConfig, args: dict, flag: str, path: str):
    try:
        return fn(cfg, **args)
    except UserError:
        raise
    except Exception as e:
        shown = f" with {flag}-args {args}" if args else ""
        raise RegistryError(
            f"{flag} {path}: calling it{shown} raised {type(e).__name__}: {e}; "
            f"expected {MODEL_CONTRACT if flag == '--model' else DATASET_CONTRACT}"
        ) from None


def _user_model(path: str, data_kind: DataKind) -> ModelSpec:
    factory = load_object(path, "--model", MODEL_CONTRACT)

    def build(cfg: TrainConfig, data: Any) -> nn.Module:
        from torch import nn

        model = call_factory(factory, cfg, cfg.model_args, "--model", path)
        if not isinstance(model, nn.Module):
            raise RegistryError(
                f"--model {path} returned a {type(model).__name__}; expected {MODEL_CONTRACT}"
            )
        return model

    def flops(cfg: TrainConfig, model: nn.Module) -> float | None:
        fn = getattr(model, "flops_per_token", None)
        return float(fn(cfg.seq_len)) if callable(fn) else None

    return ModelSpec(path, build, data_kind, "cross_entropy", flops)


def model_spec(cfg: TrainConfig) -> ModelSpec:
    """The spec for cfg.model; an import path is imported and built once on the meta device
    (its data kind comes from the model)."""
    _builtins()
    if cfg.model in MODELS:
        return MODELS[cfg.model]
    if cfg.model.startswith(HF_PREFIX):
        from ddpkit.train import hf

        return hf.model_spec(cfg.model[len(HF_PREFIX) :])
    check_names(cfg)
    spec = _user_model(cfg.model, "classes")
    kind = getattr(meta_model(spec, cfg), "data_kind", "classes")
    if kind not in ("classes", "tokens"):
        raise RegistryError(
            f"--model {cfg.model}: data_kind = {kind!r}; expected 'classes' or 'tokens'"
        )
    return _user_model(cfg.model, kind)


def meta_model(spec: ModelSpec, cfg: TrainConfig, data: Any = None) -> nn.Module:
    """Build on the meta device: no memory, no init cost; the parameter shapes are real."""
    import torch

    with torch.device("meta"):
        return spec.build(cfg, data)


def dataset_spec(cfg: TrainConfig) -> DatasetSpec:
    _builtins()
    if cfg.dataset in DATASETS:
        return DATASETS[cfg.dataset]
    if cfg.dataset.startswith(HF_PREFIX):
        from ddpkit.train import hf

        return hf.dataset_spec(cfg.dataset[len(HF_PREFIX) :])
    fn = load_object(cfg.dataset, "--dataset", DATASET_CONTRACT)
    path = cfg.dataset

    def build(cfg: TrainConfig, rank0_download: bool, kind: DataKind) -> DataBundle:
        from ddpkit.train.data import bundle_from_user

        out = call_factory(fn, cfg, cfg.dataset_args, "--dataset", path)
        return bundle_from_user(out, path, DATASET_CONTRACT)

    return DatasetSpec(path, build, "any")


def loss_fn(cfg: TrainConfig, spec: ModelSpec | None = None) -> Callable[..., Any]:
    _builtins()
    name = cfg.loss or (spec or model_spec(cfg)).loss
    if name in LOSSES:
        return LOSSES[name]
    return load_object(name, "--loss", LOSS_CONTRACT)


def precheck(cfg: TrainConfig) -> ModelSpec:
    """Everything that imports user code, before any process group: bad paths exit 2 here."""
    spec = model_spec(cfg)
    if cfg.model.startswith(HF_PREFIX):  # its config.json and sizes, on the meta device
        meta_model(spec, cfg)
    dataset_spec(cfg)
    loss_fn(cfg, spec)
    dkind, mkind = dataset_kind(cfg), spec.data_kind
    if dkind != "any" and dkind != mkind:
        raise RegistryError(
            f"--dataset {cfg.dataset} holds {dkind} data but --model {cfg.model} trains on "
            f"{mkind}; pick a dataset of {mkind} (or synthetic)"
        )
    return spec


# --- blocks ------------------------------------------------------------------------------------


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """What FSDP2 / activation checkpointing / compile wrap one by one (see the contract)."""
    from torch import nn

    if callable(getattr(model, "blocks", None)):
        return list(model.blocks())
    if getattr(model, "fsdp_blocks", None) is not None:
        return list(model.fsdp_blocks)
    best: list[nn.Module] = []
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) > len(best):
            kinds = {_inner(c).__class__ for c in m}
            if len(kinds) == 1:
                best = list(m)
    return best


def _inner(m: Any) -> Any:
    # An activation-checkpoint wrapper keeps the layer it wraps as `_checkpoint_wrapped_module`.
    return getattr(m, "_checkpoint_wrapped_module", m)


# --- the built-ins -----------------------------------------------------------------------------


def _builtins() -> None:
    if MODELS:
        return
    from ddpkit.train import builtins  # noqa: F401  (registers on import; torch-free)

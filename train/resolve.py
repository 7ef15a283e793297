"""What a config's model, dataset and loss names stand for, read from the registry's tables.

A name is a built-in (a key of a table), `hf:PATH` or `pkg.module:attr`; the last two go to
the registry's source of that kind (ddpkit.train.builtins and ddpkit.train.user register
them). Torch-free to import: config validation checks the names here without importing
anything, and the launcher runs that validation too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ddpkit.train.errors import ConfigError
from ddpkit.train.registry import (
    DATASETS,
    HF_PREFIX,
    LOSSES,
    MODELS,
    SOURCES,
    Config,
    DataKind,
    DatasetSpec,
    ModelSpec,
)

if TYPE_CHECKING:
    from torch import nn

IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _kind_of(value: str, table: dict[str, Any]) -> Literal["builtin", "hf", "import", "bad"]:
    if value in table:
        return "builtin"
    if value.startswith(HF_PREFIX):
        return "hf"
    if IMPORT_PATH.match(value):
        return "import"
    return "bad"


def _source(value: str) -> Literal["hf", "import"]:
    return "hf" if value.startswith(HF_PREFIX) else "import"


# --- names (torch-free: config validation and the launcher use these) ----------------------


def check_names(cfg: Config, local_paths: bool = True) -> None:
    """Syntax of cfg.model / dataset / loss, without importing anything; with local_paths,
    also that an hf:PATH exists on this machine."""
    for flag, value, table, what in (
        ("--model", cfg.model, MODELS, "pkg.module:factory or hf:PATH"),
        ("--dataset", cfg.dataset, DATASETS, "pkg.module:build_dataset or hf:PATH"),
        ("--loss", cfg.loss, LOSSES, "pkg.module:loss"),
    ):
        if value is None:  # the model's default loss
            continue
        kind = _kind_of(value, table)
        if kind == "bad" or (kind == "hf" and flag == "--loss"):
            raise ConfigError(
                f"{flag} {value}: not a built-in ({', '.join(table)}) nor an import path "
                f"{what}; pick a built-in name or write module:attribute"
            )
        if kind == "hf" and local_paths and not Path(value[len(HF_PREFIX) :]).exists():
            raise ConfigError(
                f"{flag} {value}: {value[len(HF_PREFIX) :]} does not exist; point hf: at a "
                "local directory (or file) on this machine"
            )


def check_model(cfg: Config) -> None:
    """A built-in model's own config rules (e.g. gpt: heads divide the width)."""
    spec = MODELS.get(cfg.model)
    if spec is not None and spec.check is not None:
        spec.check(cfg)


def model_kind(cfg: Config) -> DataKind | None:
    """The built-in model's data kind, None for one that must be imported to know."""
    spec = MODELS.get(cfg.model)
    return spec.data_kind if spec else ("tokens" if cfg.model.startswith(HF_PREFIX) else None)


def dataset_kind(cfg: Config) -> DataKind:
    spec = DATASETS.get(cfg.dataset)
    return spec.data_kind if spec else ("tokens" if cfg.dataset.startswith(HF_PREFIX) else "any")


# --- specs (these may import the user's code, hf and torch) -----------------------------------


def model_spec(cfg: Config) -> ModelSpec:
    """The spec for cfg.model; an import path is imported and built once on the meta device
    (its data kind comes from the model)."""
    if cfg.model in MODELS:
        return MODELS[cfg.model]
    if not cfg.model.startswith(HF_PREFIX):
        check_names(cfg)  # neither a built-in nor hf:PATH: an import path, or one line why not
    return SOURCES[_source(cfg.model)].model(cfg)


def meta_model(spec: ModelSpec, cfg: Config, data: Any = None) -> nn.Module:
    """Build on the meta device: no memory, no init cost; the parameter shapes are real."""
    import torch

    with torch.device("meta"):
        return spec.build(cfg, data)


def dataset_spec(cfg: Config) -> DatasetSpec:
    if cfg.dataset in DATASETS:
        return DATASETS[cfg.dataset]
    return SOURCES[_source(cfg.dataset)].dataset(cfg)


def loss_fn(cfg: Config, spec: ModelSpec | None = None) -> Callable[..., Any]:
    name = cfg.loss or (spec or model_spec(cfg)).loss
    if name in LOSSES:
        return LOSSES[name]
    load = SOURCES["import"].loss
    assert load is not None  # ddpkit.train.user registers it
    return load(name)


def precheck(cfg: Config) -> ModelSpec:
    """Everything that imports user code, before any process group: bad paths exit 2 here."""
    spec = model_spec(cfg)
    if cfg.model.startswith(HF_PREFIX):  # its config.json and sizes, on the meta device
        meta_model(spec, cfg)
    dataset_spec(cfg)
    loss_fn(cfg, spec)
    dkind, mkind = dataset_kind(cfg), spec.data_kind
    if dkind != "any" and dkind != mkind:
        raise ConfigError(
            f"--dataset {cfg.dataset} holds {dkind} data but --model {cfg.model} trains on "
            f"{mkind}; pick a dataset of {mkind} (or synthetic)"
        )
    return spec


# --- blocks ------------------------------------------------------------------------------------


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """What FSDP2 / activation checkpointing / compile wrap one by one (the contract in
    ddpkit.train.registry)."""
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

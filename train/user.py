"""Your own model, dataset and loss: `pkg.module:attr` (or a callable handed to fit()),
registered as the registry's "import" source. The contracts are in ddpkit.train.registry;
anything that breaks one is a ConfigError naming the path and what was expected.

Torch-free to import; the user's module is imported when a spec is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ddpkit.train.errors import ConfigError, UserError
from ddpkit.train.lookup import meta_model
from ddpkit.train.registry import OBJECTS, DataKind, DatasetSpec, ModelSpec, Source, register_source

if TYPE_CHECKING:
    from ddpkit.train.config import TrainConfig
    from ddpkit.train.data import DataBundle
    from torch import nn

MODEL_CONTRACT = "a factory (cfg, **model_args) -> torch.nn.Module"
DATASET_CONTRACT = "a function (cfg, **dataset_args) -> (train, val) or (train, val, info)"
LOSS_CONTRACT = "a function (output, target) -> scalar tensor"


def load_object(path: str, flag: str, expected: str) -> Any:
    """The attribute at `pkg.module:attr`, or a ConfigError saying what went wrong."""
    if path in OBJECTS:
        return OBJECTS[path]
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # the user's module may raise anything at import
        raise ConfigError(
            f"{flag} {path}: cannot import {module_name} ({type(e).__name__}: {e}); put its "
            "package on PYTHONPATH or run from the directory that holds it"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                f"{flag} {path}: module {module_name} has no attribute {attr}; expected {expected}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(
            f"{flag} {path}: {attr} is a {type(obj).__name__}, not callable; expected {expected}"
        )
    return obj


def call_factory(fn: Callable[..., Any], cfg: TrainConfig, args: dict, flag: str, path: str):
    try:
        return fn(cfg, **args)
    except UserError:
        raise
    except Exception as e:
        shown = f" with {flag}-args {args}" if args else ""
        raise ConfigError(
            f"{flag} {path}: calling it{shown} raised {type(e).__name__}: {e}; "
            f"expected {MODEL_CONTRACT if flag == '--model' else DATASET_CONTRACT}"
        ) from None


def _model(path: str, data_kind: DataKind) -> ModelSpec:
    factory = load_object(path, "--model", MODEL_CONTRACT)

    def build(cfg: TrainConfig, data: Any) -> nn.Module:
        from torch import nn

        model = call_factory(factory, cfg, cfg.model_args, "--model", path)
        if not isinstance(model, nn.Module):
            raise ConfigError(
                f"--model {path} returned a {type(model).__name__}; expected {MODEL_CONTRACT}"
            )
        if not any(p.requires_grad for p in model.parameters()):
            raise ConfigError(
                f"--model {path} returned a {type(model).__name__} without a parameter that "
                "requires grad (nothing to train); give it at least one trainable parameter"
            )
        return model

    def flops(cfg: TrainConfig, model: nn.Module) -> float | None:
        fn = getattr(model, "flops_per_token", None)
        return float(fn(cfg.seq_len)) if callable(fn) else None

    return ModelSpec(path, build, data_kind, "cross_entropy", flops)


def model_spec(cfg: TrainConfig) -> ModelSpec:
    """cfg.model imported and built once on the meta device: its data kind comes from it."""
    kind = getattr(meta_model(_model(cfg.model, "classes"), cfg), "data_kind", "classes")
    if kind not in ("classes", "tokens"):
        raise ConfigError(
            f"--model {cfg.model}: data_kind = {kind!r}; expected 'classes' or 'tokens'"
        )
    return _model(cfg.model, kind)


def dataset_spec(cfg: TrainConfig) -> DatasetSpec:
    fn = load_object(cfg.dataset, "--dataset", DATASET_CONTRACT)
    path = cfg.dataset

    def build(cfg: TrainConfig, rank0_download: bool, kind: DataKind) -> DataBundle:
        from ddpkit.train.data import bundle_from_user

        out = call_factory(fn, cfg, cfg.dataset_args, "--dataset", path)
        return bundle_from_user(out, path, DATASET_CONTRACT)

    return DatasetSpec(path, build, "any")


def loss(name: str) -> Callable[..., Any]:
    """The user's loss, its first result checked: a 0-dim floating tensor (metadata only, no
    device sync); anything else is one line naming the loss, not a traceback from backward."""
    fn = load_object(name, "--loss", LOSS_CONTRACT)
    checked = False

    def checked_loss(output: Any, target: Any) -> Any:
        nonlocal checked
        value = fn(output, target)
        if not checked:
            import torch

            if not isinstance(value, torch.Tensor):
                got = f"a {type(value).__name__}"
            elif value.dim() != 0 or not value.is_floating_point():
                got = f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
            else:
                got = None
            if got:
                raise ConfigError(f"--loss {name} returned {got}; expected {LOSS_CONTRACT}")
            checked = True
        return value

    return checked_loss


register_source("import", Source(model_spec, dataset_spec, loss))

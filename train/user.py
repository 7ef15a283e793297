"""Your own model, dataset and loss: `pkg.module:attr` (or a callable handed to fit()),
registered as the registry's "import" source. The contracts are in ddpkit.train.registry;
anything that breaks one is a ConfigError naming the path and what was expected.

Torch-free to import; the user's module is imported when a spec is asked for."""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ddpkit.train.errors import ConfigError, UserError
from ddpkit.train.registry import OBJECTS, DataKind, DatasetSpec, ModelSpec, Source, register_source
from ddpkit.train.resolve import meta_model

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


@contextlib.contextmanager
def until_checked() -> Iterator[None]:
    """Hold the warnings a user's hook raises until its result is checked: shown as usual
    when it passes, dropped when the hook breaks its contract (a UserError), whose one line
    says what is wrong; torch's warning of the same mistake (float() of a tensor that
    requires grad), once per rank, would bury it."""
    broken = False
    try:
        with warnings.catch_warnings(record=True) as held:
            try:
                yield
            except UserError:
                broken = True
                raise
    finally:
        for w in [] if broken else held:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)


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

        with until_checked():
            model = call_factory(factory, cfg, cfg.model_args, "--model", path)
            if not isinstance(model, nn.Module):
                raise ConfigError(
                    f"--model {path} returned a {type(model).__name__}; expected {MODEL_CONTRACT}"
                )
            if not any(p.requires_grad for p in model.parameters()):
                raise ConfigError(
                    f"--model {path} returned a {type(model).__name__} without a parameter "
                    "that requires grad (nothing to train); give it at least one trainable "
                    "parameter"
                )
        check_same_on_every_rank(model, path)
        if cfg.parallel == "ddp":
            check_all_used_on_first_forward(model, path)
        return model

    def flops(cfg: TrainConfig, model: nn.Module) -> float | None:
        fn = getattr(model, "flops_per_token", None)
        return float(fn(cfg.seq_len)) if callable(fn) else None

    return ModelSpec(path, build, data_kind, "cross_entropy", flops)


def _signature(model: nn.Module) -> list[tuple[str, str, list[int], str]]:
    """(kind, name, shape, dtype) of every parameter and buffer: what a replica is made of."""
    out = [("parameter", n, list(p.shape), str(p.dtype)) for n, p in model.named_parameters()]
    out += [("buffer", n, list(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    return [(k, n, shape, d.removeprefix("torch.")) for k, n, shape, d in out]


def _first_difference(mine: list, theirs: list, rank: int) -> str:
    """The first parameter or buffer in which rank `rank`'s model differs from rank 0's."""
    a = {(k, n): (shape, d) for k, n, shape, d in mine}
    b = {(k, n): (shape, d) for k, n, shape, d in theirs}
    for key in [*a, *b]:
        kind, name = key
        if key not in b:
            return f"{kind} {name} {a[key][0]} on rank 0 is missing on rank {rank}"
        if key not in a:
            return f"rank {rank} has a {kind} {name} {b[key][0]} that rank 0 lacks"
        if a[key] != b[key]:
            (s0, d0), (s1, d1) = a[key], b[key]
            return f"{kind} {name} is {s0} {d0} on rank 0, {s1} {d1} on rank {rank}"
    return "the same names and shapes in another order"


def check_same_on_every_rank(model: nn.Module, path: str) -> None:
    """Every rank must build the same model: DDP would refuse it in a 30-line traceback per
    rank, FSDP2's start-up broadcast would abort in gloo or hang. One all_gather of a digest
    of the parameter and buffer shapes at build time; the full lists only when they differ.
    Skipped without a process group, in one process, and on the meta device (the precheck and
    the memory planner's fake world, where not every rank builds)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    if dist.get_backend() == "fake" or any(p.is_meta for p in model.parameters()):
        return
    import hashlib
    import json

    sig = _signature(model)
    digest = hashlib.sha256(json.dumps(sig).encode()).hexdigest()
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    if len(set(digests)) == 1:
        return
    sigs: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(sigs, sig)  # only on the way to an error: names what differs
    rank = next(r for r, d in enumerate(digests) if d != digests[0])
    others = [r for r, d in enumerate(digests) if d != digests[0]]
    raise ConfigError(
        f"--model {path} built another model on rank{'s' if len(others) > 1 else ''} "
        f"{', '.join(map(str, others))} than on rank 0: {_first_difference(sigs[0], sigs[rank], rank)}; "
        f"expected {MODEL_CONTRACT} that builds the same parameter names, shapes and dtypes "
        "on every rank (from cfg and its model_args, not from the rank)"
    )


def _reached(outputs: Any) -> tuple[bool, set[int]]:
    """(whether any output tensor carries a graph, the ids of the leaf tensors its autograd
    graph reaches): what DDP's find_unused_parameters walks, once."""
    import torch
    from torch.utils._pytree import tree_leaves

    tensors = [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    reached = {id(t) for t in tensors if t.grad_fn is None}
    stack, seen = [t.grad_fn for t in tensors if t.grad_fn is not None], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        leaf = getattr(fn, "variable", None)  # an AccumulateGrad node: a leaf's gradient sink
        if leaf is not None:
            reached.add(id(leaf))
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return bool(tensors), reached


def check_all_used_on_first_forward(model: nn.Module, path: str) -> None:
    """DDP (without find_unused_parameters) needs a gradient for every parameter that requires
    one, every step; a parameter that forward never uses fails the second step with DDP's
    40-line error. The first training forward's graph says which parameters it reached: any
    other is one line naming them. An output the walk cannot see into (a custom class that is
    no pytree) is left to DDP."""
    handle: Any = None

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        import torch

        if not torch.is_grad_enabled():
            return  # an eval forward: nothing to learn from it
        handle.remove()
        has_graph, reached = _reached(output)
        if not has_graph:
            return
        unused = [
            n for n, p in module.named_parameters() if p.requires_grad and id(p) not in reached
        ]
        if unused:
            shown = ", ".join(unused[:4]) + (
                f" and {len(unused) - 4} more" if len(unused) > 4 else ""
            )
            raise ConfigError(
                f"--model {path}: {len(unused)} parameter{'s' if len(unused) > 1 else ''} "
                f"({shown}) took no part in the first forward; under --parallel ddp every "
                "parameter that requires grad must get a gradient every step: use it in forward, "
                "freeze it (requires_grad_(False)) or drop it, or train with --parallel fsdp"
            )

    handle = model.register_forward_hook(hook)


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

        with until_checked():
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
        if checked:
            return fn(output, target)
        import torch

        with until_checked():
            value = fn(output, target)
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

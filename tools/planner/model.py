"""The model side of the memory planner: a train/ model built on the meta device, and the
planner's error type (PlanError: bad input, one line, exit 2), which ddpkit.tools.planner.cli
raises too.

Nothing is allocated: parameter shapes give the exact FSDP2 shard sizes, the model's
`blocks()` give the FSDP units (the largest one bounds the in-flight all-gathers), and one
forward pass on meta tensors, with a saved-tensors hook, measures what autograd keeps for
backward: the activation estimate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any

from ddpkit.train.errors import UserError


class PlanError(UserError):
    """Bad input: the message names the problem and the fix."""


# Optimizer state per parameter in fp32 bytes: Adam/AdamW keep exp_avg and exp_avg_sq; SGD
# with momentum keeps one buffer (ddpkit's sgd uses momentum 0.9).
OPTIM_BYTES = {"adamw": 8, "adam": 8, "sgd": 4}


def shard_rows(dim0: int, shard_size: int, index: int) -> int:
    """Rows of a dim-0 shard that FSDP2 gives shard `index` (torch.chunk: ceil-sized chunks)."""
    chunk = -(-dim0 // shard_size)
    return max(0, min(chunk, dim0 - index * chunk))


# The integer model settings the planner takes as flags (as python -m ddpkit.train names them).
MODEL_FLAGS = (
    "batch_size",
    "seq_len",
    "vocab_size",
    "n_layer",
    "n_head",
    "d_model",
    "grad_accum",
    "synthetic_samples",
)

IMAGEFOLDER_CLASSES = 10  # an image folder's classes are its subdirectories: 10 assumed

# --input-shape of this plan (one per process: the planner is a command), else the dataset's.
_input_shape: tuple[int, ...] | None = None


def parse_shape(text: str) -> tuple[int, ...]:
    """--input-shape: one sample's shape, `3,224,224` or `3x224x224`."""
    try:
        shape = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise PlanError(f"--input-shape {text!r}: give one sample's shape, e.g. 3,224,224")
    return shape


def cannot_run(cfg: Any, e: BaseException) -> PlanError:
    """A model the planner cannot build or run forward on meta tensors: one line."""
    if isinstance(e, UserError):
        return PlanError(str(e))
    first = (str(e).strip().splitlines() or [""])[0][:300]
    shape = "x".join(str(d) for d in in_shape(cfg)[0])
    return PlanError(
        f"--model {cfg.model}: the planner cannot build or run it on input {shape} per "
        f"sample ({type(e).__name__}: {first}); pass the model's input with --input-shape "
        "C,H,W (or --dataset NAME), or plan by size with --params N"
    )


def _image_datasets() -> dict[str, tuple[tuple[int, ...], int | None]]:
    """(x shape, classes) of each built-in image dataset, from the registry (the shapes the
    builders produce); classes None: cfg.synthetic_classes."""
    from ddpkit.train import registry

    out = {}
    for name, spec in registry.DATASETS.items():
        if spec.in_shape is not None:
            classes = spec.classes or (IMAGEFOLDER_CLASSES if name == "imagefolder" else None)
            out[name] = (spec.in_shape, classes)
    return out


@dataclass
class RankState:
    """State that stays allocated between steps on one rank: parameters, gradients and
    optimizer state, in bytes (the formula's plan and the dry run's measurement alike)."""

    params: int
    grads: int
    optim: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optim

    def as_dict(self) -> dict[str, int]:
        return {
            "params": self.params,
            "grads": self.grads,
            "optim": self.optim,
            "total": self.total,
        }


@dataclass
class ModelDesc:
    name: str
    shapes: list[tuple[int, ...]]
    unit_params: int  # the largest FSDP unit: one block, or what the root keeps
    root_params: int  # parameters no block owns (embeddings, head): the root unit
    batch_size: int
    dtype: str
    optimizer: str
    cfg: Any = None
    _act: dict[str, int] = field(default_factory=dict)

    @property
    def num_params(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def activation_bytes(self, dtype: str) -> int:
        """Bytes autograd saves for backward in one forward at --batch-size (an estimate:
        backward's temporaries and allocator slack come on top)."""
        if dtype not in self._act:
            self._act[dtype] = saved_activation_bytes(self.cfg, self.batch_size, dtype)
        return self._act[dtype]


def load_cfg(args: argparse.Namespace) -> Any:
    from ddpkit.train.config import ConfigError, TrainConfig, load_toml

    values: dict[str, Any] = {}
    try:
        if args.config:
            values.update(load_toml(args.config))
    except ConfigError as e:
        raise PlanError(str(e)) from None
    global _input_shape
    _input_shape = parse_shape(args.input_shape) if getattr(args, "input_shape", None) else None
    if args.model:
        if args.model != values.get("model"):  # another model: the file's keywords are not its
            values.pop("model_args", None)
        values["model"] = args.model
    if getattr(args, "model_args", None) is not None:
        values["model_args"] = args.model_args
    for key in (*MODEL_FLAGS, "dataset"):
        if getattr(args, key, None) is not None:
            values[key] = getattr(args, key)
    values.pop("extra", None)
    try:
        cfg = TrainConfig(**values)
    except TypeError as e:
        raise PlanError(f"bad model settings: {e}") from None
    from ddpkit.train import resolve

    adapt_factory(cfg)
    try:
        resolve.check_model(cfg)  # the model's own rules (gpt: heads divide the width)
    except UserError as e:
        raise PlanError(str(e)) from None
    for key in ("batch_size", "seq_len", "vocab_size", "n_layer", "n_head", "d_model"):
        if getattr(cfg, key) < 1:
            raise PlanError(f"--{key.replace('_', '-')} must be >= 1, got {getattr(cfg, key)}")
    images = _image_datasets()
    if _input_shape is None and _kind(cfg) != "tokens" and cfg.dataset not in images:
        raise PlanError(
            f"--dataset {cfg.dataset} does not fit --model {cfg.model} (the planner knows the "
            f"input shape of {', '.join(images)}); pass --input-shape C,H,W or one of those"
        )
    return cfg


def adapt_factory(cfg: Any) -> None:
    """Call a user's factory the way its signature asks. The trainer's contract is
    `factory(cfg, **model_args)`; a factory the user's own script calls (`build(hidden=64)`)
    often takes its keywords alone. It gets the TrainConfig first when its first parameter is
    required (and not one of --model-args) or is named cfg/config, else only --model-args.
    The adapted factory is registered under its path for this plan (the registry's OBJECTS,
    which the import source looks up before importing; cli._main restores it)."""
    import inspect

    from ddpkit.train import registry, resolve
    from ddpkit.train.user import MODEL_CONTRACT, load_object

    path = cfg.model
    if path.startswith(resolve.HF_PREFIX) or not resolve.IMPORT_PATH.match(path):
        return  # a built-in, hf:PATH, or a name resolve.check_model refuses in one line
    if path in registry.OBJECTS:
        return
    try:
        factory = load_object(path, "--model", MODEL_CONTRACT)
        sig = inspect.signature(factory)
    except UserError as e:
        raise PlanError(str(e)) from None
    except (TypeError, ValueError):  # no signature to read (a builtin): the trainer's contract
        return
    args = cfg.model_args
    with_cfg = takes_cfg(sig, args)
    try:
        if with_cfg:
            sig.bind(cfg, **args)
        else:
            sig.bind(**args)
    except TypeError as e:
        shown = f"--model-args {json.dumps(args)}" if args else "no --model-args"
        raise PlanError(
            f"--model {path}{sig}: {e} with {shown}{' (after cfg)' if with_cfg else ''}; "
            "pass its keywords with --model-args JSON"
        ) from None
    if not with_cfg:
        registry.OBJECTS[path] = lambda cfg, **kw: factory(**kw)


def takes_cfg(sig: Any, model_args: dict[str, Any]) -> bool:
    """Whether a factory's first parameter is the TrainConfig (see adapt_factory)."""
    import inspect

    params = list(sig.parameters.values())
    if not params or params[0].kind in (params[0].KEYWORD_ONLY, params[0].VAR_KEYWORD):
        return False
    first = params[0]
    if first.kind is first.VAR_POSITIONAL or first.name in ("cfg", "config"):
        return True
    return first.default is inspect.Parameter.empty and first.name not in model_args


def _kind(cfg: Any) -> str:
    """The model's data kind from the registry (the planner builds models through it too)."""
    from ddpkit.train import resolve

    try:
        return resolve.model_spec(cfg).data_kind
    except UserError as e:
        raise PlanError(str(e)) from None


def in_shape(cfg: Any) -> tuple[tuple[int, ...], int]:
    if _kind(cfg) == "tokens":
        return (cfg.seq_len,), cfg.vocab_size
    if _input_shape is not None:
        classes = _image_datasets().get(cfg.dataset, ((), None))[1]
        return _input_shape, classes or cfg.synthetic_classes
    shape, classes = _image_datasets()[cfg.dataset]
    return shape, classes or cfg.synthetic_classes


def build_meta(cfg: Any, dtype: str = "fp32") -> Any:
    import torch
    from ddpkit.train.models import build_model

    shape, classes = in_shape(cfg)
    try:
        with torch.device("meta"):
            model = build_model(cfg, shape, classes)
    except Exception as e:  # the user's factory, whatever it raises: one line
        raise cannot_run(cfg, e) from None
    if dtype != "fp32":
        model = model.to({"bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    return model


def _fused_sdpa() -> Any:
    """F.scaled_dot_product_attention as the fused kernels run it, for meta tensors.

    On the meta device SDPA takes the math path, which saves the T x T attention
    probabilities per head (4.6x the real figure for gpt at sequence 1024). The kernels
    training actually runs (flash / memory-efficient on CUDA, flash on the CPU) keep only
    q, k, v, the output and a float32 logsumexp per query row; this stand-in saves the same.
    """
    import torch

    class FusedSDPA(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any) -> Any:
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:  # never run: the pass only counts
            q, k, v, _, _ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def sdpa(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
        return FusedSDPA.apply(q, k, v)

    return sdpa


def saved_activation_bytes(cfg: Any, batch: int, dtype: str) -> int:
    """One training-mode forward (and the loss) on meta tensors: the bytes of the distinct
    non-parameter storages autograd saves for backward (views of one storage count once,
    as they do in memory), with attention as the fused SDPA kernels keep it."""
    from unittest import mock

    import torch
    import torch.nn.functional as F

    model = build_meta(cfg, dtype)
    model.train()
    shape, classes = in_shape(cfg)
    if _kind(cfg) == "tokens":
        x = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
        y = torch.zeros(batch * cfg.seq_len, dtype=torch.long, device="meta")
    else:
        x = torch.empty(batch, *shape, device="meta", dtype=next(model.parameters()).dtype)
        y = torch.zeros(batch, dtype=torch.long, device="meta")
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(F, "scaled_dot_product_attention", _fused_sdpa()))
        masking = sys.modules.get("transformers.masking_utils")
        if masking is not None:
            # HF's mask code asks the data whether rows pack several sequences (.item() on a
            # meta tensor fails); the kit's rows are one window each: no packing.
            stack.enter_context(
                mock.patch.object(masking, "find_packed_sequence_indices", lambda *a, **k: None)
            )
        try:
            return saved_bytes(model, lambda: F.cross_entropy(_logits(model(x)), y))
        except Exception as e:  # a forward that does not fit the input: one line
            raise cannot_run(cfg, e) from None


def _logits(out: Any) -> Any:
    return out.reshape(-1, out.shape[-1]).float()


def saved_bytes(model: Any, step: Any) -> int:
    """Bytes of the distinct storages (parameters excluded) autograd saves while step() runs.

    Works on real and on meta tensors: a storage is told apart by its StorageImpl pointer
    (meta tensors have no data pointer)."""
    import torch

    params = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}
    keep: list[Any] = []  # hold the tensors so a storage's address is not reused meanwhile

    def pack(t: Any) -> Any:
        s = t.untyped_storage()
        if s._cdata not in params and s._cdata not in saved:
            saved[s._cdata] = s.nbytes()
            keep.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(saved.values())


def describe_model(args: argparse.Namespace) -> ModelDesc:
    cfg = load_cfg(args)
    model = build_meta(cfg)
    shapes = [tuple(p.shape) for p in model.parameters()]
    from ddpkit.train.resolve import find_blocks

    in_blocks = {id(p) for b in find_blocks(model) for p in b.parameters()}
    units = [sum(p.numel() for p in b.parameters()) for b in find_blocks(model)]
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks)
    mp = cfg.mixed_precision if cfg.mixed_precision != "none" else "fp32"
    return ModelDesc(
        name=cfg.model,
        shapes=shapes,
        unit_params=max([*units, root]),
        root_params=root,
        batch_size=cfg.batch_size,
        dtype=mp,
        optimizer=cfg.optimizer,
        cfg=cfg,
    )

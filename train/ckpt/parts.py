"""The stateful parts a checkpoint holds, by name (ddpkit.train.ckpt saves and loads them).

Anything with state_dict/load_state_dict is a part; these adapt the model, the optimizer, the
RNG and plain values to that shape. The model and optimizer go through DCP's
get_*_state_dict (sharded under FSDP, keyed by parameter name), so a checkpoint reshards.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn


def rng_state() -> torch.Tensor:
    state = torch.get_rng_state()
    if torch.cuda.is_available():
        state = torch.cat([state, torch.cuda.get_rng_state()])
    return state


def set_rng_state(state: torch.Tensor) -> None:
    cpu = torch.get_rng_state()
    torch.set_rng_state(state[: cpu.numel()])
    if torch.cuda.is_available() and state.numel() > cpu.numel():
        torch.cuda.set_rng_state(state[cpu.numel() :])


# --- the stateful parts ------------------------------------------------------------------------


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ModelState:
    """The model's parameters and buffers (DCP's sharded view under FSDP)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(self.model)
        # The buffers as copies: a forward changes them in place (BatchNorm's running
        # statistics; DDP broadcasts rank 0's), and an async save's staging copy, which runs
        # beside the next step's forward, is fenced only before the optimizer step. Buffers
        # are small; the parameters stay views (only the optimizer changes them).
        buffers = {b.data_ptr() for b in self.model.buffers() if b.numel()}
        return {
            k: v.clone() if type(v) is torch.Tensor and v.data_ptr() in buffers else v
            for k, v in state.items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state)


class OptimizerState:
    """The optimizer's state keyed by parameter name (so it reshards like the model)."""

    def __init__(self, model: nn.Module, optim: torch.optim.Optimizer) -> None:
        self.model, self.optim = model, optim

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optim)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optim, state)


class RngState:
    """This rank's RNG state under its own key: each rank draws its own dropout/augmentation.
    A rank that did not exist when the checkpoint was written keeps its fresh seed."""

    def __init__(self, rank: int) -> None:
        self.key = f"rank{rank}"

    def state_dict(self) -> dict[str, Any]:
        return {self.key: rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state[self.key])


class Values:
    """A part made of plain values: `get()` returns them, `set(dict)` takes them back."""

    def __init__(self, get: Any, set: Any) -> None:  # noqa: A002
        self.get, self.set = get, set

    def state_dict(self) -> dict[str, Any]:
        return dict(self.get())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set(state)

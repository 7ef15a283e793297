"""ddpkit's training module as a library. Import-light: torch loads when fit() runs.

    from ddpkit.train import fit

    def build_model(cfg, width=64): ...          # (cfg, **model_args) -> nn.Module
    def build_dataset(cfg): ...                  # -> (train, val[, info]) of (x, y) pairs

    if __name__ == "__main__":
        raise SystemExit(fit(build_model, build_dataset, steps=100, batch_size=32))

Run the script as you would `python -m ddpkit.train` (alone or under torchrun): it takes the same
flags (`--parallel fsdp`, `--config job.toml`, ...), which win over the keywords given to
fit(). The contracts for the callables are in train/registry.py and the README.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ddpkit.train import builtins, user  # noqa: F401  (fill the registry before anything reads it)
from ddpkit.train.config import TrainConfig
from ddpkit.train.errors import UserError

__all__ = ["TrainConfig", "UserError", "fit"]


def fit(
    model: str | Callable[..., Any] | None = None,
    dataset: str | Callable[..., Any] | None = None,
    loss: str | Callable[..., Any] | None = None,
    *,
    states: dict[str, Any] | None = None,
    argv: Sequence[str] | None = None,
    **config: Any,
) -> int:
    """Train with everything `python -m ddpkit.train` has; returns its exit status (0 done, 2 bad
    input, 75 preempted: requeue). model/dataset/loss: a callable (the contracts in
    train/registry.py) or a name/import path as the flags take. `config`: TrainConfig fields
    as keywords (e.g. steps=100, model_args={"width": 64}); command-line flags override
    them (argv defaults to sys.argv[1:]). `states`: your own objects with
    state_dict()/load_state_dict() (an EMA, a curriculum), saved in every checkpoint as the
    part `user_<name>` and restored on resume (a checkpoint without it: one warning, the
    object keeps its value)."""
    import sys

    from ddpkit.train import registry
    from ddpkit.train.__main__ import main

    for key, part in (("model", model), ("dataset", dataset), ("loss", loss)):
        if part is not None:
            config[key] = part if isinstance(part, str) else registry.name_callable(part)
    for name, obj in (states or {}).items():  # bad input: one line, exit 2, like the flags
        if not name.isidentifier() or not all(
            callable(getattr(obj, m, None)) for m in ("state_dict", "load_state_dict")
        ):
            print(
                f"error: fit(states={{{name!r}: ...}}): needs an identifier as the name and an "
                f"object with state_dict/load_state_dict (got a {type(obj).__name__})",
                file=sys.stderr,
            )
            return 2
    return main(list(sys.argv[1:] if argv is None else argv), defaults=config, states=states)

"""ddpkit's training module as a library. Import-light: torch loads when fit() runs.

    from ddpkit.train import fit

    def build_model(cfg, width=64): ...          # (cfg, **model_args) -> nn.Module
    def build_dataset(cfg): ...                  # -> (train, val[, info]) of (x, y) pairs

    if __name__ == "__main__":
        raise SystemExit(fit(build_model, build_dataset, steps=100, batch_size=32))

Run the script as you would `python -m ddpkit.train` (alone or under torchrun): it takes the same
flags (`--parallel fsdp`, `--config job.toml`, ...), which win over the keywords given to
fit(). The contracts for the callables are in train/registry.py and the README.

fit() may run more than once in a process (say, a sweep in one script under torchrun): the
process group of the first run stays up for the next ones (torch's process group cannot be
re-created from the same rendezvous: the second one would hang in its first barrier) and is
destroyed at exit. After a run that failed, the group may be broken: a later fit() says so
in one line and returns 1 instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ddpkit.train import builtins, user  # noqa: F401  (fill the registry before anything reads it)
from ddpkit.train.errors import UserError

if TYPE_CHECKING:
    from ddpkit.train.config import TrainConfig

__all__ = ["TrainConfig", "UserError", "fit"]


def __getattr__(name: str) -> Any:
    """TrainConfig on first use: every process that imports a submodule runs this file (each
    worker of a user's script runs ddpkit.train.node), and most never read the config
    (its import, tomllib included, was a third of this package's)."""
    if name == "TrainConfig":
        from ddpkit.train.config import TrainConfig

        return TrainConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


_group = {"kept": False, "gone": False}  # this process's group across fit() calls


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
    import os
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
    if _group["gone"]:
        if os.environ.get("RANK", "0") == "0":
            print(
                "error: fit() after a failed fit() in the same process: its process group "
                "was torn down and cannot be formed again from this launch; run the next "
                "training in a new process (a new torchrun)",
                file=sys.stderr,
                flush=True,
            )
        return 1
    return _keeping_the_group(
        lambda: main(list(sys.argv[1:] if argv is None else argv), defaults=config, states=states)
    )


def _keeping_the_group(run: Callable[[], int]) -> int:
    """Run `python -m ddpkit.train`'s main() without its teardown of the process group when
    it succeeds (the next fit() trains in the same group; atexit destroys it)."""
    import atexit

    from ddpkit.train import distributed

    shutdown = distributed.shutdown
    distributed.shutdown = lambda: None  # main() calls it in its finally
    code: int | None = None
    try:
        code = run()
    finally:
        distributed.shutdown = shutdown
        import torch.distributed as dist

        if code != 0 and dist.is_available() and dist.is_initialized():
            shutdown()
            _group["gone"] = True
        elif code == 0 and not _group["kept"] and dist.is_initialized():
            _group["kept"] = True
            atexit.register(shutdown)
    return code

"""Whether a checkpoint fits this run: the model's shapes, the optimizer's kind, parts that
moved or were added since it was written, and what a failed load says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from ddpkit.train.ckpt.layout import first_line
from ddpkit.train.ckpt.parts import Stateful, Values
from ddpkit.train.errors import ConfigError

# Parts an older version kept inside another part: name -> (that part, its keys). Before
# the named parts, the sampler's position was part of the train state.
MOVED_PARTS: dict[str, tuple[str, tuple[str, ...]]] = {"sampler": ("train", ("epoch", "consumed"))}


def plain_values_as_saved(states: dict[str, Stateful], state: dict, meta: dict) -> list[str]:
    """Ask a plain-value part (Values) for the keys its checkpoint holds: a key added since
    keeps its fresh value (returned as 'part.key' for the warning) instead of failing the
    load with a missing key; a key it no longer has is read and ignored."""
    added: list[str] = []
    for name, part in states.items():
        if name not in state or not isinstance(part, Values):
            continue
        saved = {k.split(".", 2)[1] for k in meta if k.startswith(f"{name}.")}
        ours = state[name]
        added += [f"{name}.{k}" for k in ours if k not in saved]
        state[name] = {k: ours.get(k) for k in saved}
    return added


def moved_parts(states: dict[str, Stateful], state: dict, meta: dict, present: set) -> set:
    """The parts this checkpoint holds where an older version put them (MOVED_PARTS)."""
    moved = set()
    for name, (src, keys) in MOVED_PARTS.items():
        saved = all(f"{src}.{k}" in meta for k in keys)
        if name in states and name not in present and src in state and saved:
            moved.add(name)
    return moved


def checksum_problem(e: BaseException) -> str | None:
    """The message of a ChecksumError that any rank raised in a load, or None: a damaged file
    is reported as such, not as whatever it made torch.load trip over on another rank."""
    from ddpkit.train.ckpt.io import ChecksumError

    failures = getattr(e, "failures", None)
    errors = [f[0] for _, f in sorted(failures.items())] if isinstance(failures, dict) else [e]
    return next((str(x) for x in errors if isinstance(x, ChecksumError)), None)


def describe(e: BaseException) -> str:
    """'Type: first line' of an error; for DCP's CheckpointException, of the first rank's."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, (exc, _) = min(failures.items(), key=lambda kv: kv[0])
        return f"rank {rank}: {type(exc).__name__}: {first_line(exc)}"
    return f"{type(e).__name__}: {first_line(e)}"


def check_optimizer(path: Path, optim_sd: dict, meta: dict, info: dict[str, Any]) -> None:
    """The same kind of optimizer state (adamw's exp_avg vs sgd's momentum_buffer): DCP
    would otherwise fail deep in the load with a missing key."""
    ours = {k for st in optim_sd.get("state", {}).values() for k in st}
    theirs = {k.rsplit(".", 1)[1] for k in meta if k.startswith("optim.state.")}
    if ours and theirs and ours != theirs:
        saved = info.get("optimizer") or "another optimizer"
        raise ConfigError(
            f"checkpoint {path} holds the state of {saved} ({', '.join(sorted(theirs))}), "
            f"this run's optimizer keeps {', '.join(sorted(ours))}; resume with the optimizer "
            "it was saved with, or pass --reset-optimizer to start the optimizer state fresh"
        )


def check_compatible(path: Path, model_sd: dict, meta: dict, info: dict[str, Any]) -> None:
    ours = {
        f"model.{k}": tuple(v.shape) for k, v in model_sd.items() if isinstance(v, torch.Tensor)
    }
    theirs = {k: tuple(getattr(v, "size", ())) for k, v in meta.items() if k.startswith("model.")}
    if ours.keys() != theirs.keys() or any(ours[k] != theirs[k] for k in ours):
        diff = (
            sorted(set(ours) ^ set(theirs))[:3]
            or [f"{k}: {theirs[k]} vs {ours[k]}" for k in ours if ours[k] != theirs[k]][:3]
        )
        raise ConfigError(
            f"checkpoint {path} holds a different model ({info.get('model', '?')}; "
            f"first differences: {', '.join(map(str, diff))}); resume with the same model "
            "flags, or start fresh with --resume never / another --ckpt-dir"
        )

"""`python -m ddpkit.train` with step timestamps: the kit's own loop, observed from outside.

    torchrun ... -m bench.kit_timed --out FILE [--variant kit|kit-nostop] -- <train flags>

Runs ddpkit.train.__main__.main unchanged except for thin wrappers that record, on rank 0, when
each optimizer step returns and how long the start-up phases take (process group, data,
parallelize, checkpointer, resume). The wrappers cost a perf_counter call each.

Variant `kit-nostop` replaces the per-step stop-signal all_reduce (StopRequest.agreed) with
"no signal": it measures what that collective costs. It exists only in this benchmark.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

T_IMPORT = time.time()  # this module is imported right after the interpreter starts

from bench.common import write_json  # noqa: E402


def _wrap(owner: object, name: str, phases: list[tuple[str, float, float]], label: str) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*a, **kw):
        t0 = time.time()
        try:
            return fn(*a, **kw)
        finally:
            phases.append((label, t0, time.time()))

    setattr(owner, name, timed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kit_timed")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes the timestamps to")
    p.add_argument("--variant", choices=("kit", "kit-nostop"), default="kit")
    p.add_argument(
        "train_args", nargs=argparse.REMAINDER, help="-- then python -m ddpkit.train flags"
    )
    args = p.parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args

    t_torch = time.time()
    import ddpkit.train.__main__ as train_main
    from ddpkit.train import distributed, signals
    from ddpkit.train.ckpt import manager as checkpoint
    from ddpkit.train.loop import trainer

    t_torch_done = time.time()
    phases: list[tuple[str, float, float]] = [("import torch+train", t_torch, t_torch_done)]
    step_ends: list[float] = []
    first_step_wall: list[float] = []

    orig_step = trainer.Trainer.train_step

    def timed_step(self, batches):
        out = orig_step(self, batches)
        step_ends.append(time.perf_counter())
        if not first_step_wall:
            first_step_wall.append(time.time())
        return out

    trainer.Trainer.train_step = timed_step
    _wrap(distributed, "init", phases, "init process group")
    _wrap(trainer.Trainer, "_load_data", phases, "build data")
    _wrap(trainer, "parallelize", phases, "build model + DDP/FSDP")
    _wrap(checkpoint.Checkpointer, "__init__", phases, "checkpointer (gloo group)")
    _wrap(trainer.Trainer, "maybe_resume", phases, "resume (find + load)")
    if args.variant == "kit-nostop":
        signals.StopRequest.agreed = lambda self, device: 0

    rc = train_main.main(train_args)
    if os.environ.get("RANK", "0") == "0":
        write_json(
            Path(args.out),
            {
                "variant": args.variant,
                "rc": rc,
                "t_import": T_IMPORT,
                "t_first_step": first_step_wall[0] if first_step_wall else None,
                "step_ends": step_ends,
                "phases": [{"phase": n, "start": a, "s": b - a} for n, a, b in phases],
            },
        )
    return rc


if __name__ == "__main__":
    sys.exit(main())

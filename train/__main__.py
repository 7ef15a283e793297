"""`python -m train`: parse, validate, set up the process group, train, exit with a status.

Exit status: 0 done; 2 bad input (one line on stderr, no traceback); 75 a preemption signal
was received and a checkpoint saved: requeue and run the same command again (see README).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from train import early
from train.config import EXIT_BAD_INPUT, ConfigError, dump, parse_config


def main(argv: list[str] | None = None, defaults: dict[str, Any] | None = None) -> int:
    """`defaults`: settings a script passes through train.fit (flags and --config win)."""
    early.install()  # first: a stop signal during start-up is recorded, not fatal
    try:
        cfg, print_only = parse_config(argv, defaults)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if print_only:
        print(dump(cfg))
        return 0
    try:  # imports the user's model/dataset/loss: a bad path exits 2 before any process group
        from train.registry import precheck

        precheck(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

    # Before torch touches CUDA: segments that grow instead of fragmenting (fewer OOMs from
    # fragmentation with FSDP's all-gather buffers). A value the user set wins.
    if "PYTORCH_ALLOC_CONF" not in os.environ and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    # Heavy imports after the config is known good: --help and bad flags stay fast.
    from train import distributed
    from train.distributed import set_threads_from_env
    from train.trainer import CollectiveFailure, Trainer

    set_threads_from_env()
    world = None
    try:
        world = distributed.init(cfg)
        return Trainer(cfg, world).train()
    except ConfigError as e:
        if world is None or world.is_main:
            print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CollectiveFailure as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        distributed.shutdown()


if __name__ == "__main__":
    sys.exit(main())

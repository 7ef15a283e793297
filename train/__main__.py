"""`python -m ddpkit.train`: parse, validate, set up the process group, train, exit with a status.

Exit status: 0 done; 2 bad input (one line on stderr, no traceback); 75 a preemption signal
was received and a checkpoint saved: requeue and run the same command again (docs/checkpoints.md).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ddpkit.train import signals, teardown
from ddpkit.train.config import EXIT_BAD_INPUT, ConfigError, dump, parse_config


def main(
    argv: list[str] | None = None,
    defaults: dict[str, Any] | None = None,
    states: dict[str, Any] | None = None,
) -> int:
    """`defaults`: settings a script passes through train.fit (flags and --config win);
    `states`: its own objects with state_dict/load_state_dict, checkpointed by name."""
    signals.install()  # first: a stop signal during start-up is recorded, not fatal
    teardown.install()  # the exit waits for gloo's threads (train/teardown.py)
    try:
        cfg, print_only = parse_config(argv, defaults)
    except ConfigError as e:
        return _before_group(e)
    if print_only:
        print(dump(cfg))
        return 0
    try:  # imports the user's model/dataset/loss: a bad path exits 2 before any process group
        from ddpkit.train.ckpt.store import check_ckpt_dir, local_dir
        from ddpkit.train.preflight import check_paths
        from ddpkit.train.resolve import precheck

        precheck(cfg)
        check_ckpt_dir(str(cfg.ckpt_dir))  # a store's: credentials and bucket, one line
        check_paths({"--run-dir": cfg.run_dir, "--ckpt-dir": local_dir(str(cfg.ckpt_dir))})
    except ConfigError as e:
        return _before_group(e)

    # Before torch touches CUDA: segments that grow instead of fragmenting (fewer OOMs from
    # fragmentation with FSDP's all-gather buffers). A value the user set wins.
    if "PYTORCH_ALLOC_CONF" not in os.environ and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    # Heavy imports after the config is known good: --help and bad flags stay fast.
    import torch.distributed as dist
    from ddpkit.train import distributed
    from ddpkit.train.ckpt.store import StoreLost
    from ddpkit.train.distributed import set_threads_from_env
    from ddpkit.train.loop.trainer import CollectiveFailure, Trainer

    set_threads_from_env()
    world = None
    try:
        world = distributed.init(cfg)
        return Trainer(cfg, world, states).train()
    except ConfigError as e:
        if world is None:
            return _before_group(e)
        if _claim_user_error():  # the first rank to see it prints it; the rest stay quiet
            print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except StoreLost as e:  # the checkpoint store went away: one line, and a restart waits for it
        from ddpkit.train.failure import note_cause

        _claim_user_error(_STORE_LOST_KEY)  # peers whose collectives fail after us stay quiet
        note_cause(e)  # "store lost" for the launcher and the goodput report
        if os.environ.get("RANK", "0") == "0":  # every rank saw it: rank 0 says it
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    except CollectiveFailure as e:
        if _user_error_seen():  # a peer left on a user error (it printed the line)
            return EXIT_BAD_INPUT
        if _user_error_seen(_STORE_LOST_KEY):  # a peer lost the store (rank 0 said so)
            return 1
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    except OSError as e:  # a full run dir (metrics, summary, config): one line, not a traceback
        from pathlib import Path

        from ddpkit.train.ckpt.files import is_no_space, no_space_message

        if not is_no_space(e):
            raise
        if world is None or _claim_user_error():
            where = Path(e.filename) if e.filename else Path(str(cfg.run_dir))
            print(f"error: {no_space_message(where)}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except (RuntimeError, dist.DistError):
        if world is not None and _user_error_seen():
            return EXIT_BAD_INPUT
        if world is not None and _user_error_seen(_STORE_LOST_KEY):
            return 1  # a peer lost the store and said so; this rank's collective lost the peer
        raise
    finally:
        distributed.shutdown()


_USER_ERROR_KEY = "ddpkit/user_error"
_STORE_LOST_KEY = "ddpkit/store_lost"


# How long a rank other than 0 waits, after a bad config, for rank 0 to say it (see below).
_LET_RANK_0_SAY_S = 5.0


def _before_group(e: ConfigError) -> int:
    """Every rank checks the same config the same way: rank 0 says it, once per job.

    The others leave only after rank 0 had time to: under a plain torchrun the first worker
    to exit makes the agent stop the rest, and a rank 1 that parsed faster than rank 0 got
    rank 0 stopped before its line (seen in CI, on a loaded machine: the job exited 2 with
    no word why). They wait up to _LET_RANK_0_SAY_S, or until the agent's stop signal,
    which comes once rank 0 has exited: no wait at all when rank 0 was first."""
    if os.environ.get("RANK", "0") == "0":
        print(f"error: {e}", file=sys.stderr, flush=True)
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        import time

        deadline = time.monotonic() + _LET_RANK_0_SAY_S
        while time.monotonic() < deadline and signals.received() is None:
            time.sleep(0.05)
    return EXIT_BAD_INPUT


def _claim_user_error(key: str = _USER_ERROR_KEY) -> bool:
    """True for the first rank of this attempt that reports a user error (the store's
    counter; `key`: another kind of error); with no store (one process) always True."""
    from ddpkit.train.diagnosis import _store

    store = _store()
    if store is None:
        return True
    try:
        return store.add(key, 1) == 1
    except Exception:
        return True


def _user_error_seen(key: str = _USER_ERROR_KEY) -> bool:
    """A peer reported a user error (`key`: or another kind of error): this rank's
    collective failed because that peer left."""
    from ddpkit.train.diagnosis import _store

    store = _store()
    try:
        return store is not None and store.check([key])
    except Exception:
        return False


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # the launcher retries a crash, never the code's own exception
        from ddpkit.train.failure import note_cause

        note_cause(e)
        raise

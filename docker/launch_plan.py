"""What the container entrypoint needs to know before it starts torchrun.

Usage: python launch_plan.py [train flags]. Resolves the training flags exactly as
`python -m train` will (train.config.parse_config), so bad input fails here with one line
and exit status 2 before any worker starts, and prints three lines for the entrypoint:

    <run dir>                 where rank 0 writes requeue.json on a preemption save
    <shutdown timeout, s>     torchrun's --shutdown-timeout: the signal save must fit in it
    <processes per node>      one per visible GPU, else one per usable CPU (gloo);
                              empty when PET_NPROC_PER_NODE is set (torchrun reads it itself)
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

# train/ sits beside this directory, in the image (/opt/ddpkit) and in a checkout alike.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from train.config import ConfigError, parse_config  # noqa: E402


def local_processes() -> int:
    """One process per visible GPU; without one, one per CPU this process may run on."""
    import torch  # late: costs seconds, and only when the count is not given

    return torch.cuda.device_count() or len(os.sched_getaffinity(0))


def main(argv: list[str]) -> int:
    try:
        cfg, _ = parse_config(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    nproc = "" if os.environ.get("PET_NPROC_PER_NODE") else str(local_processes())
    print(cfg.run_dir)
    print(max(1, math.ceil(cfg.shutdown_timeout_s)))
    print(nproc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

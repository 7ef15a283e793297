"""The container's process count, for the entrypoint: one per visible GPU, else one per CPU
this process may run on (gloo). Printed as one line.

Kept out of the entrypoint's shell because counting GPUs needs torch; the node launcher
(python -m ddpkit.train.node) does everything else: flag checks, the launch contract, the exit status.
"""

from __future__ import annotations

import os


def local_processes() -> int:
    """One process per visible GPU; without one, one per CPU this process may run on."""
    import torch  # costs seconds, and only when PET_NPROC_PER_NODE does not give the count

    return torch.cuda.device_count() or len(os.sched_getaffinity(0))


if __name__ == "__main__":
    print(local_processes())

"""Where a task of a SLURM job step is, read from srun's own variables, for a tool run
directly under srun (`srun ddpkit doctor`): no node launcher tells such a task where it is.
Nothing outside this engine reads a SLURM variable (a job's nodes get the launch contract's
DDPKIT_NODE_* names from node.sh.j2)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping


def task_layout(env: Mapping[str, str]) -> dict[str, int] | None:
    """This srun task's rank, world, local rank, local world and nodes; None outside a step
    of several tasks."""
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
        nnodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
        return {
            "rank": int(env["SLURM_PROCID"]),
            "world": int(env["SLURM_NTASKS"]),
            "local_rank": int(env.get("SLURM_LOCALID", 0)),
            "local_world": int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]),
            "nnodes": nnodes,
        }
    return None


def head_node(env: Mapping[str, str]) -> str | None:
    """The job's first node (scontrol's expansion of its node list), or None."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else None

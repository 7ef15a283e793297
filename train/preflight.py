"""What this machine and this world must give a run before anything is written: the
packages its logging needs, writable run and checkpoint dirs, a world size its sharding fits.

The config (config.py) says what the user asked for; these checks say whether it can run
here, so they are kept apart from it: `parse_config` runs the package and world checks, the
trainer's entry runs the path check on the node, the memory planner the world check for the
cluster it plans for. They take plain values (flags and paths, the world's numbers), not the
config, so config.py imports them and nothing here imports back. Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddpkit.train.errors import ConfigError


def check_packages(needs: dict[str, str]) -> None:
    """Each package a flag needs ({flag: module}) is importable here, before anything is
    written."""
    from importlib.util import find_spec

    for flag, module in needs.items():
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(
                f"{flag} needs the {module} package, which is not installed: "
                f"pip install {module} (or pip install -e '.[logging]'), or drop {flag}"
            )


def check_paths(dirs: dict[str, str | Path]) -> None:
    """The run and checkpoint dirs ({flag: path}) can be made and written here (on the node,
    before anything is written: not part of validate(), which the launcher also runs
    elsewhere). A probe directory is made and removed in the nearest existing one."""
    import tempfile

    for flag, value in dirs.items():
        path = Path(str(value))
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            where = "is a file" if probe == path else f"is under {probe}, a file"
            raise ConfigError(f"{flag} {value} {where}; pass a directory path")
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".ddpkit-probe-", dir=probe))
        except OSError as e:
            raise ConfigError(
                f"{flag} {value}: cannot create directories in {probe} ({e.strerror}); "
                "pass a writable path"
            ) from None


def world_from_env() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) as torchrun sets them; 0,1,0,1 alone."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    return rank, size, local_rank, local_size


def replicate_problem(size: int, rep: int) -> str | None:
    """HYBRID_SHARD's one rule (the trainer's and the planner's): the replicate degree divides
    the world size. The problem and its fix, or None."""
    if size % rep == 0:
        return None
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    return (
        f"HYBRID_SHARD: replicate degree {rep} does not divide world size {size} "
        f"({size} % {rep} = {size % rep}); pass --replicate-degree one of "
        f"{', '.join(map(str, divisors))}"
    )


def check_world(sharding: str | None, replicate_degree: int | None, size: int, nnodes: int) -> None:
    """World-size rules, checked from the environment before any process group exists."""
    if sharding == "HYBRID_SHARD":
        problem = replicate_problem(size, replicate_degree or nnodes)
        if problem:
            raise ConfigError(problem)

"""Process-group setup: torchrun's environment, or a single process without it."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from train.config import ConfigError, TrainConfig


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: torch.device
    backend: str

    @property
    def nnodes(self) -> int:
        return max(1, self.size // max(1, self.local_size))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_from_env() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) as torchrun sets them; 0,1,0,1 alone."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    return rank, size, local_rank, local_size


def check_world(cfg: TrainConfig, size: int, nnodes: int) -> None:
    """World-size rules, checked from the environment before any process group exists."""
    if cfg.sharding == "HYBRID_SHARD":
        rep = cfg.replicate_degree or nnodes
        if size % rep:
            divisors = [d for d in range(1, size + 1) if size % d == 0]
            raise ConfigError(
                f"HYBRID_SHARD: replicate degree {rep} does not divide world size {size} "
                f"({size} % {rep} = {size % rep}); pass --replicate-degree one of "
                f"{', '.join(map(str, divisors))}"
            )


def init(cfg: TrainConfig) -> World:
    rank, size, local_rank, local_size = world_from_env()
    check_world(cfg, size, max(1, size // max(1, local_size)))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ and "RANK" in os.environ:
            kwargs = {"device_id": device} if backend == "nccl" else {}
            dist.init_process_group(backend, timeout=timeout, **kwargs)
        else:
            # One process without torchrun: a real (world size 1) group keeps every code
            # path the same, FSDP and DCP included.
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
            )
    return World(rank, size, local_rank, local_size, device, backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

"""Process-group setup: torchrun's environment, or a single process without it."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from ddpkit.train import places
from ddpkit.train.config import TrainConfig
from ddpkit.train.diagnosis import attempt_store
from ddpkit.train.preflight import check_world, world_from_env


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


def init(cfg: TrainConfig) -> World:
    rank, size, local_rank, local_size = world_from_env()
    check_world(cfg.sharding, cfg.replicate_degree, size, max(1, size // max(1, local_size)))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
        # TF32 tensor cores for fp32 matmuls/convolutions: ~10-bit mantissa products with
        # fp32 accumulation, the usual trade for training (bf16 runs are unaffected).
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ and "RANK" in os.environ:
            kwargs = {"device_id": device} if backend == "nccl" else {}
            # the round is the same on every node; the restart count is not after a membership
            # change (a node restarted for another's failure keeps its count): the two nodes
            # then waited on different keys until the timeout (seen on SLURM, a stopped rank)
            store = attempt_store(os.environ, timeout.total_seconds(), size)
            if store is not None:
                kwargs.update(store=store, rank=rank, world_size=size)
            dist.init_process_group(backend, timeout=timeout, **kwargs)
        else:
            # One process without torchrun: a real (world size 1) group keeps every code
            # path the same, FSDP and DCP included.
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
            )
    if size > 1:  # for a collective's diagnosis (ddpkit.train.diagnosis): where each rank runs
        places.publish(dist.distributed_c10d._get_default_store(), rank)
    return World(rank, size, local_rank, local_size, device, backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def set_threads_from_env() -> None:
    """torchrun sets OMP_NUM_THREADS=1; honour it for intra-op threads too."""
    n = os.environ.get("OMP_NUM_THREADS")
    if n and n.isdigit():
        torch.set_num_threads(int(n))

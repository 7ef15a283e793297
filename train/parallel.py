"""All parallelism in one place: activation checkpointing, compile, then DDP or FSDP2.

The FSDP1 strategy names map onto FSDP2 (`fully_shard`) like this:
- FULL_SHARD:    1-D mesh over all ranks, parameters resharded after forward (ZeRO-3).
- SHARD_GRAD_OP: 1-D mesh, parameters kept unsharded between forward and backward (ZeRO-2
                 style: no all-gather in backward; resharded after backward).
- HYBRID_SHARD:  2-D mesh (replicate, shard): shard inside a group, all-reduce across groups.
- NO_SHARD:      2-D mesh (world, 1): every rank holds everything, gradients all-reduced,
                 i.e. DDP's arithmetic through the FSDP2 code path.
"""

from __future__ import annotations

import torch
from ddpkit.train.config import TrainConfig
from ddpkit.train.distributed import World
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build_mesh(cfg: TrainConfig, world: World) -> DeviceMesh | None:
    dev = world.device.type
    if cfg.parallel == "ddp":
        return None
    if cfg.sharding == "HYBRID_SHARD":
        rep = cfg.replicate_degree or world.nnodes
        return init_device_mesh(
            dev, (rep, world.size // rep), mesh_dim_names=("replicate", "shard")
        )
    if cfg.sharding == "NO_SHARD":
        return init_device_mesh(dev, (world.size, 1), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(dev, (world.size,), mesh_dim_names=("shard",))


def apply_activation_checkpointing(blocks: list[nn.Module], model: nn.Module) -> None:
    """Recompute each block's activations in backward instead of keeping them."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    targets = {id(b) for b in blocks}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                setattr(parent, name, checkpoint_wrapper(child))  # also works in a ModuleList


def apply_compile(blocks: list[nn.Module]) -> None:
    for b in blocks:
        b.compile()  # per block: small graphs compile fast and compose with FSDP2's hooks


def apply_fsdp(
    model: nn.Module, blocks: list[nn.Module], cfg: TrainConfig, mesh: DeviceMesh
) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if cfg.mixed_precision in DTYPES:
        # Compute in low precision, reduce gradients in fp32: the usual accuracy/speed trade.
        mp = MixedPrecisionPolicy(
            param_dtype=DTYPES[cfg.mixed_precision], reduce_dtype=torch.float32
        )
    reshard = cfg.sharding != "SHARD_GRAD_OP"
    for b in blocks:
        fully_shard(b, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    # The root holds what no block owns (embeddings, head); keeping it unsharded after forward
    # saves an all-gather at the start of backward.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


def apply_ddp(model: nn.Module, world: World, stable_buckets: bool = False) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [world.local_rank] if world.device.type == "cuda" else None
    if not stable_buckets:
        return DDP(model, device_ids=ids)
    # DDP re-lays its gradient buckets in ready order after the first backward, unless it
    # looks for unused parameters (its one switch for that): then the layout of the first
    # step is kept for good. torchft's replica groups all-reduce bucket by bucket across
    # groups (train/ft.py), and a group that restarts must lay its buckets out as the
    # groups that never did. The graph walk that costs per step is small; its warning that
    # no parameter was unused is expected here.
    import warnings

    warnings.filterwarnings("ignore", message=".*find_unused_parameters=True was specified")
    return DDP(model, device_ids=ids, find_unused_parameters=True)


def parallelize(
    model: nn.Module, cfg: TrainConfig, world: World, stable_buckets: bool = False
) -> tuple[nn.Module, nn.Module]:
    """Returns (the module to train, the unwrapped model whose parameter names are canonical).
    stable_buckets: DDP's bucket layout never changes (torchft's groups, see apply_ddp)."""
    from ddpkit.train.resolve import find_blocks

    blocks = find_blocks(model)
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(blocks, model)
        blocks = find_blocks(model)
    if cfg.compile:
        apply_compile(blocks)
    model.to(world.device)
    if cfg.parallel == "ddp":
        # DDP broadcasts rank 0's replica itself
        return apply_ddp(model, world, stable_buckets), model
    broadcast_replica(model, world)
    apply_fsdp(model, blocks, cfg, build_mesh(cfg, world))
    return model, model


def broadcast_replica(model: nn.Module, world: World) -> None:
    """Rank 0's parameters and buffers to every rank before sharding, as DDP does: a user
    model initialised differently per rank (numpy-seeded, say) would otherwise train as
    replicas that drift apart (NO_SHARD, HYBRID_SHARD's replicas) or as shards of different
    models. One broadcast of the model at start-up."""
    if world.size == 1:
        return
    import torch.distributed as dist

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.device.type != "meta":
                dist.broadcast(t.data, src=0)


def set_grad_sync(model: nn.Module, enabled: bool) -> None:
    """Gradient accumulation: skip the reduction on all but the last micro-step."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(enabled)
    elif hasattr(model, "require_backward_grad_sync"):  # DDP (what no_sync() toggles)
        model.require_backward_grad_sync = enabled

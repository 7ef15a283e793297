"""The planner's dry run: the job's real model, parallelized by the kit's own `parallelize` at
the job's real world size, over torch's fake process group, measured from the sharded tensors.

Nothing is allocated and nothing is sent: the model lives on the meta device, and the fake
group answers every collective without data. The process is rank 0 of the fake world. FSDP2
splits each parameter along dim 0 with torch.chunk (ceil-sized chunks), so rank 0 holds the
largest shard of every parameter: its `to_local()` sizes are the rank that runs out first,
measured. The smallest rank (the last shard index; empty where dim 0 has fewer rows than the
group has ranks) follows from the same split and is reported beside it.

DDP is not wrapped: torch's DDP constructor checks parameter shapes across ranks with an
`.item()` that meta tensors cannot answer. Every DDP rank holds the whole replica, which is what
the unwrapped model measures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ddpkit.tools.planner.model import (
    OPTIM_BYTES,
    PlanError,
    RankState,
    cannot_run,
    in_shape,
    shard_rows,
)
from ddpkit.train.errors import UserError

FP32 = 4


@dataclass
class DryRun:
    strategy: str
    world: int
    nodes: int
    mesh: dict[str, int]  # mesh dim name -> size; {} for DDP
    params: int  # the model's parameter count
    largest: RankState  # rank 0: the largest shard of every parameter (measured)
    smallest: RankState  # the last shard index (from the same dim-0 split)
    # The whole checkpoint, every rank's files together: the unsharded parameters at their
    # dtype and the optimizer's state (what DCP writes once, replicas deduplicated).
    ckpt_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        def one(r: RankState) -> dict[str, int]:
            return {**dataclasses.asdict(r), "measured_state_bytes": r.total}

        return {
            "strategy": self.strategy,
            "world": self.world,
            "nodes": self.nodes,
            "mesh": self.mesh,
            "params": self.params,
            "per_rank": one(self.largest),
            "smallest_rank": one(self.smallest),
        }


def strategy_cfg(cfg: Any, strategy: str) -> Any:
    """The job's config with its parallelism set to `strategy` (DDP or an FSDP sharding)."""
    if strategy == "DDP":
        return dataclasses.replace(cfg, parallel="ddp", sharding=None, replicate_degree=None)
    rep = cfg.replicate_degree if strategy == "HYBRID_SHARD" else None
    return dataclasses.replace(cfg, parallel="fsdp", sharding=strategy, replicate_degree=rep)


def check_job(cfg: Any, gpus: int, nodes: int) -> None:
    """What the cluster would refuse after the queue wait for the world itself, in the
    trainer's own words. The data is another matter: see data_shortfall."""
    from ddpkit.train.errors import ConfigError
    from ddpkit.train.preflight import check_world

    if gpus < 1 or nodes < 1 or gpus % nodes:
        raise PlanError(
            f"--gpus {gpus} is not a multiple of --nodes {nodes}: gpus is the total over all "
            "nodes; pass nodes * gpus-per-node"
        )
    try:
        check_world(cfg.sharding, cfg.replicate_degree, gpus, nodes)
    except ConfigError as e:
        raise PlanError(str(e)) from None


def data_shortfall(cfg: Any, gpus: int) -> str | None:
    """One line when the job's data holds fewer samples than one global batch at `gpus` ranks
    (the trainer refuses to start), else None. A memory plan only warns of it: the memory of a
    step does not depend on the dataset's length, and a plan is often made before the data of
    the real run exists; `submit --plan`, a real run, refuses it."""
    samples = epoch_samples(cfg)
    global_batch = cfg.batch_size * gpus * cfg.grad_accum
    if samples is None or samples >= global_batch:
        return None
    return (
        f"the dataset has {samples} samples, fewer than one global batch (batch "
        f"{cfg.batch_size} x world {gpus} x grad-accum {cfg.grad_accum} = {global_batch}); "
        "lower --batch-size or --grad-accum, or give the job more data"
    )


def warn_short_data(cfg: Any, gpus: int) -> None:
    """The planner's word on data_shortfall: one warning line on stderr, and the plan goes on."""
    import sys

    short = data_shortfall(cfg, gpus)
    if short:
        print(f"warning: {short} (a real run would refuse it)", file=sys.stderr, flush=True)


def epoch_samples(cfg: Any) -> int | None:
    """Training samples per epoch where the config alone says it (synthetic data); None for
    data that must be opened to count."""
    return cfg.synthetic_samples if cfg.dataset == "synthetic" else None


@contextlib.contextmanager
def fake_world(size: int) -> Iterator[None]:
    """Rank 0 of a `size`-rank fake process group, torn down on the way out."""
    import sys

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise PlanError("the dry run needs a process without a process group; run it alone")
    hook = sys.excepthook  # init_process_group wraps it with a "[rank0]:" prefix
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


@contextlib.contextmanager
def stays_on_meta(model: Any) -> Iterator[None]:
    """parallelize() moves the model to the rank's device; meta tensors have no data to copy,
    and FSDP2 shards meta parameters as they are, so the move is skipped for the dry run."""
    model.to = lambda *args, **kwargs: model
    try:
        yield
    finally:
        del model.to


def build_model(cfg: Any) -> Any:
    from ddpkit.train import resolve

    try:
        spec = resolve.model_spec(cfg)
        shape, classes = in_shape(cfg)
        return resolve.meta_model(spec, cfg, SimpleNamespace(in_shape=shape, num_classes=classes))
    except Exception as e:  # a UserError's line, or the user's factory's failure in one
        raise cannot_run(cfg, e) from None


def dry_run(cfg: Any, gpus: int, nodes: int, strategy: str) -> DryRun:
    """Build, parallelize and measure the job as rank 0 of `gpus` ranks on `nodes` nodes."""
    import torch
    from ddpkit.train.distributed import World
    from ddpkit.train.parallel import parallelize

    cfg = strategy_cfg(cfg, strategy)
    check_job(cfg, gpus, nodes)
    world = World(0, gpus, 0, gpus // nodes, torch.device("cpu"), "fake")
    with fake_world(gpus):
        model = build_model(cfg)
        params = sum(p.numel() for p in model.parameters())
        ckpt = checkpoint_bytes(model, cfg.optimizer)
        if strategy != "DDP":
            with stays_on_meta(model):
                try:
                    parallelize(model, cfg, world)
                except Exception as e:  # FSDP's refusal, whatever its type: one line
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                    raise PlanError(
                        f"{strategy} cannot shard this model on {gpus} ranks: "
                        f"{type(e).__name__}: {first}"
                    ) from None
        largest, smallest, mesh = measure(model, cfg.optimizer)
    return DryRun(strategy, gpus, nodes, mesh, params, largest, smallest, ckpt)


def checkpoint_bytes(model: Any, optimizer: str) -> int:
    """The unsharded model's checkpoint: parameters at their dtype, the optimizer's fp32
    state per parameter, and Adam's 4-byte step per tensor."""
    step = FP32 if optimizer in ("adam", "adamw") else 0
    return sum(
        p.numel() * (p.element_size() + OPTIM_BYTES[optimizer]) + step for p in model.parameters()
    )


def measure(model: Any, optimizer: str) -> tuple[RankState, RankState, dict[str, int]]:
    """(rank 0's state, the smallest rank's state, the mesh) from the parameters as sharded.
    Gradients take the local shard's shape and dtype; the optimizer keeps fp32 tensors of the
    local shard's shape (Adam/AdamW two, SGD's momentum one) and Adam a 4-byte step per tensor."""
    from torch.distributed.tensor import DTensor, Shard

    per_param = OPTIM_BYTES[optimizer]
    step = FP32 if optimizer in ("adam", "adamw") else 0
    big, small = RankState(0, 0, 0), RankState(0, 0, 0)
    mesh: dict[str, int] = {}
    for p in model.parameters():
        n0, n_last = p.numel(), p.numel()
        if isinstance(p, DTensor):
            local = p.to_local()
            n0 = local.numel()
            names = p.device_mesh.mesh_dim_names or ()
            mesh = dict(zip(names, p.device_mesh.shape, strict=True))
            n_last = last_shard_numel(tuple(p.shape), p.device_mesh.shape, p.placements, Shard)
        size = p.element_size()
        for acc, n in ((big, n0), (small, n_last)):
            acc.params += size * n
            acc.grads += size * n
            acc.optim += per_param * n + step
    return big, small, mesh


def last_shard_numel(
    shape: tuple[int, ...], mesh: tuple[int, ...], placements: Any, shard: Any
) -> int:
    """Elements the last shard index holds along every sharded mesh dim."""
    dims = list(shape)
    for parts, placement in zip(mesh, placements, strict=True):
        if isinstance(placement, shard):
            d = placement.dim
            dims[d] = shard_rows(dims[d], parts, parts - 1)
    return math.prod(dims)


def zero_state_bytes(strategy: str, params: int, world: int, shard: int, optimizer: str) -> float:
    """The ZeRO table (the article's section 3.1), K = 12 for Adam: DDP 16Psi, SHARD_GRAD_OP
    2Psi + 14Psi/N (the paper's fp16 copy replicated), FULL_SHARD 16Psi/N, HYBRID_SHARD
    16Psi/shard degree. For SGD K = 8."""
    total = 8 + OPTIM_BYTES[optimizer]
    if strategy in ("DDP", "NO_SHARD"):
        return total * params
    if strategy == "SHARD_GRAD_OP":
        return 2 * params + (total - 2) * params / world
    return total * params / (world if strategy == "FULL_SHARD" else shard)


def plan_for_spec(spec: Any) -> str | None:
    """plan_spec's refusal alone."""
    return plan_spec(spec)[0]


def plan_spec(spec: Any) -> tuple[str | None, DryRun | None]:
    """(refusal, the dry run) of a launcher JobSpec; the dry run is None where none ran.

    The dry run of a launcher JobSpec before it is queued (`submit --plan`): None when the
    job passes (or cannot be planned here), else the one-line refusal the cluster would give
    after the queue wait (a mesh that does not divide, a batch larger than the data, a layer
    FSDP cannot shard).

    Only the kit's own entry point (`python -m ddpkit.train` with the [train] table) is planned:
    a user's script or module builds its model out of sight, so it returns None. The model is
    built on the meta device here, so a hf:PATH model must exist on this machine."""
    from ddpkit.train.config import ConfigError, parse_config

    if not spec.default_entry:
        return None, None
    try:
        cfg, _ = parse_config(
            spec.train_argv(),
            world=(spec.world_size, spec.nodes),
            installed=False,
            local_paths=False,
        )
        strategy = "DDP" if cfg.parallel == "ddp" else (cfg.sharding or "FULL_SHARD")
        run = dry_run(cfg, spec.world_size, spec.nodes, strategy)
        short = data_shortfall(cfg, spec.world_size)  # the real run would refuse it
        if short:
            return short, run
    except (ConfigError, UserError) as e:
        return (str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__), None
    return None, run

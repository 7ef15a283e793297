"""The step-time model's arithmetic: what each strategy sends, and how much of it the compute
of one step hides. The links and their costs are ddpkit.tools.planner.links. Per strategy,
per micro-batch:

    DDP           all_reduce of the fp32 gradients in 25 MiB buckets, during backward
    FULL_SHARD    all_gather per FSDP unit in forward and again in backward (the root unit
                  stays gathered), reduce_scatter of the fp32 gradients once per step
    SHARD_GRAD_OP all_gather per unit in forward only, reduce_scatter once per step
    HYBRID_SHARD  FULL_SHARD inside the shard group (a node), then all_reduce of each rank's
                  gradient shard across the replicas (one rank per node, G groups at once)

Overlap (stated, not measured): a unit's communication hides behind the compute of the phase
it runs in (forward or backward), `--overlap` of that window (1.0: fully, as NCCL on its own
streams does; 0: none, the serial bound). What cannot hide: the root unit's all_gather before
the first layer, the root's reduce_scatter (its gradients are the last ones), DDP's last bucket.

    exposed = fixed + sum over phases of max(0, comm(phase) - overlap * compute(phase))
    step    = compute + exposed;  compute = grad_accum * (fwd + bwd) + optimizer / shard
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ddpkit.tools.commbench import bus_factor
from ddpkit.tools.planner.links import Fabric
from ddpkit.tools.planner.model import PlanError

STRATEGIES = ("DDP", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default (25 MiB)
GRAD_BYTES = 4  # gradients are reduced in fp32 (FSDP2 reduce_dtype, DDP under autocast)


@dataclass(frozen=True)
class ModelComm:
    """What the strategies move: parameter counts of the FSDP units and their dtype."""

    params: int
    root_params: int  # the root unit (what no block owns); stays gathered fwd -> bwd
    block_params: list[int]
    param_bytes: int = 4  # the all-gathered dtype: 2 under bf16/fp16 mixed precision
    tokens_per_sample: int = 0  # gpt: seq_len; 0: the model counts samples


@dataclass
class Compute:
    """One rank's compute: forward and backward of one micro-batch, and the optimizer step on
    the whole (unsharded) model; `samples` per micro-batch."""

    fwd_s: float
    bwd_s: float
    opt_s: float
    samples: int
    source: str


@dataclass
class Prediction:
    strategy: str
    world: int
    shard: int
    volume_bytes: float  # bytes each rank sends per step (ring), all collectives
    compute_s: float
    comm_s: float
    exposed_s: float
    step_s: float
    samples_per_s: float
    tokens_per_s: float | None
    memory_bytes: int | None = None
    fits: bool | None = None
    parts: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def shard_size(strategy: str, fabric: Fabric, replicate: int | None = None) -> int:
    world = fabric.nodes * fabric.gpus_per_node
    if strategy == "DDP":
        return 1
    if strategy == "HYBRID_SHARD":
        return world // (replicate or fabric.nodes)
    return world


def buckets(nbytes: float, cap: float = DDP_BUCKET_BYTES) -> list[float]:
    full = int(nbytes // cap)
    rest = nbytes - full * cap
    return [cap] * full + ([rest] if rest > 0 else [])


def predict(
    strategy: str,
    m: ModelComm,
    fabric: Fabric,
    compute: Compute,
    grad_accum: int = 1,
    overlap: float = 1.0,
    replicate: int | None = None,
) -> Prediction:
    """The step of one strategy (see the module docstring for the model and its assumptions)."""
    if strategy not in STRATEGIES:
        raise PlanError(f"unknown strategy {strategy!r}: pick one of {', '.join(STRATEGIES)}")
    G, N = fabric.gpus_per_node, fabric.nodes
    world = N * G
    shard = shard_size(strategy, fabric, replicate)
    A, bp, gb = grad_accum, m.param_bytes, GRAD_BYTES
    spanned = max(1, math.ceil(shard / G))  # nodes one shard group spans
    rep = world // shard

    def in_group(op: str, nbytes: float) -> float:
        return fabric.group(op, nbytes, shard, spanned)

    def across(nbytes: float) -> float:
        """HYBRID_SHARD's replica all_reduce of one gradient shard. With the shard group a node
        (the default), a replica group is one rank per node and the node's G groups share its
        network; a smaller shard group puts several replicas of a group in one node."""
        nodes, per_node = min(rep, N), min(shard, G)
        return fabric.group("all_reduce", nbytes, rep, nodes, per_node if nodes > 1 else 1)

    fixed = fwd = bwd_last = bwd_other = 0.0
    volume = 0.0
    if strategy == "DDP":
        t = [fabric.group("all_reduce", b, world, N) for b in buckets(m.params * gb)]
        fixed, bwd_last = (t[-1], sum(t[:-1])) if t else (0.0, 0.0)
        volume = bus_factor("all_reduce", world) * m.params * gb if world > 1 else 0.0
    elif shard > 1 or rep > 1:
        f_ag = bus_factor("all_gather", shard) if shard > 1 else 0.0
        blocks_ag = sum(in_group("all_gather", p * bp) for p in m.block_params)
        blocks_rs = sum(in_group("reduce_scatter", p * gb) for p in m.block_params)
        root_ag = in_group("all_gather", m.root_params * bp)
        root_rs = in_group("reduce_scatter", m.root_params * gb)
        if rep > 1:  # HYBRID_SHARD's replicas: each unit's gradient shard, all_reduced
            blocks_rs += sum(across(p * gb / shard) for p in m.block_params)
            root_rs += across(m.root_params * gb / shard)
            volume += bus_factor("all_reduce", rep) * m.params * gb / shard
        fixed = A * root_ag + root_rs
        fwd = A * blocks_ag
        regather = strategy != "SHARD_GRAD_OP"  # SHARD_GRAD_OP keeps the units gathered
        bwd_other = (A - 1) * blocks_ag if regather else 0.0
        bwd_last = (blocks_ag if regather else 0.0) + blocks_rs
        block_total = sum(m.block_params)
        gathered = A * (m.params + (block_total if regather else 0))
        scattered = bus_factor("reduce_scatter", shard) * m.params * gb if shard > 1 else 0.0
        volume += f_ag * gathered * bp + scattered
    exposed = (
        fixed
        + max(0.0, fwd - overlap * A * compute.fwd_s)
        + max(0.0, bwd_other - overlap * (A - 1) * compute.bwd_s)
        + max(0.0, bwd_last - overlap * compute.bwd_s)
    )
    comm = fixed + fwd + bwd_other + bwd_last
    comp = A * (compute.fwd_s + compute.bwd_s) + compute.opt_s / shard
    step = comp + exposed
    samples = compute.samples * A * world / step
    tokens = samples * m.tokens_per_sample if m.tokens_per_sample else None
    parts = {"fixed_s": fixed, "fwd_s": fwd, "bwd_s": bwd_other + bwd_last}
    return Prediction(
        strategy, world, shard, volume, comp, comm, exposed, step, samples, tokens, parts=parts
    )

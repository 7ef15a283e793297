"""The planner's arithmetic: per-rank state and buffers of each strategy (ZeRO accounting).

Pure functions of counts and shapes (no torch, no CLI): ddpkit.tools.planner.cli renders what
make_plan returns, ddpkit.tools.planner.recommend puts it beside each strategy's predicted step.
See ddpkit.tools.planner.cli's docstring for the accounting.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ddpkit.tools.planner.model import OPTIM_BYTES, PlanError, RankState, shard_rows
from ddpkit.train.preflight import replicate_problem

GB = 1e9  # the article quotes decimal GB (7e9 * 16 B = 112 GB)
STRATEGIES = ("DDP", "NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")
ZERO_STAGE = {
    "DDP": "0",
    "NO_SHARD": "0",
    "SHARD_GRAD_OP": "2",
    "FULL_SHARD": "3",
    "HYBRID_SHARD": "3 in group",
}
HALF_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass
class StrategyPlan:
    strategy: str
    zero_stage: str
    shard_size: int  # GPUs one copy of the state is split over
    per_rank: list[RankState]
    held_bytes: int  # kept for a whole step: SHARD_GRAD_OP's unsharded params, DDP's buckets
    held_what: str
    transient_bytes: int | None  # estimate: all-gathered units in flight (None: unknown)
    activation_bytes: int | None  # estimate (None: no model given)

    @property
    def state_bytes(self) -> int:  # the largest rank: the one that runs out first
        return max(r.total for r in self.per_rank)

    @property
    def peak_estimate(self) -> int:
        return (
            self.state_bytes
            + self.held_bytes
            + (self.transient_bytes or 0)
            + (self.activation_bytes or 0)
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_rank"] = [r.as_dict() for r in self.per_rank]
        d["state_bytes"] = self.state_bytes
        d["peak_bytes_estimate"] = self.peak_estimate
        return d


@dataclass
class Plan:
    num_params: int
    gpus: int
    nodes: int
    replicate_degree: int
    dtype: str
    optimizer: str
    strategies: list[StrategyPlan] = field(default_factory=list)
    model: str | None = None
    batch_size: int | None = None
    gpu_mem_bytes: int | None = None


def parse_count(text: str) -> int:
    """'7e9', '7B', '1.3b', '125M', '350k' -> an integer parameter count."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbt]?)\s*", text, re.IGNORECASE)
    if not m:
        raise PlanError(f"--params {text!r} is not a count; write e.g. 7e9, 7B, 125M")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]
    value = int(round(float(m.group(1)) * scale))
    if value < 1:
        raise PlanError(f"--params {text!r} must be at least 1 parameter")
    return value


def shard_numel(shape: tuple[int, ...], shard_size: int, index: int) -> int:
    if shard_size == 1 or not shape:
        return math.prod(shape)
    return shard_rows(shape[0], shard_size, index) * math.prod(shape[1:])


def group_layout(strategy: str, gpus: int, replicate: int) -> tuple[int, list[int]]:
    """(shard size, shard index of each rank). HYBRID_SHARD is a (replicate, shard) mesh in
    row-major order, so rank r holds shard r % shard_size."""
    if strategy in ("DDP", "NO_SHARD"):
        return 1, [0] * gpus
    shard = gpus // replicate if strategy == "HYBRID_SHARD" else gpus
    return shard, [r % shard for r in range(gpus)]


def rank_states(
    shapes: list[tuple[int, ...]] | None, num_params: int, shard: int, index: list[int], optim: int
) -> list[RankState]:
    """fp32 state per rank. With shapes, the exact FSDP2 dim-0 split (and Adam's 4-byte step
    counter per tensor); with a bare count, an even split."""
    out = []
    for i in index:
        if shapes is None:
            n = num_params / shard
            out.append(RankState(int(4 * n), int(4 * n), int(optim * n)))
            continue
        n = sum(shard_numel(s, shard, i) for s in shapes)
        steps = 4 * len(shapes) if optim == 8 else 0
        out.append(RankState(4 * n, 4 * n, optim * n + steps))
    return out


def make_plan(
    num_params: int,
    gpus: int,
    nodes: int = 1,
    replicate_degree: int | None = None,
    dtype: str = "fp32",
    optimizer: str = "adamw",
    shapes: list[tuple[int, ...]] | None = None,
    unit_params: int | None = None,
    root_params: int = 0,
    activation_bytes: int | None = None,
    strategies: tuple[str, ...] = STRATEGIES,
) -> Plan:
    """The memory plan for every strategy. `unit_params`: the largest FSDP unit (for the
    transient all-gather estimate); `root_params`: parameters no block owns (the root
    unit stays unsharded from forward to backward); `activation_bytes`: per GPU, already estimated."""
    if gpus < 1 or nodes < 1:
        raise PlanError(f"--gpus {gpus} and --nodes {nodes} must be >= 1")
    if gpus % nodes:
        raise PlanError(
            f"--gpus {gpus} is not a multiple of --nodes {nodes}: gpus is the total over all "
            "nodes; pass nodes * gpus-per-node"
        )
    replicate = replicate_degree or nodes
    problem = replicate_problem(gpus, replicate)
    if problem:
        raise PlanError(problem)
    if dtype not in HALF_BYTES:
        raise PlanError(f"--dtype {dtype}: pick one of {', '.join(HALF_BYTES)}")
    if optimizer not in OPTIM_BYTES:
        raise PlanError(f"--optimizer {optimizer}: pick one of {', '.join(OPTIM_BYTES)}")
    if shapes is not None:
        num_params = sum(math.prod(s) for s in shapes)
    compute = HALF_BYTES[dtype]
    plan = Plan(num_params, gpus, nodes, replicate, dtype, optimizer)
    for name in strategies:
        shard, index = group_layout(name, gpus, replicate)
        per_rank = rank_states(shapes, num_params, shard, index, OPTIM_BYTES[optimizer])
        if name == "DDP":
            # DDP copies gradients into its all-reduce buckets (gradient_as_bucket_view=False).
            held, what = 4 * num_params if gpus > 1 else 0, "DDP gradient buckets"
            transient = 0
        else:
            held, what = 0, ""
            if root_params and shard > 1:
                held, what = compute * root_params, "root unit unsharded fwd->bwd"
            if name == "SHARD_GRAD_OP":
                # reshard_after_forward=False: every unit stays unsharded from forward to backward
                held, what = compute * num_params if shard > 1 else 0, "unsharded params fwd->bwd"
            # In flight: the unit being computed plus the prefetched next one, and one unit's
            # unsharded gradients before the reduce-scatter.
            transient = 3 * compute * unit_params if unit_params and shard > 1 else None
            if shard == 1:
                transient = 0
        plan.strategies.append(
            StrategyPlan(
                name, ZERO_STAGE[name], shard, per_rank, held, what, transient, activation_bytes
            )
        )
    return plan

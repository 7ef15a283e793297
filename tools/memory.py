"""Per-GPU memory plan for DDP and each FSDP sharding strategy (ZeRO accounting).

    python -m ddpkit.tools.memory --params 7e9 --gpus 8 [--nodes 1] [--dtype fp32|bf16|fp16]
                           [--optimizer adamw|adam|sgd] [--gpu-mem 80] [--json]
    python -m ddpkit.tools.memory --model gpt --n-layer 12 --d-model 768 --gpus 8 [--batch-size 16]
    python -m ddpkit.tools.memory --config configs/gpt.toml --gpus 8
    ddpkit memory --config job.toml --gpus 1024 --nodes 128 --strategy FULL_SHARD --dry-run [--json]

--dry-run builds the job's model on the meta device, parallelizes it with the kit's own
`parallelize` over a fake process group at --gpus ranks, and reports the state measured from
the sharded tensors (ddpkit.tools.memory_dryrun); it refuses what the cluster would refuse.

State bytes follow the ZeRO paper's table (the article's section 3.1): with Psi parameters and
N GPUs in a shard group, DDP keeps 16*Psi bytes on every GPU and FULL_SHARD 16*Psi/N. The
16 bytes are how ddpkit trains: fp32 params (4) + fp32 grads (4) + AdamW's two fp32 moments
(8). With --dtype bf16/fp16 the trainer keeps the sharded params, grads and optimizer state in
fp32 (FSDP2 MixedPrecisionPolicy, autocast under DDP); only the unsharded half-precision copies
are new, and they are transient. The ZeRO paper's own 2+2+12 split gives the same 16 bytes.

"state" is what stays allocated between steps: it is what `python -m ddpkit.train` measures as
`state_bytes_per_rank` in summary.json. Buffers that live only during a step and activations
are estimates and printed as such.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from ddpkit.tools.memory_model import (
    MODEL_FLAGS,
    OPTIM_BYTES,
    PlanError,
    RankState,
    describe_model,
    shard_rows,
)
from ddpkit.train.errors import CliParser, run_cli

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
    if gpus % replicate:
        raise PlanError(
            f"HYBRID_SHARD: gpus({gpus}) % replicate({replicate}) != 0; pick a --replicate-degree "
            "that divides --gpus"
        )
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


# --- output -------------------------------------------------------------------------------


def human_count(n: int) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def fmt(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / GB:.2f} GB" if n >= 0.01 * GB else f"{n / 1e6:.2f} MB"


def render(plan: Plan) -> str:
    ob = OPTIM_BYTES[plan.optimizer]
    what = plan.model or "model"
    lines = [
        f"Memory plan: {what} with {plan.num_params:,} parameters ({human_count(plan.num_params)}), "
        f"{plan.gpus} GPU(s) on {plan.nodes} node(s), {plan.optimizer}, dtype {plan.dtype}",
        f"state per parameter: 4 B fp32 param + 4 B fp32 grad + {ob} B optimizer = {8 + ob} B"
        + (" (half-precision copies are transient)" if plan.dtype != "fp32" else ""),
        "",
    ]
    head = ["strategy", "ZeRO", "shard", "params", "grads", "optim", "state/GPU", "peak* (est.)"]
    if plan.gpu_mem_bytes:
        head.append(f"fits {fmt(plan.gpu_mem_bytes)}")
    rows = [head]
    for s in plan.strategies:
        top = max(s.per_rank, key=lambda r: r.total)
        row = [s.strategy, s.zero_stage, str(s.shard_size), fmt(top.params), fmt(top.grads)]
        row += [fmt(top.optim), fmt(s.state_bytes), fmt(s.peak_estimate)]
        if plan.gpu_mem_bytes:
            row.append("yes" if s.peak_estimate <= plan.gpu_mem_bytes else "NO")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("")
    lines.append("* peak (estimate) = state + held buffers + in-flight all-gathers + activations:")
    for s in plan.strategies:
        parts = []
        if s.held_bytes:
            parts.append(f"{s.held_what} {fmt(s.held_bytes)}")
        if s.transient_bytes is None:
            parts.append("in-flight all-gathers n/a (largest FSDP unit unknown: use --model)")
        elif s.transient_bytes:
            parts.append(f"in-flight all-gathers ~{fmt(s.transient_bytes)}")
        if s.activation_bytes is not None:
            parts.append(f"activations ~{fmt(s.activation_bytes)} (estimate)")
        lines.append(f"  {s.strategy}: " + ("; ".join(parts) if parts else "state only"))
    if plan.strategies and plan.strategies[0].activation_bytes is None:
        lines.append(
            "  activations: not estimated (they scale with batch and sequence length; "
            "pass --model ... --batch-size B for an estimate)"
        )
    elif plan.batch_size:
        lines.append(f"  activations estimated for --batch-size {plan.batch_size} per GPU")
    return "\n".join(lines)


def to_json(plan: Plan) -> dict[str, Any]:
    d = asdict(plan)
    d["strategies"] = [s.as_dict() for s in plan.strategies]
    d["bytes_per_param"] = {"params": 4, "grads": 4, "optim": OPTIM_BYTES[plan.optimizer]}
    d["estimates"] = ["held_bytes", "transient_bytes", "activation_bytes", "peak_bytes_estimate"]
    return d


# --- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = CliParser(
        prog="python -m ddpkit.tools.memory",
        description="Per-GPU memory under DDP, SHARD_GRAD_OP, FULL_SHARD and HYBRID_SHARD.",
        epilog="Example: python -m ddpkit.tools.memory --params 7e9 --gpus 8 --gpu-mem 80",
    )
    src = p.add_argument_group("what to plan (one of)")
    src.add_argument("--params", help="parameter count: 7e9, 7B, 125M")
    src.add_argument("--model", help="mlp, mlp-deep, resnet18, gpt, pkg.module:factory, hf:PATH")
    src.add_argument("--config", help="a job/training TOML file (its [train] model settings)")
    p.add_argument("--gpus", type=int, default=1, help="total GPUs (ranks), all nodes")
    p.add_argument("--nodes", type=int, default=1, help="nodes (HYBRID_SHARD replicates across)")
    p.add_argument("--replicate-degree", type=int, help="HYBRID_SHARD replicas (default: nodes)")
    p.add_argument("--dtype", choices=list(HALF_BYTES), help="mixed precision (default fp32)")
    p.add_argument("--optimizer", choices=list(OPTIM_BYTES), help="default adamw")
    p.add_argument("--strategy", action="append", choices=STRATEGIES, help="only these")
    p.add_argument("--gpu-mem", type=float, help="GPU memory in GB: say which plans fit")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="build the model on meta, parallelize it at --gpus ranks over a fake process "
        "group and measure the shards (needs --config or --model)",
    )
    m = p.add_argument_group("model flags (with --model or --config; as in python -m ddpkit.train)")
    for key in MODEL_FLAGS:
        m.add_argument(f"--{key.replace('_', '-')}", type=int)
    m.add_argument("--dataset", help="shapes the input (mnist, cifar10, imagefolder, ...)")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_cli(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if sum(x is not None for x in (args.params, args.model, args.config)) != 1:
        raise PlanError("pass exactly one of --params N, --model NAME or --config FILE")
    if args.dry_run:
        return _dry_run_main(args)
    dtype, optimizer = args.dtype or "fp32", args.optimizer or "adamw"
    kwargs: dict[str, Any] = {}
    batch, label = None, None
    if args.params is not None:
        kwargs["num_params"] = parse_count(args.params)
    else:
        desc = describe_model(args)
        dtype = args.dtype or desc.dtype
        optimizer = args.optimizer or desc.optimizer
        batch = desc.batch_size
        label = desc.name + (f" ({args.config})" if args.config else "")
        kwargs.update(
            num_params=desc.num_params,
            shapes=desc.shapes,
            unit_params=desc.unit_params,
            root_params=desc.root_params,
            activation_bytes=desc.activation_bytes(dtype),
        )
    plan = make_plan(
        gpus=args.gpus,
        nodes=args.nodes,
        replicate_degree=args.replicate_degree,
        dtype=dtype,
        optimizer=optimizer,
        strategies=tuple(args.strategy or STRATEGIES),
        **kwargs,
    )
    plan.model = label
    plan.batch_size = batch
    plan.gpu_mem_bytes = int(args.gpu_mem * GB) if args.gpu_mem else None
    print(json.dumps(to_json(plan), indent=2) if args.json else render(plan))
    return 0


def _dry_run_main(args: argparse.Namespace) -> int:
    from ddpkit.tools import memory_dryrun

    if args.params is not None:
        raise PlanError(
            "--dry-run builds the model: pass --config FILE or --model NAME, not --params"
        )
    desc = describe_model(args)
    cfg = desc.cfg
    if args.replicate_degree is not None:
        cfg.replicate_degree = args.replicate_degree
    if args.optimizer:
        cfg.optimizer = args.optimizer
    dtype = args.dtype or desc.dtype
    own = "DDP" if cfg.parallel == "ddp" else (cfg.sharding or "FULL_SHARD")
    strategies = tuple(args.strategy or (own,))
    runs = [memory_dryrun.dry_run(cfg, args.gpus, args.nodes, s) for s in strategies]
    plan = make_plan(
        gpus=args.gpus,
        nodes=args.nodes,
        replicate_degree=cfg.replicate_degree,
        dtype=dtype,
        optimizer=cfg.optimizer,
        strategies=strategies,
        num_params=desc.num_params,
        shapes=desc.shapes,
        unit_params=desc.unit_params,
        root_params=desc.root_params,
        activation_bytes=desc.activation_bytes(dtype),
    )
    gpu_mem = int(args.gpu_mem * GB) if args.gpu_mem else None
    out = dry_run_report(runs, plan, gpu_mem)
    out["model"] = desc.name + (f" ({args.config})" if args.config else "")
    print(json.dumps(out, indent=2) if args.json else render_dry_run(out))
    return 0


def dry_run_report(runs: list[Any], plan: Plan, gpu_mem: int | None) -> dict[str, Any]:
    """Measured state per rank beside the ZeRO table, and the peak estimate on top of it:
    held buffers, in-flight all-gathers and activations are the planner's estimates."""
    from ddpkit.tools.memory_dryrun import zero_state_bytes

    rows = []
    for run, est in zip(runs, plan.strategies, strict=True):
        d = run.as_dict()
        state = d["per_rank"]["measured_state_bytes"]
        zero = zero_state_bytes(
            run.strategy, run.params, run.world, run.mesh.get("shard", 1), plan.optimizer
        )
        extra = est.held_bytes + (est.transient_bytes or 0)
        total = state + extra + (est.activation_bytes or 0)
        d["per_rank"].update(
            zero_table_state_bytes=int(zero),
            held_bytes=est.held_bytes,
            transient_bytes=est.transient_bytes,
            activation_bytes=est.activation_bytes,
            total_bytes=total,
            fits=None if gpu_mem is None else total <= gpu_mem,
        )
        rows.append(d)
    return {
        "params": plan.num_params,
        "gpus": plan.gpus,
        "nodes": plan.nodes,
        "dtype": plan.dtype,
        "optimizer": plan.optimizer,
        "batch_size": plan.batch_size,
        "gpu_mem_bytes": gpu_mem,
        "strategies": rows,
        "measured": ["params", "grads", "optim", "measured_state_bytes"],
        "estimates": ["held_bytes", "transient_bytes", "activation_bytes", "total_bytes"],
    }


def render_dry_run(out: dict[str, Any]) -> str:
    lines = [
        f"Dry run: {out['model']} with {out['params']:,} parameters "
        f"({human_count(out['params'])}), {out['gpus']} rank(s) on {out['nodes']} node(s), "
        f"{out['optimizer']}, dtype {out['dtype']}; parallelized over a fake process group",
        "",
    ]
    head = ["strategy", "mesh", "params", "grads", "optim", "state (measured)", "ZeRO table"]
    head += ["peak* (est.)"] + (
        [f"fits {fmt(out['gpu_mem_bytes'])}"] if out["gpu_mem_bytes"] else []
    )
    rows = [head]
    for s in out["strategies"]:
        r = s["per_rank"]
        mesh = " x ".join(f"{k} {v}" for k, v in s["mesh"].items()) or "replicas"
        row = [s["strategy"], mesh, fmt(r["params"]), fmt(r["grads"]), fmt(r["optim"])]
        row += [fmt(r["measured_state_bytes"]), fmt(r["zero_table_state_bytes"])]
        row.append(fmt(r["total_bytes"]))
        if out["gpu_mem_bytes"]:
            row.append("yes" if r["fits"] else "NO")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [
        "",
        "per rank: rank 0, which holds the largest shard of every parameter (torch.chunk split)",
        "* peak (estimate) = measured state + held buffers + in-flight all-gathers + activations"
        + (f" at --batch-size {out['batch_size']}" if out["batch_size"] else ""),
    ]
    if any(s["strategy"] == "SHARD_GRAD_OP" for s in out["strategies"]):
        lines.append(
            "SHARD_GRAD_OP: the ZeRO-2 row counts the parameters as replicated; FSDP2 reshards "
            "them after backward, so they are held forward->backward (in the peak), not state"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

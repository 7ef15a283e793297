"""Per-GPU memory plan for DDP and each FSDP sharding strategy (ZeRO accounting).

    ddpkit memory --params 7e9 --gpus 8 [--nodes 1] [--dtype fp32|bf16|fp16]
                [--optimizer adamw|adam|sgd] [--gpu-mem 80] [--json]
    ddpkit memory --model gpt --n-layer 12 --d-model 768 --gpus 8 [--batch-size 16]
    ddpkit memory --config configs/gpt.toml --gpus 8
    ddpkit memory --config ddpkit.toml --model models:build [--model-args '{"hidden": 64}'] \
                  --gpus 8 --dry-run        (a job that runs your own script: name its model)
    ddpkit memory --config job.toml --gpus 1024 --nodes 128 --strategy FULL_SHARD --dry-run [--json]
    ddpkit memory --config job.toml --gpus 512 --nodes 64 --step-time --inter ib400 \
                  --mfu 0.4 --peak-tflops 989 --gpu-mem 80 [--json]

--dry-run builds the job's model on the meta device, parallelizes it with the kit's own
`parallelize` over a fake process group at --gpus ranks, and reports the state measured from
the sharded tensors (ddpkit.tools.planner.dryrun); it refuses the world the cluster would
refuse, and warns of data smaller than one global batch (a memory plan does not depend on it).
--step-time predicts each strategy's step time from an alpha-beta model of the collectives (a
preset interconnect or a commbench.json) and the compute of one step (measured here, or peak
x MFU), next to this memory plan, and recommends one
(ddpkit.tools.planner.steptime).

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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ddpkit.tools.planner.memory import (
    GB,
    HALF_BYTES,
    STRATEGIES,
    Plan,
    make_plan,
    parse_count,
)
from ddpkit.tools.planner.model import (
    MODEL_FLAGS,
    OPTIM_BYTES,
    PlanError,
    describe_model,
)
from ddpkit.train.dataclass_fields import json_table
from ddpkit.train.errors import CliParser, run_cli

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
        prog="ddpkit memory",
        description="Per-GPU memory under DDP, SHARD_GRAD_OP, FULL_SHARD and HYBRID_SHARD.",
        epilog="Example: ddpkit memory --params 7e9 --gpus 8 --gpu-mem 80",
    )
    src = p.add_argument_group("what to plan: --params, or --model and/or --config")
    src.add_argument("--params", help="parameter count: 7e9, 7B, 125M")
    src.add_argument(
        "--model",
        help="mlp, mlp-deep, resnet18, gpt, pkg.module:factory, hf:PATH (with --config: the "
        "model of that job, e.g. the one your own script builds)",
    )
    src.add_argument("--config", help="a job/training TOML file (its [train] model settings)")
    src.add_argument(
        "--model-args",
        type=json_table,
        help="keywords for your factory, a JSON object: '{\"hidden\": 64}' (as ddpkit train "
        "takes them; a job file's [train.model_args] too)",
    )
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
    st = p.add_argument_group(
        "step time per strategy (--step-time; see ddpkit.tools.planner for the model)"
    )
    st.add_argument(
        "--step-time",
        action="store_true",
        help="predict the step of DDP, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD and recommend one",
    )
    st.add_argument("--intra", default="nvlink", help="intra-node: nvlink or a commbench.json")
    st.add_argument(
        "--inter", default="ib400", help="inter-node: ib400, eth100, nvlink or a commbench.json"
    )
    st.add_argument("--nics", type=int, help="network ports per node (default: one per GPU)")
    st.add_argument("--mfu", type=float, help="compute at this fraction of --peak-tflops")
    st.add_argument("--peak-tflops", type=float, help="the GPU's dense peak (H100 bf16: 989)")
    st.add_argument(
        "--compute-s",
        type=float,
        help="fwd+bwd seconds of one micro-batch (default: measured here)",
    )
    st.add_argument(
        "--overlap", type=float, default=1.0, help="share of compute that hides comm (0..1)"
    )
    m = p.add_argument_group("model flags (with --model or --config; as in ddpkit train)")
    for key in MODEL_FLAGS:
        m.add_argument(f"--{key.replace('_', '-')}", type=int)
    m.add_argument("--dataset", help="shapes the input (mnist, cifar10, imagefolder, ...)")
    m.add_argument(
        "--input-shape",
        help="one sample's input for your own model, C,H,W (default: the dataset's shape)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    return run_cli(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    from ddpkit.tools.jobspec.load import in_workspace
    from ddpkit.train import registry

    args = build_parser().parse_args(argv)
    args.config_shown = args.config  # as the user wrote it, for the report's header
    for key in ("config", "intra", "inter"):  # files named from here, read in the workspace
        value = getattr(args, key)
        if value and Path(value).is_file():
            setattr(args, key, str(Path(value).resolve()))
    job = read_job(args.config)
    held = dict(registry.OBJECTS)  # a factory adapted for this plan (model.adapt_factory)
    try:
        with in_workspace(workspace(args.config, job)):
            return _plan(args, job)
    finally:
        registry.OBJECTS.clear()
        registry.OBJECTS.update(held)


def read_job(config: str | None) -> dict[str, Any]:
    """The job file's table, {} without one (or one that does not parse: load_cfg says what is
    wrong with it, in one line)."""
    import tomllib

    if not config:
        return {}
    try:
        return tomllib.loads(Path(config).read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return {}


def workspace(config: str | None, job: dict[str, Any]) -> Path:
    """The job's workspace, the launcher's rule (the job file's directory or its `workspace`
    key; without a job file, here): the user's `--model pkg.mod:factory` imports from it."""
    from ddpkit.tools.jobspec.load import resolve_workspace

    return resolve_workspace(config, job) if config and Path(config).is_file() else Path.cwd()


def own_entry(job: dict[str, Any]) -> str | None:
    """`script train.py` or `module pkg.train` when the job runs the user's own entry point
    (the launcher's `script`/`module` keys), else None: the kit's trainer."""
    for key in ("script", "module"):
        if isinstance(job.get(key), str):
            return f"{key} {job[key]}"
    return None


def check_source(args: argparse.Namespace, job: dict[str, Any]) -> None:
    """What to plan: --params alone, or a model (--model, --config, or --config's job with
    --model naming its model). A job that runs the user's own script builds its model out of
    the planner's sight: without a model named, it is refused rather than planned as the
    trainer's default MLP."""
    if args.params is not None and (args.model or args.config):
        raise PlanError("pass --params N alone, or a model: --model NAME and/or --config FILE")
    if args.params is None and not (args.model or args.config):
        raise PlanError("pass exactly one of --params N, --model NAME or --config FILE")
    entry = own_entry(job)
    train = job.get("train") if isinstance(job.get("train"), dict) else {}
    if entry and not args.model and "model" not in train:
        raise PlanError(
            f"{args.config_shown} runs your {entry}: the planner cannot see the model it "
            "builds; name the function that returns it with --model pkg.module:factory, e.g. "
            "--model models:build (imported from the workspace; its keywords with "
            "--model-args JSON), or plan by size with --params N"
        )


def _plan(args: argparse.Namespace, job: dict[str, Any]) -> int:
    check_source(args, job)
    if args.step_time:
        from ddpkit.tools.planner import steptime

        return steptime.run(args)
    if args.dry_run:
        return _dry_run_main(args)
    from ddpkit.tools.planner import dryrun

    dtype, optimizer = args.dtype or "fp32", args.optimizer or "adamw"
    kwargs: dict[str, Any] = {}
    batch, label = None, None
    if args.params is not None:
        kwargs["num_params"] = parse_count(args.params)
    else:
        desc = describe_model(args)
        dryrun.warn_short_data(desc.cfg, args.gpus)
        dtype = args.dtype or desc.dtype
        optimizer = args.optimizer or desc.optimizer
        batch = desc.batch_size
        label = desc.name + (f" ({args.config_shown})" if args.config else "")
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
    from ddpkit.tools.planner import dryrun

    if args.params is not None:
        raise PlanError(
            "--dry-run builds the model: pass --config FILE or --model NAME, not --params"
        )
    desc = describe_model(args)
    cfg = desc.cfg
    dryrun.warn_short_data(cfg, args.gpus)
    if args.replicate_degree is not None:
        cfg.replicate_degree = args.replicate_degree
    if args.optimizer:
        cfg.optimizer = args.optimizer
    dtype = args.dtype or desc.dtype
    own = "DDP" if cfg.parallel == "ddp" else (cfg.sharding or "FULL_SHARD")
    strategies = tuple(args.strategy or (own,))
    runs = [dryrun.dry_run(cfg, args.gpus, args.nodes, s) for s in strategies]
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
    out["model"] = desc.name + (f" ({args.config_shown})" if args.config else "")
    print(json.dumps(out, indent=2) if args.json else render_dry_run(out))
    return 0


def dry_run_report(runs: list[Any], plan: Plan, gpu_mem: int | None) -> dict[str, Any]:
    """Measured state per rank beside the ZeRO table, and the peak estimate on top of it:
    held buffers, in-flight all-gathers and activations are the planner's estimates."""
    from ddpkit.tools.planner.dryrun import zero_state_bytes

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

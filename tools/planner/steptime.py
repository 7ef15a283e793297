"""Step time per strategy: the article's "which strategy" table, made quantitative.

    ddpkit memory --config job.toml --gpus 512 --nodes 64 --step-time \
        [--intra nvlink|commbench.json] [--inter ib400|eth100|nvlink|commbench.json] [--nics N]
        [--mfu 0.4 --peak-tflops 989 | --compute-s S | (default) measure one step here]
        [--overlap 1.0] [--gpu-mem 80] [--json]

The model is links, predict, job and recommend (the package's docstring maps them); this
module runs it for `ddpkit memory --step-time` and prints the table.
"""

from __future__ import annotations

import json
from typing import Any

from ddpkit.tools.planner.job import compute_from_flops, compute_given, measure_compute
from ddpkit.tools.planner.links import load_link
from ddpkit.tools.planner.model import PlanError
from ddpkit.tools.planner.predict import STRATEGIES
from ddpkit.tools.planner.recommend import check_inputs, check_mfu, gb, ms, plan


def render(out: dict[str, Any]) -> str:
    per = "tokens/s" if out["tokens_per_sample"] else "samples/s"
    micro = f"batch {out['batch_size']}" + (
        f" x seq {out['tokens_per_sample']}" if out["tokens_per_sample"] else ""
    )
    c = out["compute"]
    lines = [
        f"Step time: {out['model']} with {out['params']:,} parameters, {out['gpus']} GPU(s) = "
        f"{out['nodes']} node(s) x {out['gpus_per_node']}, {out['dtype']}, {micro} per GPU"
        + (f", grad-accum {out['grad_accum']}" if out["grad_accum"] > 1 else ""),
        f"  intra-node: {out['links']['intra']['source']}",
        f"  inter-node: {out['links']['inter']['source']}",
        f"  compute per micro-batch: fwd {ms(c['fwd_s'])} + bwd {ms(c['bwd_s'])}"
        + (f" + optimizer {ms(c['opt_s'])} (whole model)" if c["opt_s"] else "")
        + f" ({c['source']})",
        "",
    ]
    mem_head = f"fits {out['gpu_mem_bytes'] / 1e9:g} GB" if out["gpu_mem_bytes"] else "fits"
    rows = [["strategy", "memory/rank*", mem_head, "compute", "comm", "exposed", "step", per]]
    for p in out["strategies"]:
        fits = {None: "-", True: "yes", False: "NO"}[p["fits"]]
        rate = p["tokens_per_s"] if out["tokens_per_sample"] else p["samples_per_s"]
        rows.append(
            [p["strategy"], gb(p["memory_bytes"]), fits, ms(p["compute_s"]), ms(p["comm_s"])]
            + [ms(p["exposed_s"]), ms(p["step_s"]), f"{rate:,.0f}"]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [
        "",
        f"recommended: {out['why']}.",
        "* memory: the planner's peak estimate (state + held buffers + in-flight all-gathers + "
        "activations); comm: every collective of the step; exposed: what compute does not hide "
        f"(overlap {out['overlap']:g} of each phase's compute; see `ddpkit memory --help`)",
    ]
    return "\n".join(lines)


def run(args: Any) -> int:
    """`ddpkit memory --step-time ...` (the flags are ddpkit.tools.planner.cli's)."""
    from ddpkit.tools.planner.dryrun import warn_short_data
    from ddpkit.tools.planner.model import load_cfg

    if args.params is not None or args.dry_run:
        raise PlanError(
            "--step-time builds the model: pass --config FILE or --model NAME (not --params), "
            "without --dry-run"
        )
    wanted = tuple(args.strategy or STRATEGIES)
    bad = [s for s in wanted if s not in STRATEGIES]
    if bad:
        raise PlanError(f"--step-time models {', '.join(STRATEGIES)}; not {', '.join(bad)}")
    check_inputs(args.gpus, args.nodes, args.overlap)
    if args.mfu is not None and args.compute_s is not None:
        raise PlanError("pass one of --mfu (with --peak-tflops) or --compute-s, not both")
    if args.compute_s is not None and not args.compute_s > 0:
        raise PlanError(f"--compute-s {args.compute_s:g} must be > 0 seconds")
    if args.nics is not None and args.nics < 1:
        raise PlanError(f"--nics {args.nics} must be >= 1 (network ports per node)")
    cfg = load_cfg(args)
    warn_short_data(cfg, args.gpus)
    if args.replicate_degree is not None:
        cfg.replicate_degree = args.replicate_degree
    if args.optimizer:
        cfg.optimizer = args.optimizer
    if args.dtype:
        cfg.mixed_precision = "none" if args.dtype == "fp32" else args.dtype
    gpn = args.gpus // args.nodes
    intra = load_link(args.intra)
    inter = load_link(args.inter, ports=args.nics or gpn)
    if args.mfu is not None:
        check_mfu(args.mfu)
        peak = args.peak_tflops or cfg.peak_tflops
        if not peak or peak <= 0:
            raise PlanError(
                "--mfu needs --peak-tflops X (the GPU's dense peak, e.g. 989 for H100 bf16)"
            )
        compute = compute_from_flops(cfg, peak, args.mfu)
    elif args.compute_s is not None:
        compute = compute_given(cfg, args.compute_s)
    else:
        compute = measure_compute(cfg)
    gpu_mem = int(args.gpu_mem * 1e9) if args.gpu_mem else None
    out = plan(cfg, args.gpus, args.nodes, intra, inter, compute, gpu_mem, args.overlap, wanted)
    if args.config:
        out["model"] += f" ({getattr(args, 'config_shown', args.config)})"
    print(json.dumps(out, indent=2) if args.json else render(out))
    return 0

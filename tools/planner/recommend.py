"""The step-time plan: every strategy's predicted step beside the memory planner's estimate
(ddpkit.tools.planner.memory.make_plan: state + held buffers + in-flight all-gathers +
activations), and the recommendation: the fastest strategy that fits; within 5%
of it, the first of DDP, HYBRID_SHARD, SHARD_GRAD_OP, FULL_SHARD (less communication, so less
to lose where the model is wrong).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from ddpkit.tools.planner.job import model_comm
from ddpkit.tools.planner.links import Fabric, Link
from ddpkit.tools.planner.model import PlanError
from ddpkit.tools.planner.predict import STRATEGIES, Compute, Prediction, predict

PREFERENCE = ("DDP", "HYBRID_SHARD", "SHARD_GRAD_OP", "FULL_SHARD")  # less communication first
TIE = 0.05  # within 5% of the fastest, prefer the strategy that communicates less


def recommend(preds: list[Prediction], gpu_mem: int | None) -> tuple[str | None, str]:
    """The fastest strategy that fits; within TIE of it, the one earliest in PREFERENCE."""
    fit = [p for p in preds if p.fits is not False]
    mem = f" of {gpu_mem / 1e9:.0f} GB" if gpu_mem else ""
    if not fit:
        least = min(preds, key=lambda p: p.memory_bytes or 0)
        return None, (
            f"nothing fits: the smallest, {least.strategy}, needs ~{gb(least.memory_bytes)}"
            f"{mem} per rank; lower --batch-size, use activation checkpointing or more GPUs"
        )
    best = min(fit, key=lambda p: p.step_s)
    pick = min(
        (p for p in fit if p.step_s <= best.step_s * (1 + TIE)),
        key=lambda p: PREFERENCE.index(p.strategy),
    )
    fit_clause = (
        f"fits (~{gb(pick.memory_bytes)}{mem} per rank)"
        if gpu_mem
        else ("memory not checked (no --gpu-mem)")
    )
    why = (
        f"{pick.strategy}: {fit_clause} and exposes {ms(pick.exposed_s)} of "
        f"{ms(pick.comm_s)} communication per {ms(pick.step_s)} step"
    )
    if pick is not best:
        why += f", within {TIE:.0%} of {best.strategy} ({ms(best.step_s)}) while moving less"
    else:
        rest = sorted((p for p in fit if p is not pick), key=lambda p: p.step_s)
        if rest:
            r = rest[0]
            slower = r.step_s / pick.step_s - 1
            why += f"; the next, {r.strategy}, is {slower:.0%} slower (exposes {ms(r.exposed_s)})"
    too_big = [p.strategy for p in preds if p.fits is False]
    if too_big:
        why += f"; {', '.join(too_big)} do{'es' if len(too_big) == 1 else ''} not fit"
    return pick.strategy, why


def gb(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 1e9:.2f} GB"


def ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 10 else f"{s:.3g} s"


def plan(
    cfg: Any,
    gpus: int,
    nodes: int,
    intra: Link,
    inter: Link,
    compute: Compute,
    gpu_mem: int | None = None,
    overlap: float = 1.0,
    strategies: tuple[str, ...] = STRATEGIES,
) -> dict[str, Any]:
    """Every strategy's predicted step and memory for the job `cfg` at `gpus` over `nodes`."""
    from ddpkit.tools.planner.memory import make_plan
    from ddpkit.tools.planner.model import build_meta, saved_activation_bytes

    check_inputs(gpus, nodes, overlap)
    dtype = cfg.mixed_precision if cfg.mixed_precision != "none" else "fp32"
    m = model_comm(cfg, dtype)
    fabric = Fabric(intra, inter, nodes, gpus // nodes)
    replicate = cfg.replicate_degree or nodes
    meta = build_meta(cfg)
    shapes = [tuple(p.shape) for p in meta.parameters()]
    mem = make_plan(
        m.params,
        gpus,
        nodes,
        replicate_degree=replicate,
        dtype=dtype,
        optimizer=cfg.optimizer,
        shapes=shapes,
        unit_params=max([*m.block_params, m.root_params]),
        root_params=m.root_params,
        activation_bytes=saved_activation_bytes(cfg, cfg.batch_size, dtype),
        strategies=strategies,
    )
    preds = []
    for s, mp in zip(strategies, mem.strategies, strict=True):
        p = predict(s, m, fabric, compute, cfg.grad_accum, overlap, replicate)
        p.memory_bytes = mp.peak_estimate
        p.fits = None if gpu_mem is None else mp.peak_estimate <= gpu_mem
        preds.append(p)
    pick, why = recommend(preds, gpu_mem)
    return {
        "model": cfg.model,
        "params": m.params,
        "gpus": gpus,
        "nodes": nodes,
        "gpus_per_node": gpus // nodes,
        "dtype": dtype,
        "batch_size": cfg.batch_size,
        "grad_accum": cfg.grad_accum,
        "tokens_per_sample": m.tokens_per_sample,
        "gpu_mem_bytes": gpu_mem,
        "overlap": overlap,
        "links": {"intra": asdict(intra), "inter": asdict(inter)},
        "compute": asdict(compute),
        "strategies": [p.as_dict() for p in preds],
        "recommended": pick,
        "why": why,
    }


def check_inputs(gpus: int, nodes: int, overlap: float) -> None:
    if nodes < 1 or gpus < 1 or gpus % nodes:
        raise PlanError(
            f"--gpus {gpus} over --nodes {nodes}: both must be >= 1 and gpus a multiple of "
            "nodes (gpus is the total over all nodes)"
        )
    if not 0 <= overlap <= 1:
        raise PlanError(f"--overlap {overlap:g} must be in [0, 1] (1: communication hides fully)")


def check_mfu(mfu: float) -> None:
    if not (0 < mfu <= 1) or math.isnan(mfu):
        raise PlanError(f"--mfu {mfu:g} must be in (0, 1], e.g. 0.4 for 40% of peak")

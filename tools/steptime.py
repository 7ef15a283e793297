"""Step time per strategy: the article's "which strategy" table, made quantitative.

    ddpkit memory --config job.toml --gpus 512 --nodes 64 --step-time \
        [--intra nvlink|commbench.json] [--inter ib400|eth100|nvlink|commbench.json] [--nics N]
        [--mfu 0.4 --peak-tflops 989 | --compute-s S | (default) measure one step here]
        [--overlap 1.0] [--gpu-mem 80] [--json]

Model (alpha-beta, ring collectives, as nccl-tests and NCCL's own tuning model count them):
a collective of S bytes over a ring of n ranks takes

    t = base + steps(n) * hop + S * factor(n) / busbw

with factor 2(n-1)/n and 2(n-1) steps for all_reduce, (n-1)/n and n-1 steps for all_gather and
reduce_scatter (S is the whole buffer: the gathered output, the reduce-scatter input). A ring that
crosses nodes pays the network's hop on its inter-node steps and runs at min(NVLink busbw,
the node's network bandwidth / the groups sharing it). Per strategy, per micro-batch:

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

Memory per rank comes from the planner (ddpkit.tools.memory_plan.make_plan: state + held buffers +
in-flight all-gathers + activations). The recommendation: the fastest strategy that fits; within
5% of it, the first of DDP, HYBRID_SHARD, SHARD_GRAD_OP, FULL_SHARD (less communication, so
less to lose where the model is wrong).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddpkit.tools.commbench import bus_factor
from ddpkit.tools.memory_model import PlanError

OPS = ("all_reduce", "all_gather", "reduce_scatter")
STRATEGIES = ("DDP", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")
PREFERENCE = ("DDP", "HYBRID_SHARD", "SHARD_GRAD_OP", "FULL_SHARD")  # less communication first
TIE = 0.05  # within 5% of the fastest, prefer the strategy that communicates less
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default (25 MiB)
GRAD_BYTES = 4  # gradients are reduced in fp32 (FSDP2 reduce_dtype, DDP under autocast)

# Interconnect presets: the link's own figures, per direction.
#   nvlink: NVLink 4 on H100/H200 SXM, 900 GB/s total (bidirectional) per GPU (NVIDIA H100
#           datasheet) = 450 GB/s each way.
#   ib400:  InfiniBand NDR, 400 Gb/s per port (ConnectX-7, Quantum-2) = 50 GB/s each way.
#   eth100: 100 Gigabit Ethernet (IEEE 802.3) = 12.5 GB/s each way.
# Latency, from NCCL's own tuning model (src/graph/tuning.cc, 2020; ring, Simple protocol):
# 8.4 us per call, 3.4 us per ring step over NVLink, 9.6 us per step over the network.
# These are the links' maxima: a measured bus bandwidth is lower; pass a commbench.json for
# the real figure.
PRESETS: dict[str, tuple[float, float, str]] = {
    "nvlink": (450e9, 3.4e-6, "NVLink 4 (H100/H200 SXM), 450 GB/s per GPU each way"),
    "ib400": (50e9, 9.6e-6, "InfiniBand NDR 400 Gb/s, 50 GB/s per port each way"),
    "eth100": (12.5e9, 9.6e-6, "100 GbE, 12.5 GB/s per port each way"),
}
BASE_LATENCY_S = 8.4e-6


def ring_steps(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "all_reduce" else n - 1


@dataclass(frozen=True)
class Link:
    """One level of the fabric: bus bandwidth (bytes/s) and latency per ring step, per op."""

    name: str
    busbw: dict[str, float]
    hop_s: dict[str, float]
    base_s: float = 0.0
    source: str = ""

    def time(self, op: str, nbytes: float, n: int) -> float:
        """One collective of `nbytes` over a ring of `n` ranks on this link alone."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        return (
            self.base_s
            + ring_steps(op, n) * self.hop_s[op]
            + nbytes * bus_factor(op, n) / self.busbw[op]
        )


def preset(name: str, ports: int = 1) -> Link:
    """A named interconnect; `ports` links in parallel (an inter-node fabric: NICs per node)."""
    if name not in PRESETS:
        raise PlanError(
            f"unknown interconnect {name!r}: pick one of {', '.join(PRESETS)} or give a "
            "commbench.json (ddpkit commbench --out DIR)"
        )
    bw, hop, what = PRESETS[name]
    return Link(
        name,
        {op: bw * ports for op in OPS},
        {op: hop for op in OPS},
        BASE_LATENCY_S,
        f"preset {name}: {what}" + (f" x {ports} ports" if ports > 1 else ""),
    )


def fit_line(sizes: list[float], times: list[float]) -> tuple[float, float]:
    """(a, c) of t = a + c * s by least squares on the relative error (small and large sizes
    weigh alike); a is clamped at 0 (a negative latency is noise)."""
    w = [1 / t**2 for t in times]
    sw = sum(w)
    sx = sum(wi * s for wi, s in zip(w, sizes, strict=True))
    sy = sum(wi * t for wi, t in zip(w, times, strict=True))
    sxx = sum(wi * s * s for wi, s in zip(w, sizes, strict=True))
    sxy = sum(wi * s * t for wi, s, t in zip(w, sizes, times, strict=True))
    det = sw * sxx - sx * sx
    a, c = ((sxx * sy - sx * sxy) / det, (sw * sxy - sx * sy) / det) if det > 0 else (0.0, 0.0)
    if a < 0 or c <= 0:
        a, c = 0.0, sxy / sxx if sxx > 0 else 0.0
    return a, c


def fit_commbench(data: dict[str, Any], name: str = "commbench") -> Link:
    """A Link from `ddpkit commbench --json` output: per op, t = a + c*S at the measured world n
    gives busbw = factor(n)/c and hop = a/steps(n). An op the file lacks takes another's fit."""
    n = int(data.get("world_size") or 0)
    if n < 2:
        raise PlanError(
            f"{name}: measured on {n} rank(s); a bandwidth needs >= 2 (torchrun "
            "--nproc-per-node 2 -m ddpkit.tools.commbench --json)"
        )
    busbw: dict[str, float] = {}
    hop: dict[str, float] = {}
    for op in OPS:
        rows = [r for r in data.get("results", []) if r.get("op") == op and r.get("time_us")]
        if len({r["size_bytes"] for r in rows}) < 2:
            continue
        a, c = fit_line([r["size_bytes"] for r in rows], [r["time_us"] * 1e-6 for r in rows])
        if c > 0:
            busbw[op], hop[op] = bus_factor(op, n) / c, a / ring_steps(op, n)
    if not busbw:
        raise PlanError(
            f"{name}: no all_reduce/all_gather/reduce_scatter with >= 2 sizes to fit; run "
            "commbench with --ops all_reduce,all_gather,reduce_scatter over a size sweep"
        )
    first = next(iter(busbw))
    for op in OPS:
        busbw.setdefault(op, busbw[first])
        hop.setdefault(op, hop[first])
    hosts = len(data.get("hosts") or [None])
    src = f"{name}: fitted from commbench, {n} ranks on {hosts} host(s), {data.get('backend')}"
    return Link(name, busbw, hop, 0.0, src)


def load_link(text: str, ports: int = 1) -> Link:
    """A preset name, or a commbench JSON file (ddpkit commbench --json > f, or --out DIR)."""
    path = Path(text)
    if path.is_dir():
        path = path / "commbench.json"
    if text in PRESETS or path.suffix != ".json":
        return preset(text, ports)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PlanError(f"cannot read commbench JSON {text}: {e}") from None
    return fit_commbench(data, path.name)


@dataclass(frozen=True)
class Fabric:
    """`nodes` x `gpus_per_node` ranks; `inter` is the network's bandwidth per node (all NICs)."""

    intra: Link
    inter: Link
    nodes: int
    gpus_per_node: int

    def group(self, op: str, nbytes: float, size: int, nodes: int, per_node: int = 1) -> float:
        """A ring of `size` ranks over `nodes` nodes; `per_node` such groups share each node's
        network at once (HYBRID_SHARD's replicas: one per local rank). NCCL's latency model:
        the ring's inter-node steps pay the network's hop, the others NVLink's."""
        if size <= 1 or nbytes <= 0:
            return 0.0
        if nodes <= 1:
            return self.intra.time(op, nbytes, size)
        steps, cross = ring_steps(op, size), ring_steps(op, nodes)
        lat = (
            self.inter.base_s
            + (steps - cross) * self.intra.hop_s[op]
            + cross * self.inter.hop_s[op]
        )
        bw = min(self.intra.busbw[op], self.inter.busbw[op] / per_node)
        return lat + nbytes * bus_factor(op, size) / bw


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


# --- the job's side: what the model moves, what one step computes -------------------------


def model_comm(cfg: Any, dtype: str) -> ModelComm:
    """Parameter counts of the FSDP units of the job's model, built on the meta device."""
    from ddpkit.tools.memory_dryrun import build_model
    from ddpkit.tools.memory_model import _kind
    from ddpkit.train.lookup import find_blocks

    model = build_model(cfg)
    blocks = find_blocks(model)
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    return ModelComm(
        params=sum(p.numel() for p in model.parameters()),
        root_params=sum(p.numel() for p in model.parameters() if id(p) not in in_blocks),
        block_params=[sum(p.numel() for p in b.parameters()) for b in blocks],
        param_bytes=2 if dtype in ("bf16", "fp16") else 4,
        tokens_per_sample=cfg.seq_len if _kind(cfg) == "tokens" else 0,
    )


def compute_from_flops(cfg: Any, peak_tflops: float, mfu: float) -> Compute:
    """One micro-batch at peak x MFU with the registry's training FLOPs per token (forward :
    backward = 1 : 2, the 2N + 4N of the 6N rule); the optimizer step is not counted."""
    from ddpkit.tools.memory_dryrun import build_model
    from ddpkit.train import lookup

    spec = lookup.model_spec(cfg)
    if spec.flops_per_token is None or lookup.model_spec(cfg).data_kind != "tokens":
        raise PlanError(
            f"--mfu needs the model's FLOPs per token; {cfg.model} registers none: drop --mfu "
            "to measure one step here, or pass --compute-s"
        )
    fpt = spec.flops_per_token(cfg, build_model(cfg))
    seconds = fpt * cfg.batch_size * cfg.seq_len / (peak_tflops * 1e12 * mfu)
    src = f"{peak_tflops:g} TFLOP/s x MFU {mfu:g}, {fpt / 1e9:.3g} GFLOP per token"
    return Compute(seconds / 3, 2 * seconds / 3, 0.0, cfg.batch_size, src)


def compute_given(cfg: Any, seconds: float) -> Compute:
    return Compute(seconds / 3, 2 * seconds / 3, 0.0, cfg.batch_size, f"given: {seconds:g} s")


def measure_compute(cfg: Any, reps: int = 5, warmup: int = 2) -> Compute:
    """Forward, backward and optimizer step of the job's model on this CPU, one micro-batch
    (median of `reps` after `warmup`), in this process's torch thread count."""
    import torch
    import torch.nn.functional as F
    from ddpkit.tools.memory_model import _kind, in_shape
    from ddpkit.train.models import build_model

    torch.manual_seed(0)
    shape, classes = in_shape(cfg)
    model = build_model(cfg, shape, classes)
    if cfg.optimizer == "sgd":
        opt: Any = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    b = cfg.batch_size
    if _kind(cfg) == "tokens":
        x = torch.randint(0, cfg.vocab_size, (b, cfg.seq_len))
        y = torch.randint(0, cfg.vocab_size, (b, cfg.seq_len))
    else:
        x, y = torch.randn(b, *shape), torch.randint(0, classes, (b,))
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.mixed_precision)
    times: list[tuple[float, float, float]] = []
    for _ in range(warmup + reps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=half, enabled=half is not None):
            out = model(x)
        loss = F.cross_entropy(out.flatten(0, -2).float(), y.flatten())
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    fwd, bwd, step = (statistics.median(t[i] for t in times[warmup:]) for i in range(3))
    threads = torch.get_num_threads()
    return Compute(fwd, bwd, step, b, f"measured here: CPU, {threads} thread(s), median of {reps}")


# --- the plan: every strategy, the memory fit, the recommendation -------------------------


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
    from ddpkit.tools.memory_model import build_meta, saved_activation_bytes
    from ddpkit.tools.memory_plan import make_plan

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
    """`ddpkit memory --step-time ...` (the flags are ddpkit.tools.memory's)."""
    from ddpkit.tools.memory_model import load_cfg

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
        out["model"] += f" ({args.config})"
    print(json.dumps(out, indent=2) if args.json else render(out))
    return 0

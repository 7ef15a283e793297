"""The fabric of the step-time model: links, their presets, and a link fitted from
`ddpkit commbench` data.

Model (alpha-beta, ring collectives, as nccl-tests and NCCL's own tuning model count them):
a collective of S bytes over a ring of n ranks takes

    t = base + steps(n) * hop + S * factor(n) / busbw

with factor 2(n-1)/n and 2(n-1) steps for all_reduce, (n-1)/n and n-1 steps for all_gather and
reduce_scatter (S is the whole buffer: the gathered output, the reduce-scatter input). A ring that
crosses nodes pays the network's hop on its inter-node steps and runs at min(NVLink busbw,
the node's network bandwidth / the groups sharing it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpkit.tools.commbench import bus_factor
from ddpkit.tools.planner.model import PlanError
from ddpkit.train.jsonshape import ListOf, Opt, ShapeError, load

OPS = ("all_reduce", "all_gather", "reduce_scatter")

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


# What fit_commbench reads of `ddpkit commbench --json` (a file of another shape: one line).
COMMBENCH_SHAPE = {
    "world_size": Opt((int, None)),
    "hosts": Opt((list, None)),
    "results": Opt(ListOf({"op": str, "size_bytes": int, "time_us": float})),
}


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
        data = load(path, COMMBENCH_SHAPE)
    except (OSError, ShapeError) as e:
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

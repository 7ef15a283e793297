"""Collective benchmark: time, algorithm and bus bandwidth, and a correctness check per size.

    torchrun --nproc-per-node 8 -m ddpkit.tools.commbench [--ops all_reduce,all_gather]
             [--sizes 1K,1M,64M | --min-bytes 1K --max-bytes 256M --factor 4]
             [--iters 20] [--warmup 5] [--backend auto|nccl|gloo] [--json] [--out DIR]

Size and bandwidth follow nccl-tests (doc/PERFORMANCE.md): `size` is the whole buffer of the
operation (for all_gather the gathered output, for reduce_scatter the input), time is the
slowest rank's mean, algbw = size / time, and busbw = algbw * factor, with factor 2(n-1)/n for
all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, and 1 for broadcast. busbw
is comparable to the hardware's link bandwidth whatever the number of ranks.
Every size is first run on known integer data and checked on every rank; a wrong result makes
the exit status 1. Without torchrun it runs as a single process (world size 1).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from ddpkit.train.contract import EXIT_BAD_INPUT
from ddpkit.train.errors import CliParser, UserError, run_cli

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
DTYPES = ("float32", "bfloat16", "float16")
# Default sweep tops: NVLink/InfiniBand reach their bus-bandwidth plateau only from ~256 MiB
# (nccl-tests sweeps to 8G); gloo on CPUs plateaus early and 1 GB would take minutes.
MAX_BYTES_GPU, MAX_BYTES_CPU = "1G", "16M"


class BenchError(UserError):
    """Bad input: the message names the problem and the fix."""


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw correction: the fraction of the data each rank must move on a link."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


def bandwidths(op: str, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second, as nccl-tests prints)."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_factor(op, n)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise BenchError(f"size {text!r} is not a byte count; write e.g. 4096, 64K, 1M, 1G")
    value = int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]
    if value < 1:
        raise BenchError(f"size {text!r} must be at least 1 byte")
    return value


def size_sweep(args: argparse.Namespace, on_gpu: bool = False) -> list[int]:
    if args.sizes:
        return [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    max_bytes = args.max_bytes or (MAX_BYTES_GPU if on_gpu else MAX_BYTES_CPU)
    lo, hi = parse_size(args.min_bytes), parse_size(max_bytes)
    if lo > hi or args.factor < 2:
        raise BenchError(
            f"--min-bytes {args.min_bytes} > --max-bytes {max_bytes} or --factor "
            f"{args.factor} < 2; give an increasing range and a factor of at least 2"
        )
    out = [lo]
    while out[-1] * args.factor <= hi:
        out.append(out[-1] * args.factor)
    return out


def human_bytes(n: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


# --- the collectives, their inputs and their expected outputs -------------------------------


class Case:
    """Buffers for one op and size, filled with small integers whose result is known exactly.

    Only the input and output stay allocated; index tensors and the expected result are
    built when needed and dropped (a 4 GiB sweep point must not need 30 GiB)."""

    def __init__(self, op: str, size: int, n: int, rank: int, dtype: Any, device: Any):
        import torch

        if op not in OPS:
            raise AssertionError(op)
        self.op, self.n, self.rank, self.dtype, self.device = op, n, rank, dtype, device
        esize = torch.empty((), dtype=dtype).element_size()
        self.count = max(n, size // esize // n * n)  # a multiple of n elements: equal chunks
        self.bytes = self.count * esize
        self.chunk = self.count // n
        self.inp = self.values("input")
        out_len = {"all_gather": self.count, "reduce_scatter": self.chunk, "all_to_all": self.count}
        if op in out_len:
            self.out = torch.empty(out_len[op], dtype=dtype, device=device)
        else:  # in place
            self.out = self.inp

    def values(self, which: str) -> Any:
        """This rank's input, or the output it must receive."""
        import torch

        n, rank, chunk = self.n, self.rank, self.chunk
        i = torch.arange(self.count, device=self.device)
        k = i // chunk  # chunk index of each element
        j = i % chunk  # position inside its chunk
        want = which == "expected"
        if self.op == "all_reduce":
            t = n * (n + 1) // 2 + n * (j % 3) if want else rank + 1 + j % 3
        elif self.op == "broadcast":
            t = i % 13 + 1 if want or rank == 0 else torch.full_like(i, -1)
        elif self.op == "all_gather":  # each rank contributes one chunk of the output
            t = k + j % 5 if want else rank + j[:chunk] % 5
        elif self.op == "reduce_scatter":  # rank r receives the sum of every rank's chunk r
            t = n * (n - 1) // 2 + n * rank + n * (j[:chunk] % 3) if want else rank + k + j % 3
        else:  # all_to_all: chunk k of rank r goes to rank k, as that rank's chunk r
            t = k * n + rank if want else rank * n + k
        return t.to(self.dtype)

    def run(self) -> None:
        import torch.distributed as dist

        if self.op == "all_reduce":
            dist.all_reduce(self.inp)
        elif self.op == "broadcast":
            dist.broadcast(self.inp, src=0)
        elif self.op == "all_gather":
            fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            fn(self.out, self.inp)
        elif self.op == "reduce_scatter":
            fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            fn(self.out, self.inp)
        else:
            dist.all_to_all_single(self.out, self.inp)

    def wrong(self) -> int:
        """Elements that differ from the expected result (on this rank)."""
        import torch

        want = self.values("expected").float()
        return int((~torch.isclose(self.out.float(), want, rtol=1e-2, atol=0)).sum())


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_one(case: Case, iters: int, warmup: int, device: Any, check: bool) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    errors = 0
    if check:
        case.run()
        sync(device)
        errors = case.wrong()
    for _ in range(warmup):
        case.run()
    sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        case.run()
    sync(device)
    mean = (time.perf_counter() - t0) / iters
    # The slowest rank sets the time; wrong elements are summed over ranks.
    stats = torch.tensor([mean, float(errors)], dtype=torch.float64, device=device)
    slowest = stats[:1].clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    total_err = stats[1:].clone()
    dist.all_reduce(total_err, op=dist.ReduceOp.SUM)
    n = dist.get_world_size()
    t = float(slowest.item())
    algbw, busbw = bandwidths(case.op, case.bytes, t, n)
    return {
        "op": case.op,
        "size_bytes": case.bytes,
        "count": case.count,
        "time_us": t * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": busbw,
        "checked": check,
        "wrong_elements": int(total_err.item()),
        "correct": int(total_err.item()) == 0 if check else None,
    }


# --- setup and output --------------------------------------------------------------------


def init(backend: str, timeout_s: float) -> tuple[Any, str]:
    import datetime

    import torch
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise BenchError("--backend nccl needs CUDA GPUs; use --backend gloo on CPU")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group(
            backend, timeout=timeout, device_id=device if backend == "nccl" else None
        )
    else:  # a single process: no rendezvous needed
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    return device, backend


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        f"commbench: {meta['world_size']} rank(s), backend {meta['backend']}, dtype {meta['dtype']}, "
        f"{meta['iters']} iterations after {meta['warmup']} warm-up",
        f"{'op':<15}{'size':>10}{'count':>12}{'time(us)':>12}{'algbw(GB/s)':>13}{'busbw(GB/s)':>13}  check",
    ]
    for r in rows:
        ok = (
            "n/a"
            if r["correct"] is None
            else ("ok" if r["correct"] else f"WRONG({r['wrong_elements']})")
        )
        lines.append(
            f"{r['op']:<15}{human_bytes(r['size_bytes']):>10}{r['count']:>12}{r['time_us']:>12.1f}"
            f"{r['algbw_gbps']:>13.3f}{r['busbw_gbps']:>13.3f}  {ok}"
        )
    if meta["world_size"] == 1:
        lines.append("note: one rank: bus bandwidth is 0 by definition; launch under torchrun")
    return "\n".join(lines)


def write_outputs(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "commbench.json", out / "commbench.csv", out / "commbench.png"]
    paths[0].write_text(json.dumps({**meta, "results": rows}, indent=2) + "\n")
    with paths[1].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for op in dict.fromkeys(r["op"] for r in rows):
        pts = [r for r in rows if r["op"] == op]
        ax.plot(
            [r["size_bytes"] for r in pts], [r["busbw_gbps"] for r in pts], marker="o", label=op
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"{meta['backend']}, {meta['world_size']} ranks, {meta['dtype']}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[2], dpi=100)
    plt.close(fig)
    return paths


def build_parser() -> argparse.ArgumentParser:
    p = CliParser(
        prog="torchrun ... -m ddpkit.tools.commbench",
        description="Benchmark and check collectives (nccl-tests' algbw/busbw).",
    )
    p.add_argument("--ops", default=",".join(OPS), help=f"comma list from {', '.join(OPS)}")
    p.add_argument("--sizes", help="comma list of byte sizes (64K,1M); overrides the sweep")
    p.add_argument("--min-bytes", default="1K")
    p.add_argument(
        "--max-bytes", help=f"sweep top (default: {MAX_BYTES_GPU} on GPUs, {MAX_BYTES_CPU} on CPU)"
    )
    p.add_argument("--factor", type=int, default=4, help="sweep multiplier")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the check")
    p.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--out", help="write commbench.json, commbench.csv and commbench.png here")
    return p


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("RANK", "0") != "0":  # the same bad input on every rank: say it once
        try:
            return _main(argv)
        except UserError:
            return EXIT_BAD_INPUT
    return run_cli(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise BenchError(f"--ops {args.ops}: unknown {bad}; pick from {', '.join(OPS)}")
    if args.iters < 1 or args.warmup < 0:
        raise BenchError(f"--iters {args.iters} must be >= 1 and --warmup {args.warmup} >= 0")
    import torch
    import torch.distributed as dist

    on_gpu = args.backend == "nccl" or (args.backend == "auto" and torch.cuda.is_available())
    sizes = size_sweep(args, on_gpu)
    device, backend = init(args.backend, args.timeout_s)
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    rows = []
    for op in ops:
        for size in sizes:
            case = Case(op, size, n, rank, dtype, device)
            rows.append(bench_one(case, args.iters, args.warmup, device, args.check))
    meta = {"backend": backend, "world_size": n, "dtype": args.dtype, "iters": args.iters}
    meta |= {"warmup": args.warmup, "device": device.type, "hosts": None}
    hosts: list[Any] = [None] * n
    dist.all_gather_object(hosts, os.uname().nodename)
    meta["hosts"] = sorted(set(hosts))
    if rank == 0:
        print(json.dumps({**meta, "results": rows}, indent=2) if args.json else render(meta, rows))
        if args.out:
            paths = write_outputs(Path(args.out), meta, rows)
            print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all(r["correct"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

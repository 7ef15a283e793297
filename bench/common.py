"""Shared pieces of the benchmarks: torchrun launches, per-step timestamps, statistics.

Every timed worker (the kit through bench.kit_timed, the plain loop in bench.plain_ddp)
records the same thing on rank 0: `time.perf_counter()` when each optimizer step returns and
`time.time()` when the first one does. Step time is then measured identically for both: the
wall time from the end of warmup step W to the end of step W+M, divided by M, so everything a
loop does between steps (logging, stop-signal checks, data loading) is included.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
TORCHRUN = str(Path(PY).with_name("torchrun"))
ALL_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"


class BenchError(RuntimeError):
    """A benchmark launch failed; the message carries the command and its output tail."""


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without torchrun's variables; CPU only, one thread per rank."""
    drop = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in drop and k != "DDPKIT_FAULT"}
    # CPU + gloo everywhere: the plain loop has no CUDA path, so the kit must not take one.
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    env.update(extra)
    return env


def torchrun_cmd(nproc: int, module: str, *args: str) -> list[str]:
    return [
        TORCHRUN,
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--signals-to-handle",
        ALL_SIGNALS,
        "-m",
        module,
        *args,
    ]


def launch(cmd: list[str], timeout_s: float) -> tuple[float, float, str]:
    """Run a command from the repository root; returns (wall time at start, seconds, output).

    Raises BenchError (command and last lines of output) on a non-zero exit or a timeout.
    """
    t_launch = time.time()
    try:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        raise BenchError(
            f"timed out after {timeout_s:g} s: {' '.join(cmd)}\n{out[-3000:]}"
        ) from None
    if proc.returncode != 0:
        raise BenchError(f"exit {proc.returncode}: {' '.join(cmd)}\n{proc.stdout[-3000:]}")
    return t_launch, time.time() - t_launch, proc.stdout


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def window_step_time(step_ends: list[float], warmup: int, block: int) -> dict[str, float]:
    """Seconds per step after `warmup` steps, from step-end timestamps (step i ends at
    step_ends[i-1]; the window is steps warmup+1 .. len).

    mean:          window wall time / number of steps.
    block_median:  the window cut into blocks of `block` consecutive steps, each block's mean
                   step time, the median of those. A block spans one log interval, so periodic
                   costs (a logging step) stay in, while a block hit by another process on a
                   shared machine drops out. This is the figure the ratios use.
    step_median:   median single step (periodic costs drop out: shown for reference only).
    """
    if warmup < 1 or len(step_ends) < warmup + block:
        raise ValueError(
            f"need at least warmup + block = {warmup + block} steps, got {len(step_ends)}"
        )
    window = step_ends[warmup - 1 :]
    per_step = [b - a for a, b in zip(window, window[1:], strict=False)]
    blocks = [
        sum(per_step[i : i + block]) / block for i in range(0, len(per_step) - block + 1, block)
    ]
    return {
        "mean": (window[-1] - window[0]) / len(per_step),
        "block_median": statistics.median(blocks),
        "step_median": statistics.median(per_step),
        "steps": len(per_step),
        "blocks": len(blocks),
    }


def spread(values: list[float]) -> dict[str, float | int]:
    """Median, min, max, count, and from 4 values on the quartiles p25/p75 (empty: NaN)."""
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    out: dict[str, float | int] = {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }
    if len(values) >= 4:
        out["p25"], _, out["p75"] = statistics.quantiles(values, n=4, method="inclusive")
    return out


def fmt_spread(s: dict[str, Any] | None, scale: float = 1.0, digits: int = 3) -> str:
    """`median [min..max]`, or `median (p25..p75)` where quartiles exist."""
    if not s or not s.get("n"):
        return "-"
    lo_key, hi_key, br = ("p25", "p75", "()") if "p25" in s else ("min", "max", "[]")
    m, lo, hi = (s[k] * scale for k in ("median", lo_key, hi_key))
    return f"{m:.{digits}f} {br[0]}{lo:.{digits}f}..{hi:.{digits}f}{br[1]}"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def pairs_main(
    argv: list[str] | None,
    prog: str,
    doc: str | None,
    pairs: int,
    run: Callable[[int, Path, dict[str, Any]], list[str]],
) -> int:
    """The command line of a paired benchmark (kit against plain, order alternating):
    `--pairs N --out-dir DIR`, its lines printed; a failed launch is one line, exit 1."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=doc)
    p.add_argument("--pairs", type=int, default=pairs)
    p.add_argument("--out-dir", default="out/bench")
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs must be >= 1, got {args.pairs}")
    try:
        text = run(args.pairs, Path(args.out_dir), {"python": sys.version.split()[0]})
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(text))
    return 0

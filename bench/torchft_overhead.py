"""The step-time cost of torchft's per-step quorum when nothing fails.

    .venv/bin/python -m bench.torchft_overhead --reps 3 --steps 300 --out out/bench/torchft.json

Two jobs with the same data world (2 data ranks, per-rank batch 64, the built-in mlp job, or
`--model mlp-deep`), run
through `ddpkit run` from a scratch project, alternating A B A B ... so both see the same
background load:
  plain    one torchrun with 2 ranks, DDP (no fault tolerance)
  torchft  fault_tolerance = torchft, 2 replica groups x 1 rank: the lighthouse, a quorum
           before every step, the gradient mean across groups through torchft's Manager
The step time is the median of the logged `step_time_s` (metrics.jsonl; the first two logged
steps dropped: start-up); for torchft, group 0's. The figure is the median over repetitions
of torchft / plain, each pair launched back to back.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DDPKIT = str(Path(sys.executable).with_name("ddpkit"))
VARIANTS = {
    "plain": ["--set", "nproc_per_node=2"],
    "torchft": ["--set", "fault_tolerance=torchft", "--set", "nproc_per_node=1"],
}


def run(variant: str, steps: int, log_every: int, where: Path, model: str = "mlp") -> float:
    run_dir = where / variant
    where.mkdir(parents=True, exist_ok=True)
    argv = [
        DDPKIT, "run", "--set", "accelerator=cpu", *VARIANTS[variant], "--",
        "--steps", str(steps), "--log-interval", str(log_every), "--ckpt-interval", "0",
        "--no-eval", "--run-dir", str(run_dir), "--model", model,
    ]  # fmt: skip
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=where, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{variant} failed ({r.returncode}):\n{r.stdout[-3000:]}{r.stderr}")
    metrics = run_dir / ("group-0/metrics.jsonl" if variant == "torchft" else "metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    times = [r["step_time_s"] for r in rows if "step_time_s" in r][2:]
    print(f"  {variant:8s} median step {statistics.median(times) * 1e3:7.2f} ms "
          f"({len(times)} logged steps; launch {time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.torchft_overhead")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--out", default="out/bench/torchft.json")
    p.add_argument(
        "--model",
        default="mlp",
        help="a built-in model (mlp-deep: a step long against the "
        "quorum's milliseconds, as a real model's is)",
    )
    args = p.parse_args(argv)
    pairs = []
    with tempfile.TemporaryDirectory(prefix="ddpkit-bench-ft-") as tmp:
        for rep in range(args.reps):
            print(f"repetition {rep + 1} of {args.reps}", flush=True)
            order = ["plain", "torchft"] if rep % 2 == 0 else ["torchft", "plain"]
            where = Path(tmp) / str(rep)
            got = {v: run(v, args.steps, args.log_every, where, args.model) for v in order}
            pairs.append(got)
    ratios = [p["torchft"] / p["plain"] for p in pairs]
    result = {
        "command": [sys.executable, "-m", "bench.torchft_overhead", *(argv or sys.argv[1:])],
        "load_average": os.getloadavg(),
        "pairs_s": pairs,
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"torchft / plain step time: median {result['ratio_median']:.2f} "
        f"(ratios {', '.join(f'{r:.2f}' for r in ratios)}); {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

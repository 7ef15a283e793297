"""The step time of the kit's trainer with its Prometheus exporter on, against off (issue 55:
the figures must cost no measurable fraction of a step).

    python -m bench.metrics_exporter [--cycles 30] [--block 40] [--out out/bench/metrics_exporter.json]

One process (world 1, the CPU, `python -m ddpkit.train` unchanged but for a wrapper around
Trainer.train_step) trains the mlp logging every step, so every step hands its record to the
exporter (the most the seam is ever asked; a real run logs every 10). Every `--block` steps
the wrapper closes the block just timed and switches the rank-0 Reporter's observers to the
next variant; a cycle is one block of each, in an order rotated per cycle (the first two are
warmup):

    off            no exporter
    on             the exporter as a job with metrics_port and metrics_textfile_dir gets it: an
                   HTTP endpoint, the textfile rewritten every 10 s (train/observe/live.py)
    port-taken     its port already bound by another process: no endpoint, one warning, the
                   run trains on (what a node with the port in use gets)
    scraped-hammer the endpoint scraped and the textfile rewritten every 0.2 s (75x the
                   pace of a 15 s Prometheus scrape): what the exporter's own work (reading
                   the goodput records, building the text, off the training thread) costs the
                   training thread through the GIL, made visible

Step time = block seconds / steps. Reported: each variant's median step time, its ratio to
`off`'s (the ratio of medians) and the per-cycle paired ratios (median, p25..p75).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

VARIANTS = ("off", "on", "port-taken", "scraped-hammer")
HAMMER_S = 0.2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child(args: argparse.Namespace) -> int:
    """The timed training run: exporters made once, each variant's block switches to its own."""
    import ddpkit.train.__main__ as train_main
    from ddpkit.train import goodput
    from ddpkit.train.loop import trainer
    from ddpkit.train.observe import live

    taken = socket.create_server(("0.0.0.0", 0))  # held for the whole run
    quiet: list[str] = []  # the exporters' warnings, kept out of the timed output
    made: dict[str, list] = {}
    scrapes = {"n": 0}
    stop = threading.Event()
    plan = [(c, v) for c in range(args.cycles) for v in _rotated(c)]
    st: dict = {"pos": 0, "current": None, "count": 0, "start": 0.0}
    blocks: list[dict] = []
    orig_step = trainer.Trainer.train_step

    def observers(tr, v: str) -> list:
        if not made:
            run_dir, total = tr.run_dir, tr.total_steps
            text = Path(args.textfiles)

            def exporter(port: int, sub: str):
                return live.Exporter(run_dir, total, 1, port, str(text / sub), quiet.append,
                                     goodput)  # fmt: skip

            made["off"] = []
            made["on"] = [exporter(_free_port(), "on")]
            made["port-taken"] = [exporter(taken.getsockname()[1], "taken")]
            hammer = exporter(_free_port(), "hammer")
            made["scraped-hammer"] = [hammer]
            url = f"http://127.0.0.1:{hammer.port}/metrics"

            def scrape() -> None:  # only while its block runs
                while not stop.wait(HAMMER_S):
                    if st["current"] and st["current"][1] == "scraped-hammer":
                        with urllib.request.urlopen(url, timeout=5) as r:
                            r.read()
                        scrapes["n"] += 1

            threading.Thread(target=scrape, daemon=True).start()
        return made[v]

    def timed_step(tr, batches):
        now = time.perf_counter()
        if st["current"] is None or st["count"] == args.block:
            if st["current"] is not None:
                c, v = st["current"]
                blocks.append(
                    {"cycle": c, "variant": v, "step_s": (now - st["start"]) / st["count"]}
                )
            if st["pos"] < len(plan):
                st["current"] = plan[st["pos"]]
                st["pos"] += 1
                v = st["current"][1]
                # the hammer's textfile refresh runs at its pace during its block only
                live.REFRESH_S = HAMMER_S if v == "scraped-hammer" else 10.0
                tr.reporter.observers = observers(tr, v)
            st["count"], st["start"] = 0, time.perf_counter()
        st["count"] += 1
        return orig_step(tr, batches)

    trainer.Trainer.train_step = timed_step
    steps = args.cycles * len(VARIANTS) * args.block + 1
    with tempfile.TemporaryDirectory() as run_dir:
        rc = train_main.main(
            ["--model", "mlp", "--batch-size", "64", "--steps", str(steps), "--seed", "0",
             "--log-interval", "1", "--ckpt-interval", "0", "--run-dir", run_dir,
             "--resume", "never", "--no-ckpt-final", "--no-eval", "--progress", "plain"]
        )  # fmt: skip
    stop.set()
    Path(args.out).write_text(json.dumps({"rc": rc, "block": args.block, "blocks": blocks,
                                          "scrapes": scrapes["n"], "warnings": quiet}))  # fmt: skip
    return rc


def _rotated(cycle: int) -> list[str]:
    k = cycle % len(VARIANTS)
    return list(VARIANTS[k:] + VARIANTS[:k])


def summarize(data: dict, warmup: int = 2) -> dict:
    by: dict[str, dict[int, float]] = {v: {} for v in VARIANTS}
    for b in data["blocks"]:
        if b["cycle"] >= warmup:
            by[b["variant"]][b["cycle"]] = b["step_s"]
    base = statistics.median(by["off"].values())
    out = {"off_median_ms": round(base * 1e3, 4), "variants": {}}
    for v in VARIANTS[1:]:
        med = statistics.median(by[v].values())
        paired = sorted(by[v][c] / by["off"][c] for c in by[v] if c in by["off"])
        q = statistics.quantiles(paired, n=4)
        out["variants"][v] = {
            "median_ms": round(med * 1e3, 4),
            "ratio_of_medians": round(med / base, 4),
            "paired_ratio_median": round(statistics.median(paired), 4),
            "paired_ratio_p25_p75": [round(q[0], 4), round(q[2], 4)],
            "cycles": len(paired),
        }
    out["scrapes"] = data["scrapes"]
    out["warnings"] = data["warnings"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.metrics_exporter")
    p.add_argument("--cycles", type=int, default=30)
    p.add_argument("--block", type=int, default=40)
    p.add_argument("--out", default="out/bench/metrics_exporter.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--textfiles", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_suffix(".blocks.json")
    with tempfile.TemporaryDirectory() as textfiles:
        cmd = [sys.executable, "-m", "bench.metrics_exporter", "--child", "--cycles",
               str(args.cycles), "--block", str(args.block), "--out", str(raw),
               "--textfiles", textfiles]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        for k in ("DDPKIT_METRICS_PORT", "DDPKIT_METRICS_TEXTFILE_DIR", "RANK", "WORLD_SIZE"):
            env.pop(k, None)
        # The trainer prints a line per step: to a file, the same for every variant.
        with open(out.with_suffix(".log"), "w") as log:
            r = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        print(f"the timed run failed (exit {r.returncode}); see {out.with_suffix('.log')}")
        return 1
    result = {"command": cmd[:-2], **summarize(json.loads(raw.read_text()))}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"step time, mlp on 1 CPU rank, logging every step: off {result['off_median_ms']} ms")
    for v, r2 in result["variants"].items():
        lo, hi = r2["paired_ratio_p25_p75"]
        print(f"  {v:15s} {r2['median_ms']:.4f} ms  ratio of medians {r2['ratio_of_medians']:.4f}"
              f"  paired {r2['paired_ratio_median']:.4f} ({lo:.4f}..{hi:.4f})")  # fmt: skip
    print(
        f"scrapes during the hammer's blocks: {result['scrapes']}; warnings: {result['warnings']}"
    )
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

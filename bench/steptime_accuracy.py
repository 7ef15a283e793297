"""The step-time model (ddpkit.tools.planner) against real steps on this machine.

    python -m bench.steptime_accuracy          # = python -m bench --only steptime; 30 min on 2 shared cores
    python -m bench.steptime_accuracy --quick  # mlp-deep, 2 ranks, DDP and FULL_SHARD (~1 min)

1. `ddpkit commbench` on loopback (gloo, 2 and 4 ranks, all_reduce/all_gather/reduce_scatter,
   4 KiB..64 MiB): the model's input, fitted per collective (latency + bandwidth).
2. One rank's compute, measured by the planner in this process with one thread (what
   torchrun's OMP_NUM_THREADS=1 gives each rank): forward, backward, optimizer step.
3. Real runs: `python -m ddpkit.train` (through bench.kit_timed, which timestamps every
   optimizer step) at 1, 2 and 4 gloo ranks for mlp-deep and gpt, DDP / SHARD_GRAD_OP /
   FULL_SHARD, and HYBRID_SHARD at 4 ranks as 2 "nodes" x 2 (--replicate-degree 2). Measured
   step = block median after warmup.

Printed per run: measured, predicted (the model as users get it: overlap 1), serial (overlap
0: no communication hidden) and cpu-shared (serial, compute x ranks / cores when ranks
outnumber the cores), and the error predicted / measured - 1. JSON: out/bench/steptime.json.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    BenchError,
    launch,
    read_json,
    table,
    torchrun_cmd,
    window_step_time,
    write_json,
)
from bench.loop_overhead import kit_run_flags

COMM_OPS = "all_reduce,all_gather,reduce_scatter"
WARMUP, BLOCK = 3, 4


@dataclass(frozen=True)
class Run:
    model: str
    ranks: int
    strategy: str
    steps: int = 15
    replicate: int | None = None  # HYBRID_SHARD: replicas ("nodes" on this one machine)

    @property
    def nodes(self) -> int:
        return self.replicate or 1


MODEL_FLAGS = {
    "mlp-deep": ["--batch-size", "32"],
    "gpt": ["--batch-size", "8", "--n-layer", "4", "--d-model", "256", "--n-head", "4"],
}


def runs(quick: bool) -> list[Run]:
    if quick:
        return [Run("mlp-deep", 2, "DDP", 10), Run("mlp-deep", 2, "FULL_SHARD", 10)]
    out = []
    for model in MODEL_FLAGS:
        out.append(Run(model, 1, "DDP"))
        for n in (2, 4):
            out += [Run(model, n, s) for s in ("DDP", "SHARD_GRAD_OP", "FULL_SHARD")]
        out.append(Run(model, 4, "HYBRID_SHARD", replicate=2))
    return out


def strategy_flags(r: Run) -> list[str]:
    if r.strategy == "DDP":
        return ["--parallel", "ddp"]
    flags = ["--parallel", "fsdp", "--sharding", r.strategy]
    return flags + (["--replicate-degree", str(r.replicate)] if r.replicate else [])


def commbench(n: int, work: Path, quick: bool) -> Path:
    out = work / f"commbench-{n}"
    sizes = ["--min-bytes", "64K", "--max-bytes", "16M"] if quick else []
    sizes = sizes or ["--min-bytes", "4K", "--max-bytes", "64M"]
    cmd = torchrun_cmd(n, "ddpkit.tools.commbench", "--ops", COMM_OPS, *sizes, "--factor", "4")
    cmd += ["--iters", "5", "--warmup", "2", "--out", str(out)]
    launch(cmd, 600)
    return out / "commbench.json"


def job_cfg(model: str) -> Any:
    """The run's training config, as the planner reads it from flags."""
    from ddpkit.tools.planner.model import load_cfg

    ns = argparse.Namespace(config=None, model=model, dataset=None)
    flags = MODEL_FLAGS[model]
    for key, value in zip(flags[::2], flags[1::2], strict=True):
        setattr(ns, key[2:].replace("-", "_"), int(value))
    return load_cfg(ns)


def measure(r: Run, work: Path) -> dict[str, Any]:
    tag = f"{r.model}-{r.ranks}-{r.strategy}"
    out, run_dir = work / f"{tag}.json", work / tag
    train = ["--model", r.model, *MODEL_FLAGS[r.model], *strategy_flags(r)]
    train += ["--steps", str(r.steps), "--log-interval", str(r.steps + 1), "--seed", "0"]
    cmd = torchrun_cmd(r.ranks, "bench.kit_timed", "--out", str(out), "--", *train)
    cmd += kit_run_flags(run_dir)
    launch(cmd, 600)
    st = window_step_time(read_json(out)["step_ends"], WARMUP, BLOCK)
    return {"command": shlex.join(cmd), "step_s": st["block_median"], "steps": st["steps"]}


def contended_compute(model: str, n: int, work: Path) -> Any:
    """One rank's compute measured while n ranks measure at once (the cores they share):
    the mean over ranks of bench.steptime_accuracy --compute-worker under torchrun."""
    from ddpkit.tools.planner.predict import Compute

    out = work / f"compute-{model}-{n}"
    out.mkdir(parents=True, exist_ok=True)
    launch(
        torchrun_cmd(
            n, "bench.steptime_accuracy", "--compute-worker", model, "--out-dir", str(out)
        ),
        600,
    )
    recs = [read_json(out / f"rank-{i}.json") for i in range(n)]
    mean = {k: sum(r[k] for r in recs) / n for k in ("fwd_s", "bwd_s", "opt_s")}
    return Compute(**mean, samples=recs[0]["samples"], source=f"measured in {n} concurrent ranks")


def compute_worker(model: str, out: Path) -> int:
    import torch
    from ddpkit.tools.planner.job import measure_compute

    torch.set_num_threads(1)
    c = measure_compute(job_cfg(model))
    write_json(out / f"rank-{os.environ.get('RANK', '0')}.json", c.__dict__)
    return 0


def predict(r: Run, links: dict[int, Any], computes: dict[str, Any]) -> dict[str, float]:
    from ddpkit.tools.planner.links import preset
    from ddpkit.tools.planner.recommend import plan

    cfg = job_cfg(r.model)
    cfg.replicate_degree = r.replicate
    cfg.parallel = "ddp" if r.strategy == "DDP" else "fsdp"
    intra = links.get(r.ranks // r.nodes) or preset("nvlink")
    inter = links.get(r.ranks) or intra
    out = {}
    for comp, tag in ((computes[r.model, 1], ""), (computes[r.model, r.ranks], "loaded_")):
        for key, overlap in (("predicted_s", 1.0), ("serial_s", 0.0)):
            p = plan(cfg, r.ranks, r.nodes, intra, inter, comp, None, overlap, (r.strategy,))
            s = p["strategies"][0]
            out[tag + key] = s["step_s"]
            out[tag + "compute_s"], out["comm_s"] = s["compute_s"], s["comm_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.steptime_accuracy", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="mlp-deep, 2 ranks, DDP and FULL_SHARD")
    p.add_argument("--out-dir", default="out/bench")
    p.add_argument("--compute-worker", metavar="MODEL", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.compute_worker:
        return compute_worker(args.compute_worker, Path(args.out_dir))
    out = Path(args.out_dir)
    out = out if out.is_absolute() else ROOT / out
    work = out / "work" / "steptime"
    work.mkdir(parents=True, exist_ok=True)
    try:
        lines = run_all(args.quick, work, out)
    except BenchError as e:
        print(f"error: a benchmark launch failed: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def run_all(quick: bool, work: Path, out: Path) -> list[str]:
    import torch
    from ddpkit.tools.planner.job import measure_compute
    from ddpkit.tools.planner.links import load_link

    torch.set_num_threads(1)  # one rank's compute, as torchrun's OMP_NUM_THREADS=1 runs it
    plan = runs(quick)
    links = {}
    for n in sorted({r.ranks for r in plan if r.ranks > 1} | {2}):
        print(f"commbench on loopback, {n} gloo ranks", flush=True)
        path = commbench(n, work, quick)
        links[n] = load_link(str(path))
    computes = {}
    for model in dict.fromkeys(r.model for r in plan):
        computes[model, 1] = measure_compute(job_cfg(model))
        for n in sorted({r.ranks for r in plan if r.model == model and r.ranks > 1}):
            print(f"compute of {model} in {n} concurrent ranks", flush=True)
            computes[model, n] = contended_compute(model, n, work)
    results = []
    for r in plan:
        print(f"{r.model}: {r.ranks} rank(s), {r.strategy}", flush=True)
        rec = {"run": r.__dict__, **measure(r, work), **predict(r, links, computes)}
        rec["error"] = rec["predicted_s"] / rec["step_s"] - 1
        rec["error_serial"] = rec["serial_s"] / rec["step_s"] - 1
        rec["error_loaded"] = rec["loaded_predicted_s"] / rec["step_s"] - 1
        rec["error_loaded_serial"] = rec["loaded_serial_s"] / rec["step_s"] - 1
        results.append(rec)
    fits = {
        n: {
            "busbw_GBps": {k: v / 1e9 for k, v in link.busbw.items()},
            "hop_us": {k: v * 1e6 for k, v in link.hop_s.items()},
        }
        for n, link in links.items()
    }
    data = {
        "cpus": os.cpu_count(),
        "links": fits,
        "computes": {f"{m} x{n}": c.__dict__ for (m, n), c in computes.items()},
        "results": results,
    }
    write_json(out / "steptime.json", data)
    head = ["model", "ranks", "strategy", "measured", "predicted", "err", "serial", "err"]
    rows = [head + ["| same-load", "err", "serial", "err", "model comm"]]
    for rec in results:
        r = rec["run"]
        rows.append(
            [r["model"], str(r["ranks"]), r["strategy"] + (" rep 2" if r["replicate"] else "")]
            + [ms(rec["step_s"]), ms(rec["predicted_s"]), pct(rec["error"])]
            + [ms(rec["serial_s"]), pct(rec["error_serial"])]
            + ["| " + ms(rec["loaded_predicted_s"]), pct(rec["error_loaded"])]
            + [ms(rec["loaded_serial_s"]), pct(rec["error_loaded_serial"]), ms(rec["comm_s"])]
        )
    multi = [rec for rec in results if rec["run"]["ranks"] > 1]
    lines = [
        "== step time: the model (ddpkit memory --step-time) against python -m ddpkit.train, "
        "gloo on loopback ==",
        "links fitted from commbench: "
        + "; ".join(
            f"{n} ranks: all_reduce {f['busbw_GBps']['all_reduce']:.2f} GB/s, "
            f"{f['hop_us']['all_reduce']:.0f} us/step"
            for n, f in fits.items()
        ),
        "compute per rank (1 thread; x n: measured while n ranks measure at once): "
        + "; ".join(
            f"{m} x{n} fwd {ms(c.fwd_s)} bwd {ms(c.bwd_s)} opt {ms(c.opt_s)}"
            for (m, n), c in computes.items()
        ),
        table(rows),
        "predicted: compute measured alone, overlap 1 (what the planner gives); serial: overlap 0; "
        "same-load: compute measured in as many concurrent ranks as the run has",
    ]
    for key, label in (
        ("error", "predicted"),
        ("error_serial", "serial"),
        ("error_loaded", "same-load"),
        ("error_loaded_serial", "same-load serial"),
    ):
        errs = [abs(rec[key]) for rec in multi]
        if errs:
            lines.append(
                f"|error| {label}, multi-rank runs: median {median(errs):.0%}, max {max(errs):.0%}"
            )
    lines.append(f"JSON: {out / 'steptime.json'}")
    return [line for line in lines if line]


def median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs)


def ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms"


def pct(x: float) -> str:
    return f"{x:+.0%}"


if __name__ == "__main__":
    sys.exit(main())

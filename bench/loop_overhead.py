"""Step time and time to first step: the kit's loop against the plain DDP loop.

Each repetition launches every variant once under `torchrun --nproc-per-node 2` (gloo), in
an order rotated per repetition (A B C, B C A, ...), so slow and fast phases of a shared
machine fall on every variant alike. Step time is wall time over the steps after warmup,
divided by their number, measured the same way in both loops (see bench.common). Ratios are
taken within a repetition (kit run / plain run launched next to it), then summarised as
median [min..max] over repetitions.

Variants:
  plain       bench.plain_ddp: DDP + DistributedSampler + DataLoader + AdamW
  plain-gather  the plain loop with one tensor gather per batch instead of the DataLoader's
              per-sample collate: the kit's data path for in-memory data, so kit/plain-gather
              isolates the kit's loop overhead from the data-loading difference
  kit         python -m ddpkit.train as users run it (default --log-interval 10)
  kit-nolog   the kit with --log-interval above --steps (no logging step inside the window)
  kit-nostop  the kit with the per-step stop-signal all_reduce patched out (bench only)
"""

from __future__ import annotations

import json
import shlex
import shutil
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import interleaved
from bench.common import fmt_spread, launch, read_json, spread, torchrun_cmd, window_step_time


@dataclass(frozen=True)
class Case:
    model: str
    steps: int
    warmup: int
    variants: tuple[str, ...]
    batch_size: int = 64
    synthetic_samples: int = 8192
    log_interval: int = 10  # the kit's default
    probe_collectives: int = 200  # plain runs: time the kit's stop check alone afterwards
    timeout_s: float = 300.0
    extra: dict[str, Any] = field(default_factory=dict)


def kit_run_flags(run_dir: Path) -> list[str]:
    """What every kit launch of the benchmark adds: a fresh run, no final save, no eval."""
    return [
        "--run-dir",
        str(run_dir),
        "--resume",
        "never",
        "--no-ckpt-final",
        "--no-eval",
        "--progress",
        "plain",
    ]


def command(case: Case, variant: str, out: Path, run_dir: Path) -> list[str]:
    common = [
        "--model",
        case.model,
        "--batch-size",
        str(case.batch_size),
        "--steps",
        str(case.steps),
        "--lr",
        "1e-3",
        "--seed",
        "0",
        "--synthetic-samples",
        str(case.synthetic_samples),
    ]
    if variant == "plain":
        probe = ["--probe-collectives", str(case.probe_collectives)]
        return torchrun_cmd(2, "bench.plain_ddp", "--out", str(out), *common, *probe)
    if variant == "plain-gather":
        return torchrun_cmd(2, "bench.plain_ddp", "--out", str(out), *common, "--data", "gather")
    log_interval = case.steps + 1 if variant == "kit-nolog" else case.log_interval
    kit_variant = "kit-nostop" if variant == "kit-nostop" else "kit"
    return torchrun_cmd(
        2,
        "bench.kit_timed",
        "--out",
        str(out),
        "--variant",
        kit_variant,
        "--",
        *common,
        "--log-interval",
        str(log_interval),
        *kit_run_flags(run_dir),
    )


def run_one(case: Case, variant: str, rep: int, work: Path) -> dict[str, Any]:
    tag = f"{case.model}-{variant}-{rep}"
    out, run_dir = work / f"{tag}.json", work / tag
    cmd = command(case, variant, out, run_dir)
    t_launch, wall, _ = launch(cmd, case.timeout_s)
    rec = read_json(out)
    st = window_step_time(rec["step_ends"], case.warmup, case.log_interval)
    result = {
        "variant": variant,
        "rep": rep,
        "command": shlex.join(cmd),
        "step_s": st["block_median"],
        "step_mean_s": st["mean"],
        "step_median_s": st["step_median"],
        "measured_steps": st["steps"],
        "launch_to_first_step_s": rec["t_first_step"] - t_launch,
        "process_to_first_step_s": rec["t_first_step"] - rec["t_import"],
        "launch_wall_s": wall,
        "phases": {p["phase"]: round(p["s"], 4) for p in rec["phases"]},
    }
    if rec.get("probe_stop_allreduce_s"):
        result["probe_stop_allreduce_s"] = rec["probe_stop_allreduce_s"]
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():  # the kit's own per-log-interval step_time_s, as a cross-check
        recs = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        own = [r["step_time_s"] for r in recs if r["step"] > case.warmup]
        result["kit_reported_step_s"] = statistics.median(own) if own else None
    shutil.rmtree(run_dir, ignore_errors=True)
    out.unlink(missing_ok=True)
    return result


def run_case(case: Case, reps: int, work: Path, log) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        k = rep % len(case.variants)
        for variant in case.variants[k:] + case.variants[:k]:
            r = run_one(case, variant, rep, work)
            log(
                f"  {case.model:<8} rep {rep} {variant:<10} step {r['step_s'] * 1e3:8.2f} ms  "
                f"first step {r['launch_to_first_step_s']:.2f} s after launch"
            )
            runs.append(r)
    return {"case": asdict(case), "reps": reps, "runs": runs, "summary": summarize(case, runs)}


def summarize(case: Case, runs: list[dict[str, Any]]) -> dict[str, Any]:
    by = {v: {r["rep"]: r for r in runs if r["variant"] == v} for v in case.variants}
    out: dict[str, Any] = {}
    for v in case.variants:
        rs = list(by[v].values())
        out[v] = {
            "step_s": spread([r["step_s"] for r in rs]),
            "launch_to_first_step_s": spread([r["launch_to_first_step_s"] for r in rs]),
            "process_to_first_step_s": spread([r["process_to_first_step_s"] for r in rs]),
            "phases_median_s": {
                ph: statistics.median(r["phases"][ph] for r in rs if ph in r["phases"])
                for ph in rs[0]["phases"]
            },
        }
        for base in BASELINES:
            if v == base or base not in by or v.startswith("plain"):
                continue
            pairs = [(by[v][k], by[base][k]) for k in by[v] if k in by[base]]
            out[v][f"ratio_vs_{base}"] = spread([a["step_s"] / b["step_s"] for a, b in pairs])
            out[v][f"ratio_vs_{base}_window_mean"] = spread(
                [a["step_mean_s"] / b["step_mean_s"] for a, b in pairs]
            )
    probes = [
        r["probe_stop_allreduce_s"]["median"]
        for r in by.get("plain", {}).values()
        if r.get("probe_stop_allreduce_s")
    ]
    if probes:
        out["stop_allreduce_isolated_s"] = spread(probes)
    if "kit" in by:
        for other, key in (("kit-nostop", "stop_allreduce_s"), ("kit-nolog", "logging_s")):
            if other in by:  # what the removed piece costs per step, paired within a rep
                d = [by["kit"][k]["step_s"] - by[other][k]["step_s"] for k in by[other]]
                out.setdefault("costs_per_step", {})[key] = spread(d)
    return out


def rows(result: dict[str, Any]) -> list[list[str]]:
    case, s = result["case"], result["summary"]
    table = []
    for v in case["variants"]:
        ratios = [s[v].get(f"ratio_vs_{b}") for b in BASELINES]
        table.append(
            [
                case["model"],
                v,
                fmt_spread(s[v]["step_s"], 1e3, 2),
                *(fmt_spread(r, 1.0, 3) if r else "-" for r in ratios),
                fmt_spread(s[v]["launch_to_first_step_s"], 1.0, 2),
            ]
        )
    return table


BASELINES = ("plain", "plain-gather")
# --- interleaved blocks in one launch (bench.interleaved) -------------------------------------


@dataclass(frozen=True)
class Interleaved:
    model: str
    variants: tuple[str, ...]
    cycles: int
    block: int = 10  # steps per block
    log_every: int = 10  # the kit's --log-interval inside the run (divides block)
    warmup_cycles: int = 2
    batch_size: int = 64
    synthetic_samples: int = 8192
    timeout_s: float = 420.0
    kit_args: tuple[str, ...] = ()  # more `python -m ddpkit.train` flags (hf: dataset, FSDP, ...)
    label: str = ""  # the name in tables and file names (default: the model)
    nproc: int = 2  # ranks (1: the loop's own cost, without a peer's jitter)

    @property
    def name(self) -> str:
        return self.label or self.model


def interleaved_command(case: Interleaved, out: Path, run_dir: Path) -> list[str]:
    steps = interleaved.kit_steps(list(case.variants), case.cycles, case.block)
    return torchrun_cmd(
        case.nproc,
        "bench.interleaved",
        "--out",
        str(out),
        "--block",
        str(case.block),
        "--log-every",
        str(case.log_every),
        "--cycles",
        str(case.cycles),
        "--variants",
        ",".join(case.variants),
        "--",
        "--model",
        case.model,
        "--batch-size",
        str(case.batch_size),
        "--steps",
        str(steps),
        "--lr",
        "1e-3",
        "--seed",
        "0",
        "--synthetic-samples",
        str(case.synthetic_samples),
        "--log-interval",
        str(case.log_every),
        *case.kit_args,
        *kit_run_flags(run_dir),
    )


def run_interleaved(case: Interleaved, launches: int, work: Path, log) -> dict[str, Any]:
    runs = []
    for i in range(launches):
        out, run_dir = work / f"inter-{case.name}-{i}.json", work / f"inter-{case.name}-{i}"
        cmd = interleaved_command(case, out, run_dir)
        _, wall, _ = launch(cmd, case.timeout_s)
        rec = read_json(out)
        shutil.rmtree(run_dir, ignore_errors=True)
        out.unlink(missing_ok=True)
        runs.append({"launch": i, "command": shlex.join(cmd), "wall_s": wall, **rec})
        s = summarize_blocks(case, [rec])
        log(
            f"  {case.name:<8} interleaved launch {i}: "
            + ", ".join(f"{v} {s[v]['step_s']['median'] * 1e3:.2f} ms" for v in case.variants)
            + f" ({wall:.0f} s)"
        )
    return {"case": asdict(case), "runs": runs, "summary": summarize_blocks(case, runs)}


def summarize_blocks(case: Interleaved, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step times of each variant's blocks, and ratios/differences paired per cycle."""
    per: dict[tuple[int, int], dict[str, float]] = {}
    for run_i, rec in enumerate(runs):
        for b in rec["blocks"]:
            if b["cycle"] >= case.warmup_cycles:
                per.setdefault((run_i, b["cycle"]), {})[b["variant"]] = b["s"] / case.block
    cycles = list(per.values())
    out: dict[str, Any] = {}
    for v in case.variants:
        out[v] = {"step_s": spread([c[v] for c in cycles if v in c])}
        for base in (*BASELINES, "plain-log", "plain-fsdp"):
            if v in interleaved.KIT and base in case.variants:
                pairs = [c[v] / c[base] for c in cycles if v in c and base in c]
                out[v][f"ratio_vs_{base}"] = spread(pairs)
    for other, key in (("kit-nostop", "stop_allreduce_s"), ("kit-nolog", "logging_s")):
        if "kit" in case.variants and other in case.variants:
            d = [c["kit"] - c[other] for c in cycles if "kit" in c and other in c]
            out.setdefault("costs_per_step", {})[key] = spread(d)
    return out


def interleaved_rows(result: dict[str, Any]) -> list[list[str]]:
    case, s = result["case"], result["summary"]
    return [
        [
            case.get("label") or case["model"],
            v,
            fmt_spread(s[v]["step_s"], 1e3, 2),
            *(fmt_spread(s[v].get(f"ratio_vs_{b}"), 1.0, 3) for b in BASELINES),
        ]
        for v in case["variants"]
    ]


INTERLEAVED_HEADER = [
    "model",
    "variant",
    "step ms, median (p25..p75)",
    "ratio vs plain",
    "ratio vs plain-gather",
]
HEADER = [
    "model",
    "variant",
    "step ms",
    "ratio vs plain",
    "ratio vs plain-gather",
    "launch -> first step s",
]

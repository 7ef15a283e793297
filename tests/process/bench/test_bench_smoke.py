"""Benchmarks: the statistics helpers, and a tiny `python -m bench --quick` end to end.

No timing is asserted anywhere: the end-to-end test checks that every benchmark script runs
under torchrun and writes well-formed, self-consistent JSON (about 50 s on 2 cores).

Here the tests that start processes; the in-process ones in
tests/unit/bench/test_bench_smoke.py. Helpers both use are in
tests/unit/bench/test_bench_smoke.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.unit.bench.test_bench_smoke import ROOT


def _finite_positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_quick_bench_writes_well_formed_results(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "== step time" in proc.stdout and "== checkpoint" in proc.stdout
    assert (tmp_path / "summary.txt").is_file()
    assert not (tmp_path / "work").exists()  # scratch (checkpoints, run dirs) cleaned up

    steps = json.loads((tmp_path / "step_time.json").read_text())
    (inter,) = steps["interleaved"]
    (run,) = inter["runs"]
    variants = inter["case"]["variants"]
    # every variant ran one block per cycle, each cycle in a rotated order
    assert len(run["blocks"]) == len(variants) * inter["case"]["cycles"]
    first, second = ([b["variant"] for b in run["blocks"] if b["cycle"] == c] for c in (0, 1))
    assert sorted(first) == sorted(variants) and second == first[1:] + first[:1]
    assert all(_finite_positive(b["s"]) for b in run["blocks"])
    summary = inter["summary"]
    measured = inter["case"]["cycles"] - inter["case"]["warmup_cycles"]
    for v in variants:
        assert summary[v]["step_s"]["n"] == measured
    assert summary["kit"]["ratio_vs_plain"]["n"] == measured
    assert set(summary["costs_per_step"]) == {"stop_allreduce_s", "logging_s"}

    (case,) = steps["launches"]
    assert {r["variant"] for r in case["runs"]} == {"plain", "kit"}
    for r in case["runs"]:
        assert _finite_positive(r["step_s"]) and _finite_positive(r["launch_to_first_step_s"])
        assert r["measured_steps"] == case["case"]["steps"] - case["case"]["warmup"]
        assert "-m bench.plain_ddp" in r["command"] or "-m bench.kit_timed" in r["command"]
    kit = next(r for r in case["runs"] if r["variant"] == "kit")
    plain = next(r for r in case["runs"] if r["variant"] == "plain")
    assert _finite_positive(kit["kit_reported_step_s"])  # read from the kit's metrics.jsonl
    assert "build model + DDP/FSDP" in kit["phases"]
    assert _finite_positive(plain["probe_stop_allreduce_s"]["median"])
    ratio = case["summary"]["kit"]["ratio_vs_plain"]
    assert ratio["n"] == 1
    assert ratio["median"] == pytest.approx(kit["step_s"] / plain["step_s"])

    ck = json.loads((tmp_path / "checkpoint.json").read_text())
    saves = ck["saves"]
    sb = saves["state_bytes_rank0"]
    # DDP state is replicated; DCP writes it once: params + AdamW state, plus a little metadata.
    assert (
        sb["params"] + sb["optim"] <= saves["checkpoint_bytes"] < 1.2 * (sb["params"] + sb["optim"])
    )
    for kind in ("sync", "async", "raw1", "raw2"):
        assert len(saves["results"][kind]) == 1
    a = saves["results"]["async"][0]
    assert 0 < a["blocked_s"] <= a["complete_s"]
    assert saves["summary"]["async"]["blocked_over_sync"]["n"] == 1

    resume = ck["resume"]
    kinds = [r["kind"] for r in resume["runs"]]
    assert kinds == ["fresh", "resume"]
    fresh, resumed = resume["runs"]
    assert fresh["resumed_from"] is None and resumed["resumed_from"].endswith("step-2")
    assert _finite_positive(resumed["resume_load_s"])

"""commbench: nccl-tests bandwidth formulas, size parsing, the result check, and real runs
under torchrun with gloo on 2 and 4 ranks.

Here the tests that start processes; the in-process ones in tests/unit/tools/test_commbench.py."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.tools.commbench import OPS, bus_factor

ROOT = Path(__file__).resolve().parents[3]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ops", "all_reduce,gossip"], "gossip"),
        (["--sizes", "1K,lots"], "lots"),
        (["--min-bytes", "1M", "--max-bytes", "1K"], "--min-bytes"),
        (["--iters", "0"], "--iters"),
    ],
)
def test_bad_input_one_line_exit_2(args, needle):
    r = subprocess.run(
        [sys.executable, "-m", "ddpkit.tools.commbench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "-m", "ddpkit.tools.commbench"]
    return subprocess.run(
        [*cmd, "--sizes", "1K,64K", "--iters", "3", "--warmup", "1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def check_rows(rows: list[dict], n: int) -> None:
    assert {r["op"] for r in rows} == set(OPS)
    assert len(rows) == 2 * len(OPS)
    for r in rows:
        assert r["correct"] is True and r["wrong_elements"] == 0, r
        assert r["size_bytes"] % (4 * n) == 0  # whole float32 chunks per rank
        assert r["count"] * 4 == r["size_bytes"]
        assert 0 < r["time_us"] < 10_000_000  # under 10 s per call on a loaded CPU
        algbw = r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9
        assert r["algbw_gbps"] == pytest.approx(algbw, rel=1e-6)
        assert r["busbw_gbps"] == pytest.approx(algbw * bus_factor(r["op"], n), rel=1e-6)


@pytest.mark.slow
def test_two_ranks_gloo_writes_csv_json_png(tmp_path):
    r = torchrun(2, "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "all_to_all" in r.stdout and "WRONG" not in r.stdout
    data = json.loads((tmp_path / "commbench.json").read_text())
    assert data["world_size"] == 2 and data["backend"] == "gloo"
    check_rows(data["results"], 2)
    with (tmp_path / "commbench.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(data["results"]) and rows[0]["op"] == "all_reduce"
    png = (tmp_path / "commbench.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000


@pytest.mark.slow
def test_four_ranks_gloo_json():
    r = torchrun(4, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert data["world_size"] == 4
    check_rows(data["results"], 4)

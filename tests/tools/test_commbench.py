"""commbench: nccl-tests bandwidth formulas, size parsing, the result check, and real runs
under torchrun with gloo on 2 and 4 ranks."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.tools.commbench import OPS, bandwidths, bus_factor, parse_size

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def test_nccl_tests_bus_factors():
    # nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n, allgather/reducescatter/alltoall (n-1)/n,
    # broadcast 1.
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bus_factor("all_to_all", 2) == pytest.approx(0.5)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0
    algbw, busbw = bandwidths("all_reduce", 2_000_000_000, 0.5, 4)
    assert (algbw, busbw) == (pytest.approx(4.0), pytest.approx(6.0))


def test_parse_size():
    assert parse_size("4096") == 4096
    assert parse_size("64K") == 65536
    assert parse_size("1MiB") == 2**20
    assert parse_size("2g") == 2 * 2**30
    with pytest.raises(ValueError):
        parse_size("big")


def test_default_sweep_reaches_1g_on_gpus_and_stays_small_on_cpu():
    import argparse

    from ddpkit.tools.commbench import build_parser, size_sweep

    args = build_parser().parse_args([])
    gpu, cpu = size_sweep(args, on_gpu=True), size_sweep(args, on_gpu=False)
    assert gpu[0] == cpu[0] == 1024 and gpu[-1] == 2**30 and cpu[-1] == 16 * 2**20
    assert size_sweep(argparse.Namespace(**{**vars(args), "max_bytes": "64K"}), True)[-1] == 2**16


def test_check_catches_a_wrong_result():
    import torch
    import torch.distributed as dist
    from ddpkit.tools.commbench import Case

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for op in OPS:
            case = Case(op, 4096, 1, 0, torch.float32, torch.device("cpu"))
            case.run()
            assert case.wrong() == 0, op
            case.out[7] += 1  # one corrupted element must be reported
            assert case.wrong() == 1, op
    finally:
        dist.destroy_process_group()


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

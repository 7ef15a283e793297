"""commbench: nccl-tests bandwidth formulas, size parsing, the result check, and real runs
under torchrun with gloo on 2 and 4 ranks.

Here the tests that run in this process; those that start processes in
tests/process/tools/test_commbench.py."""

from __future__ import annotations

import pytest
from ddpkit.tools.commbench import OPS, bandwidths, bus_factor, parse_size


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

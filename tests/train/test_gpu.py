"""The CUDA path (NCCL, bf16, compile, activation checkpointing). Skips without a GPU;
bench/gpu_check.sh runs these on the lent GPU machine."""

from __future__ import annotations

import pytest
import torch

from tests.trainrun import train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GPT = (
    "--model",
    "gpt",
    "--n-layer",
    "2",
    "--d-model",
    "256",
    "--n-head",
    "4",
    "--seq-len",
    "256",
    "--vocab-size",
    "1024",
    "--batch-size",
    "8",
    "--steps",
    "20",
    "--log-interval",
    "5",
    "--synthetic-samples",
    "256",
)


def gpu_env() -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": "0"}


def test_nccl_fsdp_bf16_trains_and_reports_mfu_and_memory(tmp_path):
    run = train(
        tmp_path / "r",
        *GPT,
        "--parallel",
        "fsdp",
        "--mixed-precision",
        "bf16",
        nproc=1,
        env=gpu_env(),
    )
    s = run.summary
    assert s["backend"] == "nccl"
    assert s["final_loss"] < s["first_loss"]
    assert 0 < s["mfu"] < 1
    assert s["max_mem_allocated_bytes"] > 0
    assert s["max_mem_reserved_bytes"] >= s["max_mem_allocated_bytes"]


def test_compile_and_activation_checkpointing_match_eager(tmp_path):
    base = train(tmp_path / "eager", *GPT, "--eval", nproc=1, env=gpu_env()).summary
    ac = train(tmp_path / "ac", *GPT, "--activation-checkpointing", nproc=1, env=gpu_env()).summary
    comp = train(tmp_path / "compile", *GPT, "--compile", nproc=1, env=gpu_env()).summary
    # TF32 and fused kernels differ in rounding: compare losses, not bits.
    assert ac["final_loss"] == pytest.approx(base["final_loss"], rel=1e-3)
    assert comp["final_loss"] == pytest.approx(base["final_loss"], rel=2e-2)
    assert ac["max_mem_allocated_bytes"] < base["max_mem_allocated_bytes"]

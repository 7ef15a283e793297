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


def test_an_async_save_on_cuda_copies_after_the_work_queued_before_it(tmp_path):
    """The staging copy runs on a stream of its own, while the loop's stream may still be
    running what was queued before save() (the optimizer step) and runs the next forward
    beside the copy. Queued here before each save: a ~0.1 s kernel, then +1 on every
    parameter and buffer; after it, a training forward that changes BatchNorm's statistics.
    Each checkpoint must hold the +1 values: not the older ones, nor the forward's. On an H200
    with torch 2.11 this failed at the second save (the stager closed after each stage,
    ckpt.staging) and passed without the stream wait: the test below shows that one."""
    import torch.distributed as dist
    from ddpkit.train.ckpt import Checkpointer, ModelState

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.BatchNorm1d(4096))
        model.cuda()
        x = torch.randn(64, 4096, device="cuda")
        ck = Checkpointer(str(tmp_path / "ck"), 2, True, lambda m: None)
        for step in (1, 2):  # the first save allocates the pinned buffers, the second reuses them
            model(x)  # statistics that differ from their initial values
            before = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # synchronises
            with torch.no_grad():
                torch.cuda._sleep(200_000_000)  # ~0.1 s at ~2 GHz, ahead of the changes
                for v in model.state_dict().values():
                    v.add_(1)
            ck.save(step, {"model": ModelState(model)}, {"step": step})
            model(x * 3 + 1)  # the next step's forward, before the fence
            ck.wait_staging()
            ck.wait()
            fresh = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.BatchNorm1d(4096))
            got = ck.resume("auto", {"model": ModelState(fresh)})
            assert got is not None and got[0].name == f"step-{step}"
            for k, v in fresh.state_dict().items():
                assert torch.equal(v, before[k] + 1), (step, k)
        ck.close()
    finally:
        dist.destroy_process_group()


def test_the_staging_copy_on_cuda_waits_for_the_kernels_queued_before_the_save():
    """Through the stager alone (the save path around it may synchronise by chance, as the
    test above did on an H200): a ~0.2 s kernel and then +1 are queued on the loop's stream,
    the save marks that point, and the copy, which runs on the stager's own stream, must hold
    the +1 value. Without the mark it finished in ~2 ms with the value of the save before."""
    from ddpkit.train.ckpt.staging import background_stager, mark_taken, release_stager

    stager = background_stager(cuda=True)
    try:
        x = torch.ones(1 << 24, device="cuda")
        stager.stage({"x": x}).result()  # allocates and pins the host buffer (synchronises)
        for want in (2.0, 3.0):
            torch.cuda._sleep(400_000_000)
            x.add_(1)
            mark_taken(stager)
            got = stager.stage({"x": x}).result()["x"]
            assert got[0].item() == got[-1].item() == want
    finally:
        release_stager(stager)

"""Multi-process training with real torchrun and gloo: learning, equivalence, memory, MNIST."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from tests.trainrun import ROOT, full_params, last_checkpoint, train

pytestmark = pytest.mark.slow

# fp32, AdamW, a fixed number of steps: the runs the equivalence and memory tests compare.
COMMON = (
    "--model",
    "mlp",
    "--steps",
    "12",
    "--lr",
    "3e-3",
    "--log-interval",
    "4",
    "--optimizer",
    "adamw",
    "--synthetic-samples",
    "4096",
    "--no-eval",
)


def assert_same_params(a: dict, b: dict, atol: float = 2e-5) -> None:
    assert a.keys() == b.keys()
    for k in a:
        diff = (a[k].float() - b[k].float()).abs().max().item()
        assert diff <= atol, f"{k}: max |diff| {diff:.3g} > {atol}"


def test_default_run_learns(tmp_path):
    run = train(tmp_path / "default", "--config", str(ROOT / "configs/default.toml"), nproc=2)
    s = run.summary
    assert s["world_size"] == 2 and s["steps"] == 300
    assert s["final_loss"] < 0.1 * s["first_loss"]
    assert s["eval_accuracy"] > 0.9
    losses = [m["loss"] for m in run.metrics()]
    assert losses[-1] < losses[0]
    assert (run.run_dir / "config.json").is_file()
    assert (last_checkpoint(run.run_dir) / ".complete").is_file()


def test_ddp_two_ranks_equals_one_process_with_double_batch(tmp_path):
    one = train(tmp_path / "one", *COMMON, "--batch-size", "32")
    two = train(tmp_path / "two", *COMMON, "--batch-size", "16", nproc=2)
    assert one.summary["global_batch"] == two.summary["global_batch"] == 32
    assert_same_params(
        full_params(last_checkpoint(one.run_dir)), full_params(last_checkpoint(two.run_dir))
    )
    # and training moved the weights: the comparison is not of two untouched inits
    assert one.summary["final_loss"] < one.summary["first_loss"]


STRATEGIES = {
    "ddp": ("--parallel", "ddp"),
    "full": ("--parallel", "fsdp", "--sharding", "FULL_SHARD"),
    "grad_op": ("--parallel", "fsdp", "--sharding", "SHARD_GRAD_OP"),
    "hybrid": ("--parallel", "fsdp", "--sharding", "HYBRID_SHARD", "--replicate-degree", "2"),
    "no_shard": ("--parallel", "fsdp", "--sharding", "NO_SHARD"),
}


@pytest.fixture(scope="module")
def four_rank_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("four")
    return {
        name: train(root / name, *COMMON, "--batch-size", "8", *flags, nproc=4)
        for name, flags in STRATEGIES.items()
    }


@pytest.mark.parametrize("name", ["full", "grad_op", "hybrid", "no_shard"])
def test_fsdp_strategies_match_ddp_on_four_ranks(four_rank_runs, name):
    ddp = full_params(last_checkpoint(four_rank_runs["ddp"].run_dir))
    other = full_params(last_checkpoint(four_rank_runs[name].run_dir))
    assert_same_params(ddp, other)
    assert four_rank_runs[name].summary["world_size"] == 4


def _total(run) -> list[int]:
    return [r["total"] for r in run.summary["state_bytes_per_rank"]]


@pytest.mark.parametrize("name,fraction", [("full", 1 / 4), ("hybrid", 1 / 2), ("no_shard", 1)])
def test_per_rank_state_bytes_follow_zero(four_rank_runs, name, fraction):
    ddp = _total(four_rank_runs["ddp"])
    psi = four_rank_runs["ddp"].summary["num_params"]
    assert ddp[0] == pytest.approx(16 * psi, rel=0.01)  # fp32 AdamW: 4+4+8 bytes/param
    for got in _total(four_rank_runs[name]):
        assert got == pytest.approx(ddp[0] * fraction, rel=0.05)


def _write_idx(path, arr: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    path.write_bytes(gzip.compress(header + arr.astype(np.uint8).tobytes()))


def test_mnist_path_on_small_idx_files(tmp_path):
    raw = tmp_path / "data/MNIST/raw"
    raw.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    protos = (torch.rand(10, 28, 28, generator=g) > 0.7).numpy() * 200
    for stem, n in (("train", 640), ("t10k", 160)):
        y = np.arange(n) % 10
        x = np.clip(protos[y] + np.random.default_rng(1).integers(0, 55, (n, 28, 28)), 0, 255)
        _write_idx(raw / f"{stem}-images-idx3-ubyte.gz", x)
        _write_idx(raw / f"{stem}-labels-idx1-ubyte.gz", y)
    run = train(
        tmp_path / "run",
        "--config",
        str(ROOT / "configs/mnist_ddp.toml"),
        "--data-dir",
        str(tmp_path / "data"),
        "--no-download",
        "--epochs",
        "2",
    )
    s = run.summary
    assert s["steps"] == 2 * (640 // 64)
    assert s["final_loss"] < s["first_loss"] and s["eval_accuracy"] > 0.5


def test_mnist_missing_files_says_where_to_put_them(tmp_path):
    run = train(
        tmp_path / "run",
        "--dataset",
        "mnist",
        "--data-dir",
        str(tmp_path / "none"),
        "--no-download",
        check=False,
    )
    assert run.rc == 2 and "Traceback" not in run.out
    # refused by the config check, before any rank looks for the files
    assert f"--data-dir {tmp_path / 'none'} does not exist and --no-download is set" in run.out


def test_activation_checkpointing_changes_memory_not_results(tmp_path):
    args = (
        "--model",
        "gpt",
        "--n-layer",
        "2",
        "--steps",
        "4",
        "--log-interval",
        "2",
        "--synthetic-samples",
        "64",
        "--batch-size",
        "4",
        "--no-eval",
    )
    plain = train(tmp_path / "plain", *args)
    ac = train(tmp_path / "ac", *args, "--activation-checkpointing")
    assert_same_params(
        full_params(last_checkpoint(plain.run_dir)),
        full_params(last_checkpoint(ac.run_dir)),
        atol=1e-6,
    )

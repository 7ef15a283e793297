"""pyproject.toml tells the truth: what the code imports is declared, the bounds hold.

Here the tests that run in this process; those that start processes in
tests/process/launch/test_packaging.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_the_node_image_needs_no_cluster_client():
    core = {_name(r) for r in PROJECT["dependencies"]}
    assert "numpy" in core and "tqdm" in core
    assert not core & {"kubernetes", "submitit", "matplotlib", "wandb", "mlflow", "transformers"}
    extras = PROJECT["optional-dependencies"]
    assert {"k8s", "slurm", "plot", "hf", "logging"} <= set(extras)
    # make setup installs .[dev], which pulls in every extra
    assert "ddpkit[all]" in extras["dev"]
    # `all` is every extra (tensorboard is the old name of part of logging; bench is
    # bench/submit_latency.py's torchx way, left out of make setup on purpose): one added to
    # pyproject but not to `all` would be missing from make setup and the tests.
    assert set(re.search(r"\[(.*)\]", extras["all"][0]).group(1).split(",")) == set(extras) - {
        "all",
        "dev",
        "tensorboard",
        "bench",
    }
    assert {_name(r) for r in extras["bench"]} == {"torchx-nightly"}
    assert {"ft", "s3"} <= set(extras)  # torchft, and s3fs/fsspec for ckpt_dir = "s3://..."


def test_bounds_match_what_the_code_uses():
    # tomllib (train/config.py) is 3.11+; torchrun --signals-to-handle is torch 2.9+
    assert PROJECT["requires-python"] == ">=3.11"
    torch_req = next(r for r in PROJECT["dependencies"] if _name(r) == "torch")
    assert ">=2.9" in torch_req
    # Every backend launches through the node launcher, which sets torchrun's signals.
    assert (
        "args.signals_to_handle = TORCHRUN_SIGNALS"
        in (ROOT / "train" / "launch" / "node.py").read_text()
    )


def test_license_is_named_in_both_places():
    assert PROJECT["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")

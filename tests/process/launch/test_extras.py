"""The extras install what the libraries they name need to do the documented work: a user's
`transformers.Trainer` script runs after `pip install 'ddpkit[hf]'`."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _lower_bound(extra: str, dist: str) -> str | None:
    for req in EXTRAS[extra]:
        m = re.fullmatch(rf"{re.escape(dist)}\s*(?:>=\s*([\w.]+))?.*", req.split(";")[0].strip())
        if m:
            return m.group(1) or "0"
    return None


def test_the_hf_extra_holds_the_accelerate_that_transformers_trainer_requires():
    """transformers declares the accelerate its Trainer needs (its dependency table); the hf
    extra installs it, at that version or newer."""
    pytest.importorskip("transformers", reason="the hf extra is not installed here")
    from packaging.version import Version
    from transformers.dependency_versions_table import deps

    needed = re.fullmatch(r"accelerate>=([\w.]+)", deps["accelerate"])
    assert needed, deps["accelerate"]
    ours = _lower_bound("hf", "accelerate")
    assert ours is not None, f"the hf extra lacks accelerate: {EXTRAS['hf']}"
    assert Version(ours) >= Version(needed.group(1)), (ours, deps["accelerate"])


def test_a_transformers_trainer_builds_with_the_hf_extra(tmp_path):
    """What a user's Trainer script does first: TrainingArguments and Trainer on a tiny model."""
    pytest.importorskip(
        "accelerate",
        reason="accelerate is not installed in this venv (declared in the hf extra; "
        "`pip install -e '.[hf]'` brings it)",
    )
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16))
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    assert Trainer(model=model, args=args).model is model

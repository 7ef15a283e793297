"""Whether a checkpoint fits this run, decided in-process from the checkpoint's metadata (no
processes, no files): the model's shapes, the optimizer's kind, plain values added or dropped
since it was written, parts an older version kept elsewhere, and what a failed load says."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ddpkit.train.ckpt import compat, layout
from ddpkit.train.ckpt.io import ChecksumError
from ddpkit.train.ckpt.parts import Values
from ddpkit.train.errors import ConfigError

from tests.badjson import MARKER, marker_cases

CKPT = Path("/ckpt/step-8")


def meta_of(**tensors: torch.Tensor) -> dict[str, SimpleNamespace]:
    """DCP's state_dict_metadata for these keys: what a load reads before any tensor."""
    return {
        k.replace("__", "."): SimpleNamespace(size=torch.Size(t.shape)) for k, t in tensors.items()
    }


def test_the_same_model_fits_and_another_shape_is_named() -> None:
    model = {"w": torch.zeros(4, 8), "b": torch.zeros(4)}
    meta = meta_of(model__w=torch.zeros(4, 8), model__b=torch.zeros(4))
    compat.check_compatible(CKPT, model, meta, {"model": "mlp"})  # fits: no error

    wider = {"w": torch.zeros(4, 16), "b": torch.zeros(4)}
    with pytest.raises(ConfigError) as e:
        compat.check_compatible(CKPT, wider, meta, {"model": "mlp"})
    msg = str(e.value)
    assert "holds a different model (mlp" in msg
    assert "model.w: (4, 8) vs (4, 16)" in msg
    assert "--resume never" in msg  # the fix is named


def test_a_missing_or_extra_parameter_is_a_different_model() -> None:
    meta = meta_of(model__w=torch.zeros(2))
    with pytest.raises(ConfigError, match=r"first differences: model\.extra"):
        compat.check_compatible(CKPT, {"w": torch.zeros(2), "extra": torch.zeros(1)}, meta, {})


def test_another_optimizer_kind_is_refused_with_the_reset_flag() -> None:
    sgd = {"state": {0: {"momentum_buffer": torch.zeros(1)}}}
    adam_meta = {
        "optim.state.w.exp_avg": None,
        "optim.state.w.exp_avg_sq": None,
        "optim.state.w.step": None,
    }
    with pytest.raises(ConfigError) as e:
        compat.check_optimizer(CKPT, sgd, adam_meta, {"optimizer": "adamw"})
    assert "holds the state of adamw (exp_avg, exp_avg_sq, step)" in str(e.value)
    assert "keeps momentum_buffer" in str(e.value) and "--reset-optimizer" in str(e.value)
    # the same kind, or a fresh optimizer without state yet: nothing to refuse
    compat.check_optimizer(CKPT, {"state": {}}, adam_meta, {})
    adam = {"state": {0: {"exp_avg": 0, "exp_avg_sq": 0, "step": 0}}}
    compat.check_optimizer(CKPT, adam, adam_meta, {})


def test_plain_values_added_since_keep_their_fresh_value_and_dropped_ones_are_read() -> None:
    part = Values(lambda: {}, lambda _: None)
    states = {"train": part}
    state = {"train": {"step": 0, "peak_lr": 0.1, "new_key": 7}}
    meta = {"train.step": None, "train.peak_lr": None, "train.old_key": None}
    added = compat.plain_values_as_saved(states, state, meta)
    assert added == ["train.new_key"]  # the warning names it
    assert state["train"] == {"step": 0, "peak_lr": 0.1, "old_key": None}  # as saved


def test_a_part_an_older_version_kept_inside_another_is_found_there() -> None:
    states = {"sampler": object(), "train": object()}
    meta = {"train.epoch": None, "train.consumed": None, "train.step": None}
    assert compat.moved_parts(states, {"train": {}}, meta, present={"train"}) == {"sampler"}
    # a checkpoint that has the part under its own name: nothing moved
    meta["sampler.epoch"] = None
    assert compat.moved_parts(states, {"train": {}}, meta, present={"train", "sampler"}) == set()


def test_a_failed_load_says_the_first_ranks_error_and_a_checksum_failure_wins() -> None:
    boom = RuntimeError("unpickling failed\nsecond line")
    bad = ChecksumError("__1_0.distcp: CRC-32 0000beef, written deadbeef")
    gathered = SimpleNamespace(failures={1: (bad, None), 0: (boom, None)})
    assert compat.describe(gathered) == "rank 0: RuntimeError: unpickling failed"
    assert compat.checksum_problem(gathered) == str(bad)
    assert compat.checksum_problem(boom) is None
    assert compat.describe(ValueError("")) == "ValueError: ValueError"


@pytest.mark.parametrize(
    "marker,metadata,complete",
    [
        ('{"step": 3}', True, True),
        ('{"step": 3}', False, False),  # DCP's .metadata missing: an interrupted save
        ("[1, 2]", True, False),  # JSON of another shape
        ("not json", True, False),
        (None, True, False),
    ],
)
def test_what_a_complete_checkpoint_is(tmp_path: Path, marker, metadata, complete) -> None:
    step = tmp_path / "step-3"
    step.mkdir()
    if marker is not None:
        (step / ".complete").write_text(marker)
    if metadata:
        (step / ".metadata").write_bytes(b"")
    assert layout.is_complete(step) is complete
    assert (layout.list_checkpoints(tmp_path)[0] == [step]) is complete


MARKERS = marker_cases()


@pytest.mark.parametrize("label", list(MARKERS))
def test_a_marker_of_another_shape_makes_an_incomplete_step_dir_saying_why(tmp_path, label):
    """The campaign's case (records that are numbers) and every other damage: skipped with a
    one-phrase reason by everything that reads markers, never an AttributeError later."""
    step = tmp_path / "step-6"
    step.mkdir()
    (step / ".metadata").write_bytes(b"")
    (step / ".complete").write_bytes(MARKERS[label])
    info, why = layout.marker(step)
    assert info is None and why.startswith("bad .complete marker: ") and "\n" not in why, why
    assert layout.why_incomplete(step) == why
    assert layout.verify(step) == why
    assert layout.list_checkpoints(tmp_path) == ([], [step])


def test_the_marker_as_written_is_complete(tmp_path):
    """The counterpart of the damages above: the undamaged marker passes."""
    step = tmp_path / "step-6"
    step.mkdir()
    (step / ".metadata").write_bytes(b"")
    (step / ".complete").write_text(json.dumps(MARKER))
    assert layout.marker(step) == (MARKER, None)
    assert layout.list_checkpoints(tmp_path) == ([step], [])

"""A run dir belongs to one job: unnamed runs take their entry point's name, so the kit's
trainer and a user's fit() script never share (and silently resume) one run dir."""

from __future__ import annotations

import sys

import pytest
from ddpkit.train.config import entry_name, parse_config


@pytest.mark.parametrize(
    ("argv0", "name"),
    [
        ("/site-packages/ddpkit/train/__main__.py", "train"),  # python -m ddpkit.train
        ("/proj/examples/fit_script.py", "fit_script"),  # a fit() script
        ("-c", "train"),
    ],
)
def test_an_unnamed_run_is_named_after_its_entry_point(argv0, name):
    assert entry_name(argv0) == name


def test_the_trainer_and_a_fit_script_get_different_run_dirs(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/x/ddpkit/train/__main__.py"])
    kit, _ = parse_config(["--steps", "5"], installed=False)
    monkeypatch.setattr(sys, "argv", ["examples/fit_script.py"])
    script, _ = parse_config(["--steps", "5"], installed=False)
    assert (kit.run_dir, script.run_dir) == ("runs/train", "runs/fit_script")
    named, _ = parse_config(["--name", "exp", "--steps", "5"], installed=False)
    assert named.run_dir == "runs/exp" and named.ckpt_dir == "runs/exp/checkpoints"

"""Logging backends, the progress bar, held-out eval, the profiler: read back what was written.

Here the tests that run in this process; those that start processes in
tests/process/train/test_logging_backends.py."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "args,message",
    [
        (["--log-to", "neptune"], "--log-to neptune: unknown neptune; pick from tensorboard"),
        (["--profile-steps", "5-2"], "--profile-steps 5-2: need 1 <= A <= B, got A=5 B=2"),
        (["--profile-steps", "x"], "--profile-steps 'x': write A-B"),
        (["--eval-interval", "-1"], "--eval-interval must be >= 0"),
    ],
)
def test_bad_output_flags(args, message, tmp_path):
    from ddpkit.train.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as e:
        parse_config([*args, "--run-dir", str(tmp_path / "r")])
    assert str(e.value).startswith(message)

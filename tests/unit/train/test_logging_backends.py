"""Logging backends, the progress bar, held-out eval, the profiler: read back what was written.

Here the tests that run in this process; those that start processes in
tests/process/train/test_logging_backends.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trainrun import ROOT, clean_env

HIDE = """
import runpy, sys
class Hide:  # the import system's answer for a package that is not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == {pkg!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Hide())
sys.argv = ["train", *{args!r}]
runpy.run_module("train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    "pkg,args,flag",
    [
        ("wandb", ["--log-to", "mlflow,wandb"], "--log-to wandb"),
        ("tensorboard", ["--tensorboard"], "--tensorboard"),
    ],
)
def test_a_missing_backend_package_is_one_line_before_anything_is_written(
    tmp_path, pkg, args, flag
):
    run_dir = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-c", HIDE.format(pkg=pkg, args=[*args, "--run-dir", str(run_dir)])],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr == (
        f"error: {flag} needs the {pkg} package, which is not installed: pip install {pkg} "
        f"(or pip install -e '.[logging]'), or drop {flag}\n"
    )
    assert not run_dir.exists()


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

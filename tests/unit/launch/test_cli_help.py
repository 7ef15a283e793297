"""What a user sees from --help and from a tool whose output is cut short (`| head -1`).

Here the tests that run in this process; those that start processes in
tests/process/launch/test_cli_help.py."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from ddpkit.train.config import TrainConfig, build_parser

ROOT = Path(__file__).resolve().parents[3]


def _help_entries() -> dict[str, str]:
    """flag -> its help text, from the real `python -m ddpkit.train --help` output."""
    out = subprocess.run(
        [sys.executable, "-m", "ddpkit.train", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    entries = {}
    options = out.stdout.split("\noptions:\n", 1)[1]
    for block in re.split(r"\n(?=  -)", options):
        # "  --flag[, --no-flag] [METAVAR]" then the text, on the same line or wrapped below
        m = re.match(r"\s*(-[-\w]+)(?:, --no-[\w-]+)?(?: \S+)?(?:\s{2,}|\n)(.*)", block, re.S)
        if m:
            entries[m.group(1)] = " ".join(m.group(2).split())
    return entries


def test_booleans_show_both_spellings():
    actions = {a.dest: a for a in build_parser()._actions}
    for f in fields(TrainConfig):
        if f.type in ("bool", bool):
            flag = "--" + f.name.replace("_", "-")
            assert actions[f.name].option_strings == [flag, "--no-" + flag[2:]]
    entries = _help_entries()
    assert entries["--eval"].endswith("(default: on)")
    assert entries["--ckpt-async"].endswith("(default: off)")


def test_a_flag_not_given_does_not_override_the_file(tmp_path):
    from ddpkit.train.config import parse_config

    f = tmp_path / "c.toml"
    f.write_text("batch_size = 7\n")
    cfg, _ = parse_config(["--config", str(f), "--run-dir", str(tmp_path / "r")])
    assert cfg.batch_size == 7


# --- one wrapper for every tool: a closed pipe is a quiet exit ---------------------------

TOOLS = [
    "ddpkit.tools.doctor",
    "ddpkit.tools.planner",
    "ddpkit.tools.commbench",
    "ddpkit.tools.plot",
    "ddpkit.tools.ckpt",
]


def _run_into_closed_pipe(args: list[str]) -> subprocess.CompletedProcess:
    """Run a tool whose stdout is a pipe nobody reads any more (what `| head` leaves)."""
    import os

    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write: EPIPE, deterministically
    try:
        return subprocess.run(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(w)


@pytest.mark.parametrize("tool", TOOLS)
def test_help_into_a_closed_pipe_is_quiet(tool):
    p = _run_into_closed_pipe([tool, "--help"])
    assert p.stderr == "", p.stderr  # no BrokenPipeError traceback, no "Exception ignored"


def test_memory_plan_into_a_closed_pipe_is_quiet():
    p = _run_into_closed_pipe(["ddpkit.tools.planner", "--params", "7e9", "--gpus", "8"])
    assert p.stderr == "" and p.returncode == 1, p.stderr

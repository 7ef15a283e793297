"""Every hint the kit prints names a command and a place that exist: a README/docs section a
message points at is a heading there, a docs/ page exists, and a command is the `ddpkit` one
users have (`ddpkit logs slurm 1 --follow`), not a module path (`python -m ddpkit.tools...`).

Read from every string of the kit's code (messages, help, docstrings shown by --help).

Here the tests that start processes or take longer; the in-process ones in
tests/unit/tools/test_hints.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_tools_help_shows_the_ddpkit_command():
    ddpkit = str(Path(sys.executable).with_name("ddpkit"))
    for tool in ("memory", "ckpt", "doctor", "plot"):
        p = subprocess.run([ddpkit, tool, "--help"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(f"usage: ddpkit {tool}"), p.stdout[:200]
        assert "python -m" not in p.stdout, p.stdout

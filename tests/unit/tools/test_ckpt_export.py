"""`ckpt export` (and `inspect`) of a step dir that its run prunes (--ckpt-keep) while the tool
reads it: after the tool chose it, or while DCP reads its files. One line, exit 2, nothing
written (no output, no OUT.tmp); a read that fails with every file in place keeps its
traceback. The prune is injected at the exact moment around the tool's main (the trainer's own
order: the marker first, then the directory): in this process for the one-line refusals (a new
process imports torch again, seconds of CPU here), by a driver process for the traceback.

Here the tests that run in this process; those that start processes in
tests/process/tools/test_ckpt_export.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_inspect_of_a_file_says_it_is_a_file(tmp_path, one_line_error):
    """`ddpkit ckpt inspect model.pt`: an existing file is not "no such directory"."""
    ddpkit = str(Path(sys.executable).with_name("ddpkit"))
    pt = tmp_path / "model.pt"
    pt.write_bytes(b"not a checkpoint directory")

    def inspect(path: Path) -> str:
        p = subprocess.run([ddpkit, "ckpt", "inspect", str(path)], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        return one_line_error(p)

    line = inspect(pt)
    assert "a file, not a checkpoint directory" in line and "no such directory" not in line
    assert "no such directory" in inspect(tmp_path / "missing")

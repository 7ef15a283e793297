"""The seam every backend shares (ddpkit.tools.backends): the one wait loop, and what it reads
back (job records, the last metrics line) checked for shape.

Here the tests that start processes; the in-process ones in
tests/unit/backends/test_backends.py."""

from __future__ import annotations

import sys

import pytest
from ddpkit.tools.jobspec import SpecError


def test_a_passed_node_env_check_is_remembered_until_the_import_path_changes(tmp_path, monkeypatch):
    """check_node_env imports torch in a fresh Python (seconds on every submit): a pass is
    kept in .ddpkit/checked/, and a torch that shadows the real one in the workspace (first
    on the nodes' import path) is found again, not served from the cache."""
    from ddpkit.tools.backends.node_checks import check_node_env
    from ddpkit.tools.jobspec import load_spec

    (tmp_path / "train.py").write_text("print('hello')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    spec = load_spec(None, ["script=train.py", "module=none"])
    check_node_env(spec, sys.executable, "python")
    (mark,) = (tmp_path / ".ddpkit" / "checked").iterdir()
    check_node_env(spec, sys.executable, "python")  # served from the mark
    assert list((tmp_path / ".ddpkit" / "checked").iterdir()) == [mark]
    # Other files written into a directory on the import path (the checkout, a workspace
    # other work writes into) do not count: only what bears torch's or the kit's name.
    on_path = tmp_path / "on-path"
    on_path.mkdir()
    monkeypatch.syspath_prepend(str(on_path))
    mark.unlink()
    check_node_env(spec, sys.executable, "python")
    (mark,) = (tmp_path / ".ddpkit" / "checked").iterdir()
    (on_path / "notes.txt").write_text("unrelated\n")
    check_node_env(spec, sys.executable, "python")
    assert list((tmp_path / ".ddpkit" / "checked").iterdir()) == [mark]
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('a stray torch')\n")
    with pytest.raises(SpecError, match="torch 'torch' does not import with .*a stray torch"):
        check_node_env(spec, sys.executable, "python")

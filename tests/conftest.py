"""Fixtures the suite shares: the one-line user error every tool prints, fake executables on
PATH, and the launcher run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import testcost
from tests.trainrun import PY, ROOT

# hypothesis keeps its example database and caches in ./.hypothesis: tests write nothing into
# the checkout, so they go to the temp dir (and no database is kept).
os.environ.setdefault(
    "HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "ddpkit-hypothesis")
)
try:
    from hypothesis import settings

    settings.register_profile("ddpkit", database=None)
    settings.load_profile("ddpkit")
except ImportError:
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each test's CPU, when tests/lanes.py asks (DDPKIT_TEST_CPU_DIR), and under the coverage
    run the test each measured line belongs to (tests/testcost.py)."""
    testcost.enter_test(item.nodeid)
    yield from testcost.measure(item.nodeid)


@pytest.fixture(scope="session")
def one_line_error() -> Callable[[subprocess.CompletedProcess[str]], str]:
    """`one_line_error(proc)`: proc exited 2 with exactly one line on stderr and no traceback
    (what every tool's run_cli makes of a UserError); returns that line, without its newline."""

    def check(proc: subprocess.CompletedProcess[str]) -> str:
        err = proc.stderr
        assert proc.returncode == 2, f"exit {proc.returncode}, not 2:\n{proc.stdout}{err}"
        assert "Traceback" not in err, err
        assert err.count("\n") == 1 and err.endswith("\n"), f"not one line on stderr:\n{err}"
        return err[:-1]

    return check


class FakeBin:
    """A directory of fake executables. The `fake_bin` fixture puts one first on PATH (for
    this process and its children); a test that builds its own environment makes one with
    `FakeBin(tmp_path / "bin")` and names `.path` in that environment's PATH."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, script: str) -> Path:
        """Write `script` (with its #! line) as the executable `name`; returns its path."""
        exe = self.path / name
        exe.write_text(script)
        exe.chmod(0o755)
        return exe


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeBin:
    fake = FakeBin(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.path}:{os.environ['PATH']}")
    return fake


@pytest.fixture(scope="session")  # session: module fixtures (a built image) use it too
def launcher() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`launcher(*args, cwd=checkout, env=None, timeout=900)`: `python -m ddpkit.tools.submit
    ARGS` with text output captured; env None inherits this process's environment (fake_bin's
    PATH included), a dict is the whole environment, as for subprocess.run."""

    def run(
        *args: str, cwd: Path | str = ROOT, env: dict[str, str] | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, "-m", "ddpkit.tools.submit", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run

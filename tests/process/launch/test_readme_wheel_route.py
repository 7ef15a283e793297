"""The README's wheel route for a shared read-only checkout builds the wheel it names and
writes nothing into the checkout; the routes it warns about do write there (build/,
*.egg-info: ignored by .gitignore, so `git status --ignored` tells). A throwaway clone of this
repository stands for the checkout; no network (the build uses this venv's setuptools)."""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.unit.launch.test_readme_install import blocks, install_section

REPO = Path(__file__).resolve().parents[3]
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation"]


def clone(dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True, timeout=120)
    return dest


def written(checkout: Path) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--ignored"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.splitlines()


def test_the_readmes_wheel_route_leaves_the_checkout_clean(tmp_path):
    checkout = clone(tmp_path / "ddpkit")
    build, install = blocks(install_section())[1]
    argv = shlex.split(build.replace("/path/to/ddpkit", str(checkout)))
    wheels = tmp_path / "wheels"
    argv[argv.index("~/wheels")] = str(wheels)
    assert argv[:2] == ["pip", "wheel"]
    r = subprocess.run([*PIP_WHEEL, *argv[2:]], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert written(checkout) == []
    (wheel,) = wheels.glob("ddpkit-*.whl")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.name == f"ddpkit-{version}-py3-none-any.whl"
    assert f"$HOME/wheels/{wheel.name}[" in install  # the name the README installs


def test_a_build_from_the_checkout_itself_writes_into_it(tmp_path):
    checkout = clone(tmp_path / "ddpkit")
    r = subprocess.run([*PIP_WHEEL, "--no-deps", "-w", str(tmp_path / "w"), str(checkout)],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert {"!! build/", "!! ddpkit.egg-info/"} <= set(written(checkout))
    said = " ".join(install_section().split())
    assert "builds in the checkout: it writes `build/` and `ddpkit.egg-info/` there" in said

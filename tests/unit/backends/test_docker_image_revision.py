"""The image's REVISION label says "-dirty" for an edit to any folder the image's wheel is
built from (pyproject.toml's package-dir), not only train/ tools/ configs/ docker/."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from ddpkit.docker import image

PYPROJECT = """\
[project]
name = "ddpkit"
readme = "README.md"

[tool.setuptools.package-dir]
"ddpkit" = "ddpkit"
"ddpkit.train" = "train"
"ddpkit.tools" = "tools"
"ddpkit.slurm" = "slurm"
"ddpkit.k8s" = "k8s"
"ddpkit.docker" = "docker"
"ddpkit.configs" = "configs"
"""


@pytest.fixture
def kit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A committed checkout shaped like the kit's, as the image module's kit."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "README.md").write_text("kit\n")
    for folder in ("ddpkit", "train", "tools", "slurm", "k8s", "docker", "configs", "tests"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("x = 1\n")

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "kit")
    monkeypatch.setattr(image, "KIT_DIR", tmp_path)
    return tmp_path


def test_a_clean_checkout_is_labelled_by_its_commit(kit: Path) -> None:
    revision = image.kit_revision()
    assert len(revision) == 40 and not revision.endswith("-dirty")


@pytest.mark.parametrize("edited", ["slurm/a.py", "k8s/a.py", "ddpkit/a.py", "train/a.py"])
def test_an_edit_to_any_of_the_wheels_folders_is_dirty(kit: Path, edited: str) -> None:
    (kit / edited).write_text("x = 2\n")
    assert image.kit_revision().endswith("-dirty")


def test_a_new_file_in_a_package_dir_is_dirty_and_an_edit_outside_the_image_is_not(
    kit: Path,
) -> None:
    (kit / "tests" / "a.py").write_text("x = 2\n")  # not in the image
    assert not image.kit_revision().endswith("-dirty")
    (kit / "k8s" / "new.py").write_text("y = 1\n")
    assert image.kit_revision().endswith("-dirty")

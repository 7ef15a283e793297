"""Code shipping: the user's image FROM the ddpkit image (tools/backends/user_image.py), its
generated Containerfile checked by hadolint, bad input refused, and built and run with podman:
a plain torchrun script that knows nothing of ddpkit, with a dependency from its requirements
file, runs on 2 gloo ranks in the built image.

Here the tests that run in this process; those on a real container engine (podman builds and
runs the image) in tests/engines/container/test_docker_user.py.

The tests of this file that start processes or take longer:
tests/process/backends/test_docker_user.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ddpkit.tools.backends import user_image as docker_user
from ddpkit.tools.jobspec import load_spec
from ddpkit.tools.templating import KIT_DIR as REPO_ROOT


def _spec(*sets: str):
    return load_spec(REPO_ROOT / "configs/default.toml", list(sets))


def test_containerfile_copies_the_code_where_relative_paths_expect_it():
    spec = _spec("image=me/proj:1", "docker.user_dir=examples/mypkg",
                 "docker.requirements=examples/mypkg/requirements.txt")  # fmt: skip
    text = docker_user.containerfile(spec)
    assert "COPY user/ /workspace/examples/mypkg/" in text
    assert text.index("COPY user/") < text.index("RUN python -m pip install --no-cache-dir")
    assert text.rstrip().endswith("USER ${UID}:${GID}")  # back to the non-root user
    argv = docker_user.build_argv("podman", spec, Path("/ctx"), 1234, 99)
    assert argv[argv.index("-t") + 1] == "me/proj:1"
    assert "KIT_IMAGE=ddpkit:latest" in argv and "UID=1234" in argv and argv[-1] == "/ctx"


def test_hadolint_passes_on_the_generated_containerfile(tmp_path):
    spec = _spec("image=me/proj:1", "docker.user_dir=examples/mypkg",
                 "docker.requirements=examples/mypkg/requirements.txt")  # fmt: skip
    path = tmp_path / "Containerfile"
    path.write_text(docker_user.containerfile(spec))
    hadolint = Path(sys.executable).parent / "hadolint"
    r = subprocess.run([str(hadolint), str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

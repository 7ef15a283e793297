"""A job whose checkpoints go to an object store, rendered for the container backends: the
credentials reach the container by name only (never a value in the command or manifest), and
the render says in one line where the checkpoints go.

The tests of this file that start processes or take longer:
tests/process/backends/test_objstore_render.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DDPKIT = str(Path(sys.executable).with_name("ddpkit"))
SECRET = "s3cr3t-value-never-rendered"


def _render(tmp_path: Path, backend: str, *sets: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "ddpkit.toml").write_text('name = "s3job"\nscript = "train.py"\n')
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE"}
    cmd = [DDPKIT, "render", backend, *(a for s in sets for a in ("--set", s))]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_docker_passes_the_store_credentials_by_name_only(tmp_path):
    r = _render(tmp_path, "docker", "ckpt_dir=s3://bucket/run")
    assert r.returncode == 0, r.stderr
    assert "DDPKIT_CKPT_DIR=s3://bucket/run" in r.stdout
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        assert f"-e {name} " in r.stdout  # the name: docker takes the value from the caller
    assert SECRET not in r.stdout + r.stderr and "AKIDEXAMPLE" not in r.stdout + r.stderr


def test_docker_still_refuses_a_local_checkpoint_dir_outside_the_mount(tmp_path):
    r = _render(tmp_path, "docker", "ckpt_dir=/tmp/ckpt")
    assert r.returncode == 2 and "outside the mounted runs/ volume" in r.stderr
    assert "AWS_" not in r.stdout

"""Code shipping: the user's image FROM the ddpkit image (tools/backends/user_image.py), its
generated Containerfile checked by hadolint, bad input refused, and built and run with podman:
a plain torchrun script that knows nothing of ddpkit, with a dependency from its requirements
file, runs on 2 gloo ranks in the built image.

Here the tests on a real container engine (podman builds and runs the image); the in-process
ones in tests/unit/backends/test_docker_user.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ddpkit.docker import backend as docker
from ddpkit.tools.jobspec import load_spec
from ddpkit.tools.templating import KIT_DIR as REPO_ROOT

from tests import container_harness as harness

PLAIN_SCRIPT = """\
# A plain torchrun DDP script: no ddpkit import; its one dependency comes from requirements.
import json, os
import torch
import torch.distributed as dist
import userdep

dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
if dist.get_rank() == 0:
    os.makedirs("runs/ship", exist_ok=True)
    with open("runs/ship/result.json", "w") as f:
        json.dump({"world": dist.get_world_size(), "sum": t.item(), "dep": userdep.VALUE,
                   "script": os.path.abspath(__file__)}, f)
dist.destroy_process_group()
"""


def _wheel(path: Path) -> None:
    """A minimal pure-Python wheel `userdep` 0.1 (VALUE = 42), built without a backend."""
    files = {
        "userdep/__init__.py": "VALUE = 42\n",
        "userdep-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: userdep\nVersion: 0.1\n",
        "userdep-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "userdep-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in {**files, "userdep-0.1.dist-info/RECORD": record}.items():
            z.writestr(name, text)


def user_project(root: Path) -> Path:
    """A project of its own: a plain script, a wheel it depends on, its requirements file
    and its job file; its directory is the workspace, which the image holds at /workspace."""
    ship = root / "shipme"
    (ship / "wheels").mkdir(parents=True)
    (ship / "train.py").write_text(PLAIN_SCRIPT)
    _wheel(ship / "wheels" / "userdep-0.1-py3-none-any.whl")
    (ship / "requirements.txt").write_text("wheels/userdep-0.1-py3-none-any.whl\n")  # as here
    (ship / "runs").mkdir()  # outputs of an earlier run here: never shipped
    (ship / "runs" / "stale.txt").write_text("x")
    (ship / "ddpkit.toml").write_text(
        'name = "ship"\nnproc_per_node = 2\naccelerator = "cpu"\nscript = "train.py"\n'
    )
    return ship


def _build_and_run(tmp_path: Path, config: Path | None, sets: list[str]) -> Path:
    """Build the kit image and the user image with the product's CLI (render docker
    --build), then run the product's `docker run` argv (the node launcher, the job's entry
    point) on 2 gloo ranks; returns the host side of the runs volume."""
    base, _ = harness.ensure_base_image(log=lambda m: print(m, file=sys.stderr))
    out = tmp_path / "runs"
    out.mkdir()
    sets = [*sets, "docker.kit_image=localhost/ddpkit:test", "accelerator=cpu",
            f"docker.out_dir={out}"]  # fmt: skip
    cfg = ["--config", str(config)] if config else []
    r = subprocess.run(
        [sys.executable, "-m", "ddpkit.tools.submit", "render", "docker", *cfg,
         *[a for s in sets for a in ("--set", s)], "--build", "--base-image", base],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, env=harness.engine_env(),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    spec = load_spec(config, sets, gpus=2)
    ident = ["podman", "run", "--rm", "--entrypoint", "id", spec.image, "-u"]
    uid = subprocess.run(harness.adapt_run_argv(ident), capture_output=True, text=True,
                         timeout=120).stdout.strip()  # fmt: skip
    if os.geteuid() == 0:  # the volume belongs to the container user, as make docker-run does
        os.chown(out, int(uid), int(uid))
    r = subprocess.run(harness.adapt_run_argv(docker.run_argv(spec)), capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return out


container = pytest.mark.skipif(
    harness.skip_reason() is not None, reason=harness.skip_reason() or ""
)


@container
@pytest.mark.container
@pytest.mark.slow
def test_plain_torchrun_example_runs_in_the_podman_built_user_image(tmp_path):
    """examples/plain_torchrun (knows nothing of ddpkit) as a project of its own: its
    workspace built into an image FROM the ddpkit image and run through the rendered
    `docker run`: the node launcher, its script entry point."""
    import shutil

    proj = tmp_path / "plain-project"
    shutil.copytree(REPO_ROOT / "examples/plain_torchrun", proj)
    out = _build_and_run(tmp_path, proj / "job.toml", ["image=localhost/ddpkit-plain:test"])
    result = json.loads((out / "plain-torchrun" / "result.json").read_text())
    assert result["world_size"] == 2, result


@container
@pytest.mark.container
@pytest.mark.slow
def test_requirements_are_installed_in_the_podman_built_user_image(tmp_path):
    ship = user_project(tmp_path)
    out = _build_and_run(tmp_path, ship / "ddpkit.toml", ["image=localhost/ddpkit-user:test"])
    result = json.loads((out / "ship" / "result.json").read_text())
    assert result == {"world": 2, "sum": 3.0, "dep": 42, "script": "/workspace/train.py"}

"""Code shipping: the user's image FROM the ddpkit image (tools/backends/user_image.py), its
generated Containerfile checked by hadolint, bad input refused, and built and run with podman:
a plain torchrun script that knows nothing of ddpkit, with a dependency from its requirements
file, runs on 2 gloo ranks in the built image.

Here the tests that run in this process; those on a real container engine (podman builds and
runs the image) in tests/engines/container/test_docker_user.py.

Here the tests that start processes or take longer; the in-process ones in
tests/unit/backends/test_docker_user.py."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("sets", "expect"),
    [
        (["docker.user_dir=mypkg"], "is the ddpkit image itself"),
        (["image=me/p:1", "docker.user_dir=../elsewhere"], "is outside the workspace"),
        (["image=me/p:1", "docker.user_dir=/elsewhere"], "is outside the workspace"),
        (["image=me/p:1", "docker.user_dir=runs/code"], "where a volume is mounted"),
        (["image=me/p:1", "docker.user_dir=mypkg", "docker.kit_image=-x"], "not an image"),
    ],
)
def test_bad_user_layer_is_one_line_before_anything_runs(sets, expect, launcher, one_line_error):
    args = [a for s in sets for a in ("--set", s)]
    r = launcher("render", "docker", *args, "--build", timeout=120)
    assert expect in one_line_error(r), r.stderr
    assert r.stdout == ""

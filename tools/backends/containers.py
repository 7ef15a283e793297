"""What the container backends (k8s, docker) share: the image's work dir and the rules on it.

CONTAINER_WORKDIR is the one home of `/workspace`, the image's WORKDIR (docker/Dockerfile):
the job's workspace is copied there by `ddpkit build`, and relative run, checkpoint and data
paths resolve against it in every container.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import PurePosixPath

from ddpkit.tools.jobspec import JobSpec, SpecError
from ddpkit.train.contract import is_remote

CONTAINER_WORKDIR = "/workspace"  # the image's WORKDIR (docker/Dockerfile)
SIZE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?([kmgtKMGT]i?[bB]?)?$")  # /dev/shm sizes: 16Gi, 16g
KIT_DIR_IN_IMAGE = "/opt/ddpkit"  # where the image keeps the kit (docker/Dockerfile)
INT32_MAX = 2**31 - 1  # Kubernetes replica counts and many scheduler fields are int32


def check_shm_size(key: str, size: str) -> None:
    if not SIZE_RE.match(size):
        raise SpecError(f"{key} {size!r} does not parse; use e.g. 16Gi / 16g")


def check_ckpt_dir(spec: JobSpec) -> None:
    """A checkpoint dir on a path something else is mounted at: /dev/shm is memory (gone
    with the container), the data volume is read-only, and a volume on the work dir or the
    kit's dir (or above them) would hide what the image put there."""
    ckpt = spec.checkpoint_dir
    if is_remote(ckpt):  # an object store: nothing mounted there
        return
    absolute = posixpath.normpath(posixpath.join(CONTAINER_WORKDIR, ckpt))
    mounts = ("/dev/shm", KIT_DIR_IN_IMAGE, f"{CONTAINER_WORKDIR}/data", CONTAINER_WORKDIR)
    for mounted in mounts:
        below = PurePosixPath(absolute).is_relative_to(mounted) and mounted != CONTAINER_WORKDIR
        if below or PurePosixPath(mounted).is_relative_to(absolute):
            raise SpecError(
                f"ckpt_dir {ckpt!r} ({absolute} in the container) collides with the mounted "
                f"{mounted}; use a directory of its own, e.g. runs/<name>/checkpoints"
            )

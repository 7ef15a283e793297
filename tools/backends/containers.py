"""What the container backends (k8s, docker) share: the image's work dir and their rules.

CONTAINER_WORKDIR is the one home of `/workspace`, the image's WORKDIR (docker/Dockerfile):
the job's workspace is copied there by `ddpkit build`, and relative run, checkpoint and data
paths resolve against it in every container.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import PurePosixPath

from ddpkit.tools.spec import ENV_NAME_RE, SIZE_RE, JobSpec, SpecError

CONTAINER_WORKDIR = "/workspace"  # the image's WORKDIR (docker/Dockerfile)
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
    absolute = posixpath.normpath(posixpath.join(CONTAINER_WORKDIR, ckpt))
    mounts = ("/dev/shm", KIT_DIR_IN_IMAGE, f"{CONTAINER_WORKDIR}/data", CONTAINER_WORKDIR)
    for mounted in mounts:
        below = PurePosixPath(absolute).is_relative_to(mounted) and mounted != CONTAINER_WORKDIR
        if below or PurePosixPath(mounted).is_relative_to(absolute):
            raise SpecError(
                f"ckpt_dir {ckpt!r} ({absolute} in the container) collides with the mounted "
                f"{mounted}; use a directory of its own, e.g. runs/<name>/checkpoints"
            )


def validate_k8s(spec: JobSpec) -> None:
    """The Kubernetes backend's rules on a loaded spec."""
    counts = {"nodes": spec.nodes, "nproc_per_node": spec.nproc_per_node}
    counts |= {"k8s.elastic.max": spec.k8s.elastic.max or 0}
    counts |= {"k8s.backoff_limit": spec.k8s.backoff_limit}
    for key, n in counts.items():
        if n > INT32_MAX:
            raise SpecError(f"{key} = {n} is over {INT32_MAX} (int32, what Kubernetes stores)")
    for name, ref in spec.k8s.secret_env.items():
        secret, _, key = ref.partition("/")
        if not ENV_NAME_RE.match(name) or not secret or not key or "/" in key:
            raise SpecError(
                f'k8s.secret_env {name} = {ref!r}: give NAME = "secret/key" '
                '(e.g. WANDB_API_KEY = "wandb/api-key")'
            )
        if name in spec.env:
            raise SpecError(f"{name} is in both env and k8s.secret_env; keep one")
    check_shm_size("k8s.shm_size", spec.k8s.shm_size)
    e = spec.k8s.elastic
    if (e.min is None) != (e.max is None) or (e.min is not None and not 1 <= e.min <= e.max):
        raise SpecError(
            f"k8s.elastic min={e.min} max={e.max}: set both, with 1 <= min <= max, or neither"
        )
    check_ckpt_dir(spec)


def validate_docker(spec: JobSpec) -> None:
    """The Docker backend's rules on a loaded spec."""
    gpus = spec.docker.gpus
    if gpus is not None and gpus != "all" and not re.fullmatch(r"\d+(,\d+)*", gpus):
        raise SpecError(f'docker.gpus {gpus!r}: use "all" or device ids like "0,1" (or unset)')
    check_shm_size("docker.shm_size", spec.docker.shm_size)
    check_ckpt_dir(spec)

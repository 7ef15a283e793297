"""The Docker engine's options: the job file's [docker] table, its defaults and its rules
(validate_docker, run by DockerBackend.validate for Docker jobs only). Kubernetes ships code
with the same user_dir / requirements / kit_image (tools/backends/user_image.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpkit.tools.backends.containers import check_ckpt_dir, check_shm_size
from ddpkit.tools.jobspec import JobSpec, SpecError


@dataclass
class DockerOptions:
    """The job file's [docker] table."""

    __backend_options__ = True
    shm_size: str = "16g"  # --shm-size (or use --ipc=host)
    data_dir: str | None = None  # host dir mounted read-only at the container's data dir
    out_dir: str | None = None  # host dir mounted for runs/ (outputs and checkpoints)
    extra_args: list[str] = field(default_factory=list)  # extra `docker run` arguments
    # GPUs for the container: unset = as many as processes (`--gpus N`); "all" = every visible
    # GPU, one process each (the entrypoint counts; make docker-run without GPUS); "0,1" =
    # those devices, one process each.
    gpus: str | None = None
    # Code shipping (tools/backends/user_image.py): `render docker --build` builds the ddpkit
    # image as kit_image, then `image` FROM it with user_dir (copied to /workspace/<user_dir>)
    # and the pip requirements file; paths relative to the repository root.
    user_dir: str | None = None
    requirements: str | None = None
    kit_image: str = "ddpkit:latest"


def validate_docker(spec: JobSpec) -> None:
    """The Docker backend's rules on a loaded spec."""
    gpus = spec.docker.gpus
    if gpus is not None and gpus != "all" and not re.fullmatch(r"\d+(,\d+)*", gpus):
        raise SpecError(f'docker.gpus {gpus!r}: use "all" or device ids like "0,1" (or unset)')
    check_shm_size("docker.shm_size", spec.docker.shm_size)
    check_ckpt_dir(spec)

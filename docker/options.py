"""The Docker backend's rules on a job's options."""

from __future__ import annotations

import re

from ddpkit.tools.backends.containers import check_ckpt_dir, check_shm_size
from ddpkit.tools.spec import JobSpec, SpecError


def validate_docker(spec: JobSpec) -> None:
    """The Docker backend's rules on a loaded spec."""
    gpus = spec.docker.gpus
    if gpus is not None and gpus != "all" and not re.fullmatch(r"\d+(,\d+)*", gpus):
        raise SpecError(f'docker.gpus {gpus!r}: use "all" or device ids like "0,1" (or unset)')
    check_shm_size("docker.shm_size", spec.docker.shm_size)
    check_ckpt_dir(spec)

"""The Kubernetes backend's rules on a job's options."""

from __future__ import annotations

from ddpkit.tools.backends.containers import INT32_MAX, check_ckpt_dir, check_shm_size
from ddpkit.tools.spec import ENV_NAME_RE, JobSpec, SpecError


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

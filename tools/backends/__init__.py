"""Backend registry. Each backend is a module imported only when used (submitit and the
kubernetes client are not imported for the other backends). A backend module exposes:

    FILE_EXT: str                                   # of `render --write` output: "sbatch", "yaml"
    render(spec: JobSpec) -> str                    # pure: no subprocess, no environment reads
    submit(spec: JobSpec, opts: Namespace) -> int   # exit status
    status(job: str | None, opts: Namespace) -> int # job None = the last one submitted here
    logs(job: str | None, opts: Namespace) -> int
    cancel(job: str | None, opts: Namespace) -> int
    add_arguments(parser: ArgumentParser) -> None   # optional: backend-only CLI flags
    after_render(spec, opts, text) -> int           # optional: e.g. build an image

`opts` is the CLI's Namespace (opts.spec is the JobSpec when --config was given, else None).
Bad input raises tools.spec.SpecError (exit 2); tools.backends.record_job / last_job keep
"the last job submitted from this checkout".
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from tools.spec import SpecError
from tools.templating import REPO_ROOT

BACKENDS = {
    "slurm": "tools.backends.slurm",
    "k8s": "tools.backends.k8s",
    "docker": "tools.backends.docker",
}
OUT_DIR = REPO_ROOT / "out"


def load_backend(name: str) -> ModuleType:
    if name not in BACKENDS:
        raise SpecError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
    try:
        return importlib.import_module(BACKENDS[name])
    except ModuleNotFoundError as e:
        if e.name != BACKENDS[name]:
            raise
        raise SpecError(f"backend {name!r} is not implemented in this checkout yet") from None


def _last_path(backend: str) -> Path:
    return OUT_DIR / backend / "last_job.json"


def record_job(backend: str, job: str, **info: Any) -> Path:
    """Remember the job submitted last from this checkout (out/<backend>/last_job.json)."""
    path = _last_path(backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"job": job, **info}, indent=2) + "\n")
    tmp.replace(path)
    return path


def last_job(backend: str) -> dict[str, Any]:
    """The record of the last job submitted from here; SpecError when there is none."""
    path = _last_path(backend)
    if not path.is_file():
        raise SpecError(
            f"no {backend} job submitted from this checkout yet ({path} missing); "
            "pass a job id, e.g. make slurm-status JOB=123"
        )
    return json.loads(path.read_text())

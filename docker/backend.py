"""Docker backend: one node, `docker run` of the ddpkit image (podman works the same).

The backend's shape, as every backend: this module holds the Backend subclass; render.py the
pure pieces (spec -> argv); image.py the build; run.py what touches the engine.

    render  the `docker run` command line (pure: built from the JobSpec alone)
    submit  runs it in the foreground; the exit status is the container's (75 = requeue)
    status / logs / cancel   by container name (default: the last job submitted here);
            cancel is `docker stop` with time for the checkpoint the signal triggers
    render --build [--base-image IMG]   also builds the image (make docker-build)

Inside the container the entrypoint (docker/entrypoint.sh) runs the node launcher every
backend runs (python -m ddpkit.train.node) with the flags and the entry point rendered here, the
process count (PET_NPROC_PER_NODE, or one per visible GPU) and --standalone. Relative host
paths (docker.out_dir, docker.data_dir) are relative to the workspace, like every path.
"""

from __future__ import annotations

import argparse
import sys

# The pieces, named here too: `docker.run_argv(spec)`, `docker.poll(name)` read as the
# backend's own words.
from ddpkit.docker.image import (
    add_arguments,
    after_render,
    build,
    build_argv,
    find_engine,
    kit_wheel,
    stage_kit_context,
)
from ddpkit.docker.options import DockerOptions, validate_docker
from ddpkit.docker.render import (
    FILE_EXT,
    gpu_args,
    node_args,
    render,
    run_argv,
    stop_timeout_s,
)
from ddpkit.docker.run import cancel, list_jobs, logs, poll, status, submit
from ddpkit.tools.backends import Backend, JobStatus, user_image
from ddpkit.tools.jobspec import JobSpec

__all__ = [
    "DockerBackend",
    "add_arguments",
    "after_render",
    "build",
    "build_argv",
    "cancel",
    "find_engine",
    "gpu_args",
    "kit_wheel",
    "list_jobs",
    "logs",
    "node_args",
    "poll",
    "render",
    "run_argv",
    "stage_kit_context",
    "status",
    "stop_timeout_s",
    "submit",
]


class DockerBackend(Backend):
    name = "docker"
    file_ext = FILE_EXT
    runs_torchft = True  # as local, inside the container (render.node_args)
    Options = DockerOptions  # the job file's [docker] table
    shares_filesystem = False  # inputs live in the image or its mounts

    def validate(self, spec: JobSpec) -> None:
        super().validate(spec)
        validate_docker(spec)
        note = user_image.code_note(spec)  # the job's code and the image it names
        if note:
            print(note, file=sys.stderr)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)

    def render(self, spec: JobSpec) -> str:
        return render(spec)

    def after_render(self, spec: JobSpec, opts: argparse.Namespace, text: str) -> int:
        return after_render(spec, opts, text)

    def submit(self, spec: JobSpec, opts: argparse.Namespace) -> int:
        return submit(spec, opts)  # in the foreground: it has ended when this returns

    def poll(self, job: str) -> JobStatus:
        return poll(job)

    def status(self, job: str | None, opts: argparse.Namespace) -> int:
        return status(job, opts)

    def logs(self, job: str | None, opts: argparse.Namespace) -> int:
        return logs(job, opts)

    def cancel(self, job: str | None, opts: argparse.Namespace) -> int:
        return cancel(job, opts)

    def list_jobs(self, opts: argparse.Namespace) -> int:
        return list_jobs(opts)

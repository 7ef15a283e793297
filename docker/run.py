"""The container on this machine: run it, look at it, follow its log, stop it."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from ddpkit.docker.image import find_engine
from ddpkit.docker.render import (
    LABEL,
    RUNS,
    STOP_GRACE_S,
    host_path,
    run_argv,
    stop_timeout_s,
)
from ddpkit.tools.backends import JobState, JobStatus, last_job, record_job
from ddpkit.tools.jobspec import JobSpec, SpecError
from ddpkit.tools.templating import shell_quote
from ddpkit.train.contract import DEFAULT_SHUTDOWN_TIMEOUT_S, EXIT_REQUEUE, shutdown_budget_s
from ddpkit.train.jsonshape import Opt

# What submit records and status reads back (last_job checks it).
RECORD = {"engine": Opt((str, None)), "exit_code": Opt(int)}


def prepare_out_dir(spec: JobSpec, engine: str) -> Path:
    """Create the host side of the runs volume so the engine does not (as root), owned by
    the image's user when we are root (a container user can't write a root-owned dir)."""
    out_dir = host_path(spec.docker.out_dir or RUNS)
    out_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        user = subprocess.run(
            [engine, "image", "inspect", "--format", "{{.Config.User}}", spec.image],
            capture_output=True,
            text=True,
        )
        uid, _, gid = user.stdout.strip().partition(":")
        if user.returncode == 0 and uid.isdigit() and uid != "0":
            os.chown(out_dir, int(uid), int(gid) if gid.isdigit() else int(uid))
    return out_dir


def gpus_visible() -> bool:
    """Whether this machine has an NVIDIA GPU the engine could hand to the container (the
    question `make docker-run` asks too)."""
    try:
        probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def for_this_machine(spec: JobSpec) -> JobSpec:
    """A GPU job on a machine without GPUs runs its processes on the CPU (gloo), said in one
    line, instead of the engine refusing devices it does not have (podman: `unresolvable CDI
    devices`, exit 126). Render stays the job as written."""
    if spec.accelerator != "gpu" or gpus_visible():
        return spec
    n = spec.nproc_per_node
    print(
        f"ddpkit: no GPU visible here (nvidia-smi -L); the container runs {n} process(es) on "
        'the CPU (gloo), as accelerator = "cpu" says',
        file=sys.stderr,
    )
    tables = {**spec.backend_options, "docker": replace(spec.docker, gpus=None)}
    return replace(spec, accelerator="cpu", backend_options=tables)


def submit(spec: JobSpec, opts: argparse.Namespace) -> int:
    engine = find_engine(getattr(opts, "engine", None))
    spec = for_this_machine(spec)
    argv = run_argv(spec, engine)
    prepare_out_dir(spec, engine)
    info = {"engine": engine, "image": spec.image, "run_dir": spec.run_dir}
    record_job("docker", spec.name, **info)
    print("+ " + " ".join(shell_quote(a) for a in argv), file=sys.stderr)
    try:
        rc = subprocess.run(argv).returncode
    except KeyboardInterrupt:  # the engine forwards Ctrl-C; report its status
        rc = 130
    record_job("docker", spec.name, **info, exit_code=rc)
    return rc


def poll(job: str) -> JobStatus:
    """Running while the container exists (it is removed at the end), then the exit status
    this checkout recorded, if it ran the job."""
    rec: dict = {}
    with contextlib.suppress(SpecError):  # nothing submitted from here yet
        rec = last_job("docker", RECORD)
    engine = rec.get("engine") if rec.get("job") == job else None
    r = subprocess.run(
        [engine or find_engine(), "ps", "-a", "--filter", f"name=^{job}$", "--format",
         "{{.State}}\t{{.Status}}"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    state, _, words = r.stdout.strip().partition("\t")
    if state == "running":
        return JobStatus(job, JobState.RUNNING, detail=f"({words})")
    if state:
        return JobStatus(job, JobState.PENDING, detail=f"({words})")
    code = rec.get("exit_code") if rec.get("job") == job else None
    if code is None:
        return JobStatus(job, JobState.UNKNOWN, detail="(no such container)")
    again = " (saved after a stop signal: run it again to resume)" if code == EXIT_REQUEUE else ""
    return JobStatus(job, JobState.SUCCEEDED if code == 0 else JobState.FAILED, code, again)


def job_and_engine(job: str | None, opts: argparse.Namespace) -> tuple[str, str]:
    if job:
        return job, find_engine(getattr(opts, "engine", None))
    rec = last_job("docker", RECORD)
    return rec["job"], getattr(opts, "engine", None) or rec.get("engine") or find_engine()


def status(job: str | None, opts: argparse.Namespace) -> int:
    name, engine = job_and_engine(job, opts)
    r = subprocess.run(
        [engine, "ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.Names}}\t{{.Status}}"],
        capture_output=True,
        text=True,
    )
    print(r.stdout.strip() or f"{name}: not running (finished containers are removed)")
    return r.returncode


def logs(job: str | None, opts: argparse.Namespace) -> int:
    """The container's output (every rank: torchrun prefixes lines with the rank when
    asked); --follow streams it until the container exits."""
    name, engine = job_and_engine(job, opts)
    follow = ["--follow"] if getattr(opts, "follow", False) else []
    return subprocess.run([engine, "logs", *follow, name]).returncode


def list_jobs(opts: argparse.Namespace) -> int:
    """ddpkit containers on this machine (running ones: finished containers are removed)."""
    engine = find_engine(getattr(opts, "engine", None))
    fmt = "{{.Names}}\t{{.Status}}\t{{.Image}}"
    return subprocess.run(
        [engine, "ps", "-a", "--filter", f"label={LABEL}", "--format", fmt]
    ).returncode


def cancel(job: str | None, opts: argparse.Namespace) -> int:
    """SIGTERM: the job saves a checkpoint and exits 75; SIGKILL only after the grace."""
    name, engine = job_and_engine(job, opts)
    grace = STOP_GRACE_S + shutdown_budget_s(DEFAULT_SHUTDOWN_TIMEOUT_S)
    if opts.spec is not None:
        grace = stop_timeout_s(opts.spec)
    return subprocess.run([engine, "stop", "--time", str(grace), name]).returncode

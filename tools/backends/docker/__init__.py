"""Docker backend: one node, `docker run` of the ddpkit image (podman works the same).

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
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath

from ddpkit.tools.backends import Backend, JobState, JobStatus, last_job, record_job
from ddpkit.tools.backends.containers import CONTAINER_WORKDIR, validate_docker
from ddpkit.tools.backends.docker import user as docker_user
from ddpkit.tools.spec import JobSpec, SpecError
from ddpkit.tools.templating import KIT_DIR, shell_quote
from ddpkit.train.config import TrainConfig
from ddpkit.train.contract import DEFAULT_SHUTDOWN_TIMEOUT_S, EXIT_REQUEUE, shutdown_budget_s

FILE_EXT = "sh"
DOCKERFILE = "docker/Dockerfile"
WORKDIR = PurePosixPath(CONTAINER_WORKDIR)  # relative train paths land here
RUNS = "runs"  # mounted from docker.out_dir; run and checkpoint dirs must be below it
STOP_GRACE_S = 30  # on top of torchrun's shutdown timeout, for the agent and the entrypoint
LABEL = "app.kubernetes.io/instance"  # on every ddpkit container (list), as on k8s objects
DEFAULT_UID = 1000  # the image's user when built by root (never build a root-user image)


# --- render (pure) -----------------------------------------------------------------------


def _host_path(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else Path.cwd() / p  # the workspace (launch.run)


def _under_runs(spec: JobSpec, key: str, value: str) -> None:
    p = PurePosixPath(value)
    if p.is_absolute() or not p.parts or p.parts[0] != RUNS or ".." in p.parts:
        raise SpecError(
            f"docker: {key} {value!r} is outside the mounted {RUNS}/ volume, so it would "
            f"vanish with the container; use a relative path under {RUNS}/ (the host side "
            "is docker.out_dir)"
        )


def stop_timeout_s(spec: JobSpec) -> int:
    """docker stop's grace: torchrun's shutdown timeout (the save must fit) plus a margin."""
    return spec.shutdown_budget_s + STOP_GRACE_S


def gpu_flag(spec: JobSpec) -> str | None:
    """Docker's `--gpus` value: the process count, the listed devices, or all (None on CPU)."""
    if spec.accelerator != "gpu":
        return None
    gpus = spec.docker.gpus
    if gpus is None:
        return str(spec.nproc_per_node)  # a count: the engine picks that many GPUs
    # Docker splits --gpus on commas unless the device list is quoted inside the value.
    return "all" if gpus == "all" else f'"device={gpus}"'


def gpu_args(spec: JobSpec, engine: str) -> list[str]:
    """The GPU flags for the engine. podman has no count form (its --gpus, where it exists,
    takes a device name): the NVIDIA CDI devices, by index."""
    flag = gpu_flag(spec)
    if flag is None:
        return []
    if engine != "podman":
        return ["--gpus", flag]
    gpus = spec.docker.gpus
    if gpus is None:
        ids = [str(i) for i in range(spec.nproc_per_node)]
    else:
        ids = ["all"] if gpus == "all" else gpus.split(",")
    return [a for i in ids for a in ("--device", f"nvidia.com/gpu={i}")]


def nproc(spec: JobSpec) -> int | None:
    """Processes per container; None = one per visible GPU, counted by the entrypoint."""
    gpus = spec.docker.gpus
    if spec.accelerator != "gpu" or gpus is None:
        return spec.nproc_per_node
    return None if gpus == "all" else len(gpus.split(","))


def environment(spec: JobSpec) -> dict[str, str]:
    """Environment of the container: process count, debug preset, NCCL choices, env."""
    n = nproc(spec)
    env = {"PET_NPROC_PER_NODE": str(n)} if n is not None else {}
    env.update(spec.launch_env())
    return env


def run_argv(spec: JobSpec, engine: str = "docker") -> list[str]:
    """The `docker run` command line for the spec. Raises SpecError on what one node can't do."""
    validate_docker(spec)  # pure, like render: a bad spec renders nothing
    if spec.nodes != 1:
        raise SpecError(
            f"docker runs one node, got nodes = {spec.nodes}; use --nodes 1, or the slurm "
            "or k8s backend for several nodes"
        )
    listed = nproc(spec)
    if spec.docker.gpus is not None and spec.nproc_per_node not in (1, listed):
        what = "every visible GPU" if listed is None else f"{listed} device(s)"
        raise SpecError(
            f"docker.gpus = {spec.docker.gpus!r} runs one process per GPU ({what}), but "
            f"nproc_per_node is {spec.nproc_per_node}; drop one of them (make: GPUS=N alone)"
        )
    docker_user.check(spec)
    _under_runs(spec, "train.run_dir", spec.run_dir)
    if spec.ckpt_dir or spec.train.get("ckpt_dir"):
        _under_runs(spec, "ckpt_dir", spec.ckpt_dir or spec.train["ckpt_dir"])
    d = spec.docker
    argv = [engine, "run", "--rm", "--name", spec.name, "--label", f"{LABEL}={spec.name}"]
    argv += gpu_args(spec, engine)
    argv += [
        f"--shm-size={d.shm_size}",  # DataLoader workers and NCCL's shared-memory transport
        "--ulimit",
        "memlock=-1",  # pinned host memory and RDMA registration
        "--ulimit",
        "stack=67108864",
        f"--stop-timeout={stop_timeout_s(spec)}",
    ]
    if spec.mem and spec.mem != "0":
        argv.append(f"--memory={spec.mem}")
    out_dir = _host_path(d.out_dir or RUNS)
    argv += ["-v", f"{out_dir}:{WORKDIR / RUNS}"]
    if d.data_dir:
        data_in = PurePosixPath(spec.train.get("data_dir", TrainConfig.data_dir))
        argv += ["-v", f"{_host_path(d.data_dir)}:{WORKDIR / data_in}:ro"]
    for key, value in environment(spec).items():
        argv += ["-e", f"{key}={value}"]
    argv += list(d.extra_args)
    argv.append(spec.image)
    return argv + node_args(spec)


def node_args(spec: JobSpec) -> list[str]:
    """After the image: the node launcher's flags and the entry point (the entrypoint adds
    the process count and --standalone, which depend on the container)."""
    return spec.node_argv([])[3:]  # without `python -m ddpkit.train.node`


def render(spec: JobSpec) -> str:
    """The command line, one option per line, every word shell-quoted."""
    argv = run_argv(spec)
    lines, i = [" ".join(shell_quote(a) for a in argv[:2])], 2
    image_at = len(argv) - len(node_args(spec)) - 1
    while i < image_at:
        takes_value = argv[i] in ("--name", "--label", "--gpus", "--device", "--ulimit", "-v", "-e")
        lines.append(" ".join(shell_quote(a) for a in argv[i : i + 1 + takes_value]))
        i += 1 + takes_value
    lines.append(" ".join(shell_quote(a) for a in argv[image_at:]))
    return " \\\n    ".join(lines) + "\n"


# --- engine and build ---------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--build", action="store_true", help="render: also build the image")
    p.add_argument("--base-image", help="build: BASE_IMAGE build argument (FROM)")
    p.add_argument(
        "--engine", choices=("docker", "podman"), help="default: docker if its engine answers"
    )
    if "--follow" not in p._option_string_actions:  # the launcher may define it for all
        p.add_argument("-f", "--follow", action="store_true", help="logs: stream to the end")


def find_engine(preferred: str | None = None) -> str:
    """docker when its engine answers, else podman; SpecError when neither is usable."""
    if preferred:
        if not shutil.which(preferred):
            raise SpecError(f"--engine {preferred}: not installed; install it or drop --engine")
        return preferred
    if shutil.which("docker"):
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=60)
        if info.returncode == 0:
            return "docker"
    if shutil.which("podman"):
        return "podman"
    raise SpecError(
        "no container engine: install Docker (and start its daemon) or podman, or pass --engine"
    )


def _git(*args: str) -> str:
    """git in the kit's checkout; "" for an installed kit (its site-packages may sit inside
    the user's own repository, whose revision is not the kit's)."""
    if not (KIT_DIR / "pyproject.toml").is_file():
        return ""
    r = subprocess.run(["git", *args], cwd=KIT_DIR, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def build_argv(
    engine: str,
    image: str,
    base_image: str | None,
    revision: str,
    source: str,
    uid: int,
    gid: int,
    version: str = "",
    context: Path = Path("."),
) -> list[str]:
    """`docker build` for the ddpkit image from a staged context (stage_kit_context)."""
    args = {"REVISION": revision or "unknown", "SOURCE": source or "unknown"}
    if version:
        args["VERSION"] = version
    if base_image:
        args["BASE_IMAGE"] = base_image
    # The container user gets the builder's ids, so bind-mounted run dirs are writable by
    # both; a root builder gets the non-root default instead.
    if uid != 0:
        args.update(UID=str(uid), GID=str(gid))
    argv = [engine, "build", "-f", str(context / DOCKERFILE), "-t", image]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    return argv + [str(context)]


def kit_wheel(dest: Path) -> Path:
    """The ddpkit wheel the image installs: built from the checkout (a development install),
    else the installed distribution's own files packed again (a wheel's RECORD lists them)."""
    dest.mkdir(parents=True, exist_ok=True)
    if (KIT_DIR / "pyproject.toml").is_file():
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        r = subprocess.run([*cmd, "-w", str(dest), str(KIT_DIR)], capture_output=True, text=True)
        if r.returncode:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
            raise SpecError(f"building the ddpkit wheel failed: {tail[0]}")
        return next(dest.glob("ddpkit-*.whl"))
    import importlib.metadata
    import zipfile

    dist = importlib.metadata.distribution("ddpkit")
    tag = "py3-none-any"
    wheel = dest / f"ddpkit-{dist.version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in dist.files or []:
            if f.suffix == ".pyc" or str(f).startswith(".."):
                continue  # caches, and the console script installed outside site-packages
            zf.write(f.locate(), str(f))
    return wheel


def stage_kit_context(ctx: Path) -> None:
    """The ddpkit image's build context: its Dockerfile and entrypoint, the example job
    files, and the ddpkit wheel (nothing else of the checkout or the workspace)."""
    (ctx / "docker").mkdir(parents=True)
    for name in ("Dockerfile", "entrypoint.sh"):
        shutil.copyfile(KIT_DIR / "docker" / name, ctx / "docker" / name)
    # Executable whatever mode the installed copy kept (a wheel's data files need not).
    (ctx / "docker" / "entrypoint.sh").chmod(0o755)
    shutil.copytree(KIT_DIR / "configs", ctx / "configs", ignore=shutil.ignore_patterns("*.py*"))
    kit_wheel(ctx / "wheels")


def build(spec: JobSpec, opts: argparse.Namespace) -> int:
    """Build the ddpkit image; when the job has code of its own (docker_user.wanted), then
    the workspace's image FROM it (docker_user.py)."""
    user = docker_user.wanted(spec)
    if user:
        docker_user.check_files(spec)  # before minutes of building
    engine = find_engine(getattr(opts, "engine", None))
    revision = _git("rev-parse", "HEAD")
    if revision and _git("status", "--porcelain", "--", "train", "tools", "configs", "docker"):
        revision += "-dirty"
    from ddpkit import __version__

    with tempfile.TemporaryDirectory(prefix="ddpkit-kit-") as kit_ctx:
        stage_kit_context(Path(kit_ctx))
        argv = build_argv(
            engine,
            spec.docker.kit_image if user else spec.image,
            getattr(opts, "base_image", None),
            revision,
            _git("remote", "get-url", "origin"),
            os.getuid(),
            os.getgid(),
            __version__,
            context=Path(kit_ctx),
        )
        print("+ " + " ".join(shell_quote(a) for a in argv), file=sys.stderr)
        rc = subprocess.run(argv).returncode
    if rc or not user:
        return rc
    with tempfile.TemporaryDirectory(prefix="ddpkit-user-") as ctx:
        docker_user.stage_context(spec, Path(ctx))
        argv = docker_user.build_argv(engine, spec, Path(ctx), os.getuid(), os.getgid())
        print("+ " + " ".join(shell_quote(a) for a in argv), file=sys.stderr)
        return subprocess.run(argv).returncode


def after_render(spec: JobSpec, opts: argparse.Namespace, text: str) -> int:
    return build(spec, opts) if getattr(opts, "build", False) else 0


# --- submit, status, logs, cancel ----------------------------------------------------------


def prepare_out_dir(spec: JobSpec, engine: str) -> Path:
    """Create the host side of the runs volume so the engine does not (as root), owned by
    the image's user when we are root (a container user can't write a root-owned dir)."""
    out_dir = _host_path(spec.docker.out_dir or RUNS)
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


def submit(spec: JobSpec, opts: argparse.Namespace) -> int:
    engine = find_engine(getattr(opts, "engine", None))
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
        rec = last_job("docker")
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


def _job(job: str | None, opts: argparse.Namespace) -> tuple[str, str]:
    if job:
        return job, find_engine(getattr(opts, "engine", None))
    rec = last_job("docker")
    return rec["job"], getattr(opts, "engine", None) or rec.get("engine") or find_engine()


def status(job: str | None, opts: argparse.Namespace) -> int:
    name, engine = _job(job, opts)
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
    name, engine = _job(job, opts)
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
    name, engine = _job(job, opts)
    grace = STOP_GRACE_S + shutdown_budget_s(DEFAULT_SHUTDOWN_TIMEOUT_S)
    if opts.spec is not None:
        grace = stop_timeout_s(opts.spec)
    return subprocess.run([engine, "stop", "--time", str(grace), name]).returncode


class DockerBackend(Backend):
    name = "docker"
    file_ext = FILE_EXT
    shares_filesystem = False  # inputs live in the image or its mounts

    def validate(self, spec: JobSpec) -> None:
        super().validate(spec)
        validate_docker(spec)
        note = docker_user.code_note(spec)  # the job's code and the image it names
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

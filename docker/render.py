"""The container job as text, by pure functions: `docker run`'s argv from the JobSpec alone."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from ddpkit.docker.options import validate_docker
from ddpkit.tools.backends import user_image
from ddpkit.tools.backends.containers import CONTAINER_WORKDIR
from ddpkit.tools.jobspec import JobSpec, SpecError, node_command
from ddpkit.tools.templating import check_passable, shell_quote
from ddpkit.train.ckpt.store import CREDENTIAL_ENV, is_remote
from ddpkit.train.config import TrainConfig

FILE_EXT = "sh"
DOCKERFILE = "docker/Dockerfile"
WORKDIR = PurePosixPath(CONTAINER_WORKDIR)  # relative train paths land here
RUNS = "runs"  # mounted from docker.out_dir; run and checkpoint dirs must be below it
STOP_GRACE_S = 30  # on top of torchrun's shutdown timeout, for the agent and the entrypoint
LABEL = "app.kubernetes.io/instance"  # on every ddpkit container (list), as on k8s objects
DEFAULT_UID = 1000  # the image's user when built by root (never build a root-user image)


def host_path(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else Path.cwd() / p  # the workspace (submit.run)


def volume(*paths: tuple[str, Path | PurePosixPath], options: str = "") -> str:
    """A `-v host:container[:options]` value. The engine splits it at every ':', so a path
    holding one would be mounted somewhere else: refused, naming the setting."""
    for key, path in paths:
        if ":" in str(path):
            raise SpecError(
                f"{key} {str(path)!r} holds a ':', which docker/podman -v reads as a "
                "separator (the path would not arrive as written); use a path without ':'"
            )
    return ":".join([*(str(p) for _, p in paths), *([options] if options else [])])


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
    user_image.check(spec)
    _under_runs(spec, "train.run_dir", spec.run_dir)
    ckpt = spec.explicit_ckpt_dir
    if ckpt and not is_remote(ckpt):  # an object store's outlives the container by itself
        _under_runs(spec, "ckpt_dir", ckpt)
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
    argv += ["-v", volume(("docker.out_dir", host_path(d.out_dir or RUNS)), ("", WORKDIR / RUNS))]
    if d.data_dir:
        data_in = PurePosixPath(spec.train.get("data_dir", TrainConfig.data_dir))
        argv += ["-v", volume(("docker.data_dir", host_path(d.data_dir)),
                              ("train.data_dir", WORKDIR / data_in), options="ro")]  # fmt: skip
    for key, value in environment(spec).items():
        argv += ["-e", f"{key}={value}"]
    if ckpt and is_remote(ckpt):  # by name: docker passes the caller's values, if set
        argv += [a for name in CREDENTIAL_ENV if name not in spec.env for a in ("-e", name)]
    argv += list(d.extra_args)
    argv.append(spec.image)
    return [check_passable(a) for a in argv + node_args(spec)]


def node_args(spec: JobSpec) -> list[str]:
    """After the image: the node launcher's flags and the entry point (the entrypoint adds
    the process count and --standalone, which depend on the container). fault_tolerance =
    torchft: the replica-group supervisor's whole command, as on the local backend (the
    lighthouse and the groups inside the container; the entrypoint runs a command as given)."""
    torchft = spec.fault_tolerance == "torchft"
    return node_command(spec, bare=not torchft, nproc=nproc(spec) or spec.nproc_per_node)


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

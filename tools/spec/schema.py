"""The job spec every backend renders from: one TOML file (configs/*.toml) plus overrides.

Precedence, stated once: dataclass defaults < the TOML file < `--set key=value` (dotted keys
of the file, e.g. `slurm.partition=gpu`, `train.lr=3e-4`) < `--nodes` / `--gpus`.
`[train]` holds the training flags (ddpkit.train.config.TrainConfig's fields); the backend
sections `[slurm]`, `[k8s]`, `[docker]` hold what only that backend has.

Bad input raises SpecError with the problem and the fix; the CLI prints it on one line and
exits 2. Rendering reads nothing but a JobSpec, so everything a backend needs is here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from ddpkit.train import typed
from ddpkit.train.config import TRAIN_KEYS, ConfigError, TrainConfig, parse_config, read_toml
from ddpkit.train.config import convert_value as _convert_train_value
from ddpkit.train.contract import DEFAULT_SHUTDOWN_TIMEOUT_S, shutdown_budget_s
from ddpkit.train.errors import UserError
from ddpkit.train.typed import at_least, checks, matches, plain_path, port

DebugPreset = Literal["off", "warn", "info", "trace"]

# Names land in file names, SLURM job names, Kubernetes object names and container names.
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MEM_RE = re.compile(r"^[0-9]+[KMGT]?$")
SIZE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?([kmgtKMGT]i?[bB]?)?$")
SBATCH_SIGNALS = ("USR1", "USR2", "TERM")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# [train] keys that mean something for any entry point (the node launcher reads them).
ENTRY_NEUTRAL_TRAIN_KEYS = {"run_dir", "shutdown_timeout_s"}
MAX_SHUTDOWN_S = 86400.0


class SpecError(UserError):
    """A bad job file value, override or combination (one line, exit 2)."""


# --- validators declared on the fields (ddpkit.train.typed): one predicate per rule ---------


def _time_limit(value: str, key: str) -> str | None:
    try:
        parse_time_minutes(value)
    except ValueError:
        return f"{key} {value!r} does not parse; use MM, HH:MM:SS or D-HH:MM:SS (e.g. 02:00:00)"
    return None


def _image_ref(value: str, key: str) -> str | None:
    if value.startswith("-") or not value.strip() or any(c.isspace() for c in value):
        return (
            f"{key} {value!r} is not an image reference (it must not start with '-' or hold "
            "spaces, or an engine reads it as an option); use e.g. registry/ddpkit:1.0"
        )
    return None


def _env_names(value: dict[str, str], key: str) -> str | None:
    bad = [k for k in value if not ENV_NAME_RE.match(k)]
    if bad:
        return f"{key} key {bad[0]!r} is not a variable name; use [A-Za-z_][A-Za-z0-9_]*"
    return None


NAME_CHECK = matches(
    NAME_RE.pattern[1:-1],
    "{key} {value!r} is not safe: use 1-52 lowercase letters, digits and '-', starting and "
    "ending with a letter or digit (e.g. mnist-ddp)",
)


@dataclass
class SlurmSpec:
    __backend_options__ = True  # its field checks run for SLURM jobs only (check_options)
    partition: str | None = None  # -p; unset = the cluster's default partition
    account: str | None = None  # -A
    qos: str | None = None
    constraint: str | None = None  # -C, node features, e.g. "a100|h100"
    exclusive: bool = False  # whole nodes (recommended for multi-GPU training)
    container: Literal["none", "pyxis", "apptainer"] = "none"  # run torchrun inside `image`
    container_mounts: list[str] = field(default_factory=list)  # "host:ctr[:ro]"; cwd is added
    signal: Literal["USR1", "USR2", "TERM"] = "USR1"  # preemption/time-limit warning signal
    # Send `signal` this long before the time limit; the save must fit. Unset: the shutdown
    # budget (train.shutdown_timeout_s, rounded up) + GRACE_MARGIN_S.
    grace_s: int | None = None
    # requeues after "saved, please requeue"; 0 = never requeue
    requeue_limit: int = field(default=3, metadata=checks(at_least(0)))
    # default <run_dir>/slurm: batch and per-node logs
    log_dir: str | None = field(default=None, metadata=checks(plain_path("runs/mine/slurm")))
    # The Python on the nodes (container "none"): default the interpreter that ran `ddpkit
    # submit` (its venv included), found at the same path on the shared filesystem.
    python: str | None = None
    venv: str | None = None  # a virtualenv to activate first on the nodes; unset = none
    setup: list[str] = field(default_factory=list)  # shell lines run first, e.g. "module load cuda"
    extra_sbatch: list[str] = field(default_factory=list)  # extra "#SBATCH" option lines
    # fixed rendezvous port; unset = 20000 + job id % 20000
    rdzv_port: int | None = field(default=None, metadata=checks(port(fix="use 1-65535, or unset")))
    # Names of environment variables passed from the submitting shell (sbatch exports it)
    # and never written into the script, e.g. ["WANDB_API_KEY"]; submit checks they are set.
    secret_env: list[str] = field(default_factory=list)
    # Shared directory where the image is converted once (pyxis: enroot squashfs, apptainer:
    # SIF) and reused by every node and later job; unset = convert on every run.
    image_cache: str | None = None


@dataclass
class ElasticSpec:
    min: int | None = None  # minimum nodes (replicas); unset = not elastic
    max: int | None = None  # maximum nodes


@dataclass
class K8sSpec:
    __backend_options__ = True
    namespace: str = "default"
    api: Literal["pytorchjob", "trainjob"] = "pytorchjob"  # kubeflow.org/v1 or Trainer v2
    # The Kubeflow Trainer release a TrainJob is shaped for (its per-job pod field changed name
    # in 2.1 and 2.2); submit checks it against the cluster's CRD.
    trainer_version: Literal["2.0", "2.1", "2.2", "2.3"] = "2.3"
    elastic: ElasticSpec = field(default_factory=ElasticSpec)
    pvc: str | None = None  # PersistentVolumeClaim mounted for runs/checkpoints
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    priority_class: str | None = None
    service_account: str | None = None
    image_pull_secrets: list[str] = field(default_factory=list)
    queue: str | None = None  # Kueue LocalQueue / Volcano queue name
    scheduler: str | None = None  # schedulerName, e.g. "volcano"
    shm_size: str = "16Gi"  # /dev/shm as a memory-backed emptyDir
    rdma: bool = False  # request RDMA/InfiniBand devices; needs an unlimited memlock (README)
    rdma_resource: str = "rdma/ib"  # the device plugin's RDMA resource, requested when rdma
    pvc_size: str | None = None  # also render the PVC (ReadWriteMany), e.g. "100Gi"
    storage_class: str | None = None  # storageClassName of the rendered PVC
    backoff_limit: int = 3  # runPolicy.backoffLimit: pod restarts before the job fails
    ttl_seconds_after_finished: int | None = 86400  # runPolicy: delete the job this long after
    clean_pod_policy: Literal["None", "Running", "All"] = "Running"  # pods deleted at the end
    # Environment from Kubernetes Secrets: NAME = "secret/key" (secretKeyRef), so the value is
    # never written into the manifest, e.g. WANDB_API_KEY = "wandb/api-key".
    secret_env: dict[str, str] = field(default_factory=dict)


@dataclass
class DockerSpec:
    __backend_options__ = True
    shm_size: str = "16g"  # --shm-size (or use --ipc=host)
    data_dir: str | None = None  # host dir mounted read-only at the container's data dir
    out_dir: str | None = None  # host dir mounted for runs/ (outputs and checkpoints)
    extra_args: list[str] = field(default_factory=list)  # extra `docker run` arguments
    # GPUs for the container: unset = as many as processes (`--gpus N`); "all" = every visible
    # GPU, one process each (the entrypoint counts; make docker-run without GPUS); "0,1" =
    # those devices, one process each.
    gpus: str | None = None
    # Code shipping (tools/backends/docker/user.py): `render docker --build` builds the ddpkit
    # image as kit_image, then `image` FROM it with user_dir (copied to /workspace/<user_dir>)
    # and the pip requirements file; paths relative to the repository root.
    user_dir: str | None = None
    requirements: str | None = None
    kit_image: str = "ddpkit:latest"


@dataclass
class JobSpec:
    # job name: lowercase letters, digits, '-'
    name: str = field(default="default", metadata=checks(NAME_CHECK))
    # The project's root: every relative path of the job (script, run and checkpoint dirs,
    # data, docker.user_dir, ...) is relative to it, and every backend runs the job there.
    # Default: the job file's directory (the current one for the built-in default job); a
    # relative value is relative to the job file's directory. --print-spec shows it resolved.
    workspace: str | None = None
    # container image (docker, k8s, slurm pyxis/apptainer)
    image: str = field(default="ddpkit:latest", metadata=checks(_image_ref))
    nodes: int = field(default=1, metadata=checks(at_least(1, fix="pass --nodes N with N >= 1")))
    # processes per node (one per GPU; gloo processes on CPU); --gpus
    nproc_per_node: int = field(
        default=1,
        metadata=checks(at_least(1, "processes per node", "pass --gpus N with N >= 1")),
    )
    accelerator: Literal["gpu", "cpu"] = "gpu"  # gpu: request one GPU per process; cpu: gloo
    cpus_per_proc: int = field(default=4, metadata=checks(at_least(1)))
    # per node, SLURM style: "64G", "0" = all; unset = site default
    mem: str | None = field(
        default=None,
        metadata=checks(
            matches(
                MEM_RE.pattern[1:-1],
                "{key} {value!r} does not parse; use e.g. 64G, 512M or 0 (all)",
            )
        ),
    )
    # limit: MM, HH:MM:SS, D-HH, D-HH:MM[:SS]
    time: str = field(default="01:00:00", metadata=checks(_time_limit))
    # extra environment for every rank
    env: dict[str, str] = field(default_factory=dict, metadata=checks(_env_names))
    debug: DebugPreset = "off"  # NCCL/torch.distributed debug preset
    nccl_socket_ifname: str | None = None  # NCCL_SOCKET_IFNAME; an exact "=eth0" also sets GLOO's
    nccl_ib_hca: str | None = None  # NCCL_IB_HCA, e.g. "mlx5"
    nccl_ib_disable: bool = False  # NCCL_IB_DISABLE=1 (TCP sockets only)
    # c10d rendezvous port on the head node
    rdzv_port: int = field(default=29500, metadata=checks(port()))
    # torchrun --max-restarts (whole-group restarts on a failure)
    max_restarts: int = field(default=0, metadata=checks(at_least(0)))
    # checkpoint location; default <run_dir>/checkpoints
    ckpt_dir: str | None = field(default=None, metadata=checks(plain_path("runs/mine/ckpt")))
    # The entry point every node runs under torchrun: `python -m ddpkit.train` with the [train]
    # table (the default), or the user's own `module` (python -m) or `script` (a .py path
    # relative to the workspace) with `args`. Flags after `--` on the CLI go to whichever runs.
    module: str | None = None  # e.g. "mypkg.train"
    script: str | None = None  # e.g. "examples/plain_torchrun/ddp_fit.py"
    args: list[str] = field(default_factory=list)  # the user entry point's arguments
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig keys ([train] table)
    train_args: list[str] = field(default_factory=list)  # extra raw flags for the entry point
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    k8s: K8sSpec = field(default_factory=K8sSpec)
    docker: DockerSpec = field(default_factory=DockerSpec)
    # A plugin backend's table ([mine]), typed by its Options when it is the backend acting
    # on the job (else kept as written); not a key of its own in the job file.
    backend_options: dict[str, Any] = field(default_factory=dict, metadata={"internal": True})

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def run_dir(self) -> str:
        """The one run dir of this job, for the trainer and everything around it (node logs,
        markers, plots): the last --run-dir (or --name) in the raw flags after `--`, else
        train.run_dir, else runs/<name>."""
        if self.default_entry:
            given = flag_value(self.train_args, "--run-dir")
            if given is not None:
                return given
            name = flag_value(self.train_args, "--name")
            if name is not None and self.train.get("run_dir") is None:
                return f"runs/{name}"
        return str(self.train.get("run_dir") or f"runs/{self.name}")

    @property
    def time_minutes(self) -> int:
        return parse_time_minutes(self.time)

    def train_argv(self) -> list[str]:
        """`python -m ddpkit.train` flags: the [train] table, name, ckpt_dir, then train_args."""
        args = ["--name", self.name]
        raw = self.train_args
        epochs_only = flag_value(raw, "--epochs") is not None and flag_value(raw, "--steps") is None
        for key, value in self.train.items():
            if key == "name" or (key == "steps" and epochs_only):
                continue  # --epochs after `--` switches the file's steps off (as the trainer does)
            flag = typed.flag(key)
            if isinstance(value, bool):
                args.append(flag if value else typed.no_flag(key))
            elif isinstance(value, dict):  # model_args / dataset_args: the flag takes JSON
                args += [flag, json.dumps(value, separators=(",", ":"))]
            elif value is not None:
                args += [flag, str(value)]
        if self.ckpt_dir:
            args += ["--ckpt-dir", self.ckpt_dir]
        return args + list(self.train_args)

    @property
    def default_entry(self) -> bool:
        """True when the nodes run the kit's trainer (`python -m ddpkit.train`)."""
        return self.module is None and self.script is None

    @property
    def shutdown_timeout_s(self) -> float:
        """Seconds the workers get after a stop signal (train.shutdown_timeout_s)."""
        value = self.train.get("shutdown_timeout_s")
        return DEFAULT_SHUTDOWN_TIMEOUT_S if value is None else float(value)

    @property
    def shutdown_budget_s(self) -> int:
        """torchrun's --shutdown-timeout and the base of every scheduler's grace period."""
        return shutdown_budget_s(self.shutdown_timeout_s)

    def entry_argv(self) -> list[str]:
        """What torchrun starts on every node: `-m ddpkit.train FLAGS`, `-m MODULE ARGS` or `SCRIPT ARGS`."""
        if self.module is not None:
            return ["-m", self.module, *self.args, *self.train_args]
        if self.script is not None:
            return [self.script, *self.args, *self.train_args]
        return ["-m", "ddpkit.train", *self.train_argv()]

    def node_argv(self, rendezvous: list[str], python: str = "python") -> list[str]:
        """The node launcher's command line (train/node.py) with the backend's rendezvous
        flags; every backend runs this, so the contract's flags are written once."""
        return [
            python, "-m", "ddpkit.train.node",
            "--run-dir", self.run_dir,
            "--shutdown-timeout", str(self.shutdown_budget_s),
            *rendezvous,
            f"--max-restarts={self.max_restarts}",
            "--", *self.entry_argv(),
        ]  # fmt: skip

    def debug_env(self) -> dict[str, str]:
        return debug_env(self.debug)

    def launch_env(self) -> dict[str, str]:
        """What every backend exports to every rank: the debug preset, the network choices,
        then the user's `env` (which wins)."""
        env = debug_env(self.debug)
        if self.nccl_socket_ifname:
            env["NCCL_SOCKET_IFNAME"] = self.nccl_socket_ifname
            # gloo (the CPU path, DCP's coordination, async saves) takes one exact interface
            # name; NCCL's prefix ("eth"), exact ("=eth0") and exclusion ("^lo") forms would
            # make it fail, so only a plain exact name is passed on.
            name = self.nccl_socket_ifname.removeprefix("=")
            if self.nccl_socket_ifname.startswith("=") and re.fullmatch(r"[\w.:-]+", name):
                env["GLOO_SOCKET_IFNAME"] = name
        if self.nccl_ib_hca:
            env["NCCL_IB_HCA"] = self.nccl_ib_hca
        if self.nccl_ib_disable:
            env["NCCL_IB_DISABLE"] = "1"
        env.update(self.env)
        return env

    def to_dict(self) -> dict[str, Any]:
        """The spec as a job file would hold it (plugin backends' tables at the top level)."""
        out = dataclasses.asdict(self)
        out.update(out.pop("backend_options"))
        return _drop_none(out)


# --- small pure helpers ------------------------------------------------------------------


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of the last `flag VALUE` or `flag=VALUE` in argv (argparse's rule: the last
    one wins), else None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def debug_env(preset: DebugPreset) -> dict[str, str]:
    """The environment of a debug preset. warn and up also dump the NCCL flight recorder
    when a collective times out, so a hang leaves evidence of which rank stopped where."""
    if preset == "off":
        return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    env = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_DEBUG": "WARN",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_BUFFER_SIZE": "20000",
        "TORCH_DISTRIBUTED_DEBUG": "OFF",
    }
    if preset in ("info", "trace"):
        env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", TORCH_DISTRIBUTED_DEBUG="INFO")
    if preset == "trace":
        env.update(
            NCCL_DEBUG="TRACE",
            NCCL_DEBUG_SUBSYS="ALL",
            TORCH_DISTRIBUTED_DEBUG="DETAIL",
            TORCH_CPP_LOG_LEVEL="INFO",
        )
    return env


_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time_minutes(text: str) -> int:
    """SLURM time formats (sbatch --time) to whole minutes, rounded up; raises ValueError."""
    m = _TIME_RE.match(text.strip())
    if not m or text.strip() in ("", "0"):
        raise ValueError(text)
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        hh, mm, ss = (parts + [0, 0])[:3]
        seconds = int(days) * 86400 + hh * 3600 + mm * 60 + ss
    elif len(parts) == 1:  # MM
        seconds = parts[0] * 60
    elif len(parts) == 2:  # MM:SS
        seconds = parts[0] * 60 + parts[1]
    else:  # HH:MM:SS
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    if seconds <= 0:
        raise ValueError(text)
    return -(-seconds // 60)


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


# --- typed loading -------------------------------------------------------------------------


def _check_value(tp: Any, value: Any, where: str) -> Any:
    """Check one TOML value against a field annotation (ddpkit.train.typed)."""
    return typed.check_value(tp, value, where, SpecError)


def _build(
    cls: type, table: dict[str, Any], where: str, sections: dict[str, type | None] | None = None
) -> Any:
    """A dataclass from its TOML table, every value type-checked (SpecError naming the key).
    sections: at the top level, the plugin backends' tables the file may hold, by name ->
    their Options (typed here), or None (kept as written: another backend's table)."""
    hints = get_type_hints(cls)
    known = typed.keys(cls)
    sections = sections or {}
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        dotted = f"{where}.{key}" if where else key
        if cls is JobSpec and name not in known and key in sections:
            if not isinstance(value, dict):
                raise SpecError(
                    f"[{key}] must be a table (backend {key!r}'s options), got {value!r}"
                )
            opts_cls = sections[key]
            options = _build(opts_cls, value, key) if opts_cls is not None else value
            kwargs.setdefault("backend_options", {})[key] = options
            continue
        if name not in known:
            section = f"[{where}]" if where else "the top level"
            valid = known + sorted(sections) if cls is JobSpec else known
            raise SpecError(f"unknown key {dotted!r}; valid keys in {section}: {', '.join(valid)}")
        if name == "train" and cls is JobSpec:
            kwargs[name] = _check_train(value)
        else:
            kwargs[name] = _check_value(hints[name], value, dotted)
            if cls is JobSpec:  # a backend's table: its backend checks it (check_options)
                typed.run_checks(cls, name, kwargs[name], dotted, SpecError)
    return cls(**kwargs)


def _check_train(table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise SpecError(f"train must be a table of training flags, got {table!r}")
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in TRAIN_KEYS:
            raise SpecError(
                f"unknown key 'train.{key}'; valid keys in [train]: {', '.join(TRAIN_KEYS)}"
            )
        try:
            out[name] = _convert_train_value(name, value, "train")
        except ConfigError as e:
            raise SpecError(str(e)) from None
    return out


# --- overrides -------------------------------------------------------------------------------


def _field_type(path: list[str], sections: dict[str, type | None] | None = None) -> Any:
    """The annotation at a dotted path (train.* from TrainConfig; a plugin backend's table
    from its Options), or raise SpecError."""
    cls: Any = JobSpec
    sections = sections or {}
    dotted, full = ".".join(path), path
    if len(path) > 1 and path[0] in sections and path[0] not in typed.keys(JobSpec):
        if sections[path[0]] is None:
            return Any  # another backend's table: parsed as TOML, checked by its backend
        cls, path = sections[path[0]], path[1:]
        prefix = 1
    else:
        prefix = 0
    for i, part in enumerate(path):
        name = part.replace("-", "_")
        if cls is TrainConfig:
            if name not in TRAIN_KEYS or i != len(path) - 1:
                raise SpecError(
                    f"--set {dotted}: unknown key; valid keys in [train]: " + ", ".join(TRAIN_KEYS)
                )
            return get_type_hints(TrainConfig)[name]
        names = typed.keys(cls)
        if name not in names:
            where = f"[{'.'.join(full[: i + prefix])}]" if i or prefix else "the top level"
            raise SpecError(
                f"--set {dotted}: unknown key {part!r}; valid keys in {where}: " + ", ".join(names)
            )
        tp = TrainConfig if (cls is JobSpec and name == "train") else get_type_hints(cls)[name]
        if i == len(path) - 1:
            return tp  # as annotated: "none" clears an optional field
        tp, _ = typed.unwrap_optional(tp)
        if get_origin(tp) is dict:  # env.FOO=bar, k8s.node_selector.x=y
            if i != len(path) - 2:
                raise SpecError(f"--set {dotted}: too many dots")
            return get_args(tp)[1]
        if not (dataclasses.is_dataclass(tp) or tp is TrainConfig):
            raise SpecError(f"--set {dotted}: {part} is not a table")
        cls = tp
    return cls


def parse_override_value(tp: Any, raw: str) -> Any:
    """A --set value for a field of type tp (ddpkit.train.typed.parse_text)."""
    return typed.parse_text(tp, raw, SpecError)


def apply_override(
    data: dict[str, Any], assignment: str, sections: dict[str, type | None] | None = None
) -> None:
    """Apply one `dotted.key=value` to the raw TOML dict (checked again when built)."""
    key, sep, raw = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError(f"--set {assignment!r}: expected key=value, e.g. --set slurm.partition=gpu")
    path = key.split(".")
    try:
        value = parse_override_value(_field_type(path, sections), raw)
    except SpecError as e:
        if str(e).startswith("--set"):
            raise
        raise SpecError(f"--set {key}: {e}; fix the value") from None
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"--set {key}: {part} is not a table in the file")
        node = child
    node[path[-1]] = value


# --- validation ----------------------------------------------------------------------------


def validate(spec: JobSpec, local_paths: bool = True) -> JobSpec:
    """Checks across fields. Each message names the value and the fix. local_paths: the
    nodes see this machine's files (local, SLURM's shared filesystem), so the training
    inputs are looked up here too; False for container backends."""
    # The single-value rules are declared on the fields (typed.checks) and ran as the
    # spec was built; these are the ones across fields.
    _validate_entry(spec)
    _validate_train(spec, local_paths)
    return spec  # each backend's own rules: Backend.validate (tools/backends/)


def _validate_entry(spec: JobSpec) -> None:
    if spec.module is not None and spec.script is not None:
        raise SpecError(
            f"module = {spec.module!r} and script = {spec.script!r}: set one entry point, not both"
        )
    if spec.module is not None and not MODULE_RE.match(spec.module):
        raise SpecError(
            f"module {spec.module!r} is not a Python module path; use dotted names, e.g. "
            '"mypkg.train" (what `python -m` takes)'
        )
    if spec.script is not None and (
        not spec.script.strip() or spec.script.startswith("-") or "\n" in spec.script
    ):
        raise SpecError(
            f"script {spec.script!r} is not a script path; use a .py path relative to the "
            'workspace (the job file\'s directory), e.g. "train.py"'
        )
    if spec.default_entry and spec.args:
        raise SpecError(
            "args are the arguments of your own module/script; the kit trainer's flags go in "
            "[train] (or after --): set module or script, or move them"
        )
    if not spec.default_entry:
        extra = sorted(set(spec.train) - ENTRY_NEUTRAL_TRAIN_KEYS)
        if extra:
            raise SpecError(
                f"[train] {', '.join(extra)}: the kit trainer's flags do not reach your "
                f"{'module' if spec.module else 'script'}; pass them in args = [...] "
                f"([train] keeps only {', '.join(sorted(ENTRY_NEUTRAL_TRAIN_KEYS))} here)"
            )


def _validate_train(spec: JobSpec, local_paths: bool = True) -> None:
    for key in ("run_dir", "ckpt_dir"):
        value = spec.train.get(key)
        if isinstance(value, str) and ("\n" in value or value.startswith("-")):
            raise SpecError(
                f"train.{key} {value!r} starts with '-' or contains a newline; use a plain "
                "path (e.g. runs/mine)"
            )
    timeout = spec.shutdown_timeout_s
    if not math.isfinite(timeout) or timeout <= 0 or timeout > MAX_SHUTDOWN_S:
        raise SpecError(
            f"train.shutdown_timeout_s = {timeout!r} must be a number of seconds in "
            f"(0, {MAX_SHUTDOWN_S}]; e.g. 120"
        )
    if spec.default_entry:
        # The trainer's own parse + validate on the exact argv the nodes will get, with the
        # world size they will have: one typed config, no copy of its rules here.
        try:
            parse_config(
                spec.train_argv(),
                world=(spec.world_size, spec.nodes),
                installed=False,
                local_paths=local_paths,
            )
        except ConfigError as e:
            raise SpecError(str(e)) from None  # the trainer's own message, word for word


BUILTIN_JOB = "builtin:default"  # the kit's own default job (configs/default.toml in the kit)
JOB_FILE = "ddpkit.toml"  # the project's job file, as `ddpkit init` writes it


def default_job_file() -> str:
    """./ddpkit.toml when the current directory has one, else the kit's built-in job."""
    return JOB_FILE if Path(JOB_FILE).is_file() else BUILTIN_JOB


def builtin_job_path() -> Path:
    from ddpkit.tools.templating import KIT_DIR

    return KIT_DIR / "configs" / "default.toml"


def resolve_workspace(path: str | Path | None, data: dict[str, Any]) -> Path:
    """The workspace rule, stated once: the job file's directory, or its `workspace` key
    (relative to that directory); the current directory for the built-in job."""
    if path is None or str(path) == BUILTIN_JOB:
        return Path.cwd()
    base = Path(path).resolve().parent
    value = data.get("workspace")
    if value is None:
        return base
    if not isinstance(value, str) or not value.strip() or value.startswith("-"):
        raise SpecError(f'workspace {value!r} is not a directory path; use e.g. ".."')
    ws = (base / value).resolve()
    if not ws.is_dir():
        raise SpecError(
            f"workspace {value!r} ({ws}) is not a directory; fix the path (it is relative to "
            f"the job file's directory {base})"
        )
    return ws


@contextlib.contextmanager
def in_workspace(workspace: str | Path) -> Iterator[None]:
    """Run a block as the nodes will: in the workspace, with it first on sys.path (import
    paths such as mypkg.models:build resolve from it). Restores both afterwards."""
    old_cwd, old_path = os.getcwd(), list(sys.path)
    os.chdir(workspace)
    sys.path.insert(0, str(workspace))
    try:
        yield
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path


def load_spec(
    path: str | Path | None,
    sets: list[str] | None = None,
    nodes: int | None = None,
    gpus: int | None = None,
    train_args: list[str] | None = None,
    local_paths: bool = True,
    sections: dict[str, type | None] | None = None,
) -> JobSpec:
    """Load, override, type-check and validate a job file (BUILTIN_JOB: the kit's default
    job). Relative paths are checked against the workspace. sections: the plugin backends'
    tables the file may hold (name -> Options to type it, or None). Raises SpecError."""
    data: dict[str, Any] = {}
    if path is not None:
        source = builtin_job_path() if str(path) == BUILTIN_JOB else path
        try:
            data = read_toml(source)
        except ConfigError as e:
            raise SpecError(str(e)) from None
    for assignment in sets or []:
        apply_override(data, assignment, sections)
    workspace = resolve_workspace(path, data)
    data["workspace"] = str(workspace)
    slurm = data.setdefault("slurm", {})
    if isinstance(slurm, dict) and slurm.get("python") is None and not slurm.get("venv"):
        # The nodes' Python defaults to this one (the shared filesystem has it at this path).
        slurm["python"] = sys.executable
    if nodes is not None:
        data["nodes"] = nodes
    if gpus is not None:
        data["nproc_per_node"] = gpus
    if train_args:
        data["train_args"] = list(data.get("train_args", [])) + list(train_args)
    spec = _build(JobSpec, data, "", sections)
    with in_workspace(workspace):
        return validate(spec, local_paths)


__all__ = [
    "DockerSpec",
    "ElasticSpec",
    "JobSpec",
    "K8sSpec",
    "SlurmSpec",
    "SpecError",
    "debug_env",
    "load_spec",
    "parse_time_minutes",
    "validate",
]

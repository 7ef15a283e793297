"""The job spec's schema: JobSpec, with the validators declared on its fields.

Bad input raises SpecError with the problem and the fix; the CLI prints it on one line and
exits 2. Rendering reads nothing but a JobSpec; each engine's own table ([slurm], [k8s],
...) is the engine's Options dataclass (its package's options.py), held in backend_options.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ddpkit.tools.jobspec.values import (
    DebugPreset,
    debug_env,
    drop_none,
    flag_value,
    parse_time_minutes,
)
from ddpkit.train import dataclass_fields
from ddpkit.train.config import DURATION_MAX_S
from ddpkit.train.contract import (
    CKPT_DIR_ENV,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    default_ckpt_dir,
    default_run_dir,
    shutdown_budget_s,
)
from ddpkit.train.dataclass_fields import at_least, checks, matches, plain_path, port
from ddpkit.train.errors import UserError
from ddpkit.train.observe import names as observe

# Names land in file names, SLURM job names, Kubernetes object names and container names.
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MEM_RE = re.compile(r"^[0-9]+[KMGT]?$")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# [train] keys that mean something for any entry point (the node launcher reads them).
# timeout_s: a user's script's collectives wait that long for a hung rank (the node launcher's
# --collective-timeout; the kit's trainer reads its own).
ENTRY_NEUTRAL_TRAIN_KEYS = {"name", "run_dir", "shutdown_timeout_s", "timeout_s"}
MAX_SHUTDOWN_S = float(DURATION_MAX_S)  # the trainer's and the node launcher's bound (a week)


class SpecError(UserError):
    """A bad job file value, override or combination (one line, exit 2)."""


# --- validators declared on the fields (ddpkit.train.dataclass_fields): one predicate per rule


def _time_limit(value: str, key: str) -> str | None:
    try:
        parse_time_minutes(value)
    except ValueError:
        return f"{key} {value!r} does not parse; use MM, HH:MM:SS or D-HH:MM:SS (e.g. 02:00:00)"
    return None


def _image_ref(value: str, key: str) -> str | None:
    if not dataclass_fields.is_plain_token(value):
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


def _positive(value: float, key: str) -> str | None:
    if not math.isfinite(value) or value <= 0:
        return f"{key} must be a number > 0, got {value}"
    return None


_METRICS_PORT_FIX = "use 1-65535 (e.g. 9400), or 0 for no endpoint"

NAME_CHECK = matches(
    NAME_RE.pattern[1:-1],
    "{key} {value!r} is not safe: use 1-52 lowercase letters, digits and '-', starting and "
    "ending with a letter or digit (e.g. mnist-ddp)",
)


DEFAULT_MAX_RESTARTS = 3  # in-place restarts when the job file sets none


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
    # torchrun --max-restarts: in-place restarts of the whole group after a worker or node
    # failure, each resuming from the newest complete checkpoint. A failure of the user's own
    # code (an exception, bad input, a diverged loss) is never retried (train/failclass.py).
    # Unset: DEFAULT_MAX_RESTARTS (3), except a Kubernetes job without k8s.elastic, whose
    # failed pods the operator restarts (0 there: k8s/render.py says why).
    max_restarts: int | None = field(default=None, metadata=checks(at_least(0)))
    # The save budget `submit` and `--plan` print (tools/savebudget.py): the job's expected
    # mean time between failures in hours (unset: 8192 h / ranks, from a 1,024-GPU job's
    # ~8 h in published failure studies), for the Young/Daly checkpoint interval; and the
    # checkpoint storage's write speed in GB/s (unset: the last save's, else 1 GB/s).
    mtbf_h: float | None = field(default=None, metadata=checks(_positive))
    ckpt_write_gbps: float | None = field(default=None, metadata=checks(_positive))
    # Prometheus (docs/observability.md): rank 0 of the kit's trainer serves the run's figures
    # over HTTP on this port (0: none); a Kubernetes job's pods announce it (a containerPort
    # named metrics and prometheus.io annotations). Every run leaves them in
    # <run dir>/metrics.prom whatever these say.
    metrics_port: int = field(
        default=0, metadata=checks(lambda v, k: port(fix=_METRICS_PORT_FIX)(v, k) if v else None)
    )
    # ... and keeps <dir>/ddpkit-<run>.prom fresh there (every 10 s and at the end), for
    # node_exporter's textfile collector (--collector.textfile.directory): SLURM nodes often
    # take no inbound port. A dir on each node (absolute, or relative to the workspace).
    metrics_textfile_dir: str | None = field(
        default=None, metadata=checks(plain_path("/var/lib/node_exporter/textfile"))
    )
    # "torchft": replica groups that keep training while one dies and rejoins from a live
    # peer (train/ft.py, docs/fault-tolerance.md); "none": a failure restarts the whole job
    fault_tolerance: Literal["none", "torchft"] = "none"
    # torchft's replica groups; default: one per node, 2 on one machine (each then runs
    # nproc_per_node processes: the job has replica_groups x nproc_per_node ranks)
    replica_groups: int | None = field(default=None, metadata=checks(at_least(1)))
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
    # Each engine's table ([slurm], [k8s], [docker], a plugin's [mine]) by the engine's name,
    # typed by its Backend.Options (a plugin's only when it is the backend acting on the job,
    # else kept as written); `spec.slurm` reads one. Not a key of its own in the job file.
    backend_options: dict[str, Any] = field(default_factory=dict, metadata={"internal": True})

    def __getattr__(self, name: str) -> Any:
        """An engine's table by its name (`spec.slurm.partition`): the engines own their
        options (Backend.Options), the job spec only holds them."""
        tables = self.__dict__.get("backend_options", {})
        if name in tables:
            return tables[name]
        raise AttributeError(f"{type(self).__name__!r} has no key or engine table {name!r}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def groups(self) -> int:
        """torchft's replica groups: replica_groups, else one per node (2 on one node)."""
        return self.replica_groups or (self.nodes if self.nodes > 1 else 2)

    @property
    def run_dir(self) -> str:
        """The one run dir of this job, for the trainer and everything around it (node logs,
        markers, plots): the last --run-dir (or --name) in the raw flags after `--`, else
        train.run_dir, else runs/<train.name or name>."""
        if self.default_entry:
            given = flag_value(self.train_args, "--run-dir")
            if given is not None:
                return given
            name = flag_value(self.train_args, "--name")
            if name is not None and self.train.get("run_dir") is None:
                return default_run_dir(name)
        return str(self.train.get("run_dir") or default_run_dir(self.run_name))

    @property
    def run_name(self) -> str:
        """The run's name: train.name, else the job's name (the trainer's rule for a job
        file: `python -m ddpkit.train --config` reads it the same way)."""
        return str(self.train.get("name") or self.name)

    @property
    def explicit_ckpt_dir(self) -> str | None:
        """The checkpoint dir the job names: ckpt_dir, else train.ckpt_dir; None for the
        default, which the node launcher and the trainer derive from the run dir."""
        named = self.ckpt_dir or self.train.get("ckpt_dir")
        return str(named) if named else None

    @property
    def checkpoint_dir(self) -> str:
        """The one checkpoint dir of this job: explicit_ckpt_dir, else <run dir>/checkpoints
        (what the trainer will use)."""
        return self.explicit_ckpt_dir or default_ckpt_dir(self.run_dir)

    @property
    def time_minutes(self) -> int:
        return parse_time_minutes(self.time)

    def train_argv(self) -> list[str]:
        """`python -m ddpkit.train` flags: the [train] table, name, ckpt_dir, then train_args."""
        args = dataclass_fields.flag_args("--name", self.run_name)
        raw = self.train_args
        epochs_only = flag_value(raw, "--epochs") is not None and flag_value(raw, "--steps") is None
        for key, value in self.train.items():
            if key == "name" or (key == "steps" and epochs_only):
                continue  # --epochs after `--` switches the file's steps off (as the trainer does)
            flag = dataclass_fields.flag(key)
            if isinstance(value, bool):
                args.append(flag if value else dataclass_fields.no_flag(key))
            elif isinstance(value, dict):  # model_args / dataset_args: the flag takes JSON
                args += [flag, json.dumps(value, separators=(",", ":"))]
            elif value is not None:  # e.g. data_dir = "-raw": it reaches the trainer as written
                args += dataclass_fields.flag_args(flag, str(value))
        if self.ckpt_dir:
            args += dataclass_fields.flag_args("--ckpt-dir", self.ckpt_dir)
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

    def collective_timeout_flag(self) -> list[str]:
        """The node launcher's --collective-timeout for a user's entry point whose job sets
        train.timeout_s (the kit's trainer takes its own --timeout-s); none by default."""
        value = self.train.get("timeout_s")
        if self.default_entry or value is None:
            return []
        return ["--collective-timeout", f"{float(value):g}"]

    @property
    def restart_budget(self) -> int:
        """max_restarts, or the default when the job file leaves it unset."""
        return DEFAULT_MAX_RESTARTS if self.max_restarts is None else self.max_restarts

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
        if self.explicit_ckpt_dir:  # else the node launcher's default
            env[CKPT_DIR_ENV] = self.explicit_ckpt_dir
        if self.metrics_port:
            env[observe.PORT_ENV] = str(self.metrics_port)
        if self.metrics_textfile_dir:
            env[observe.TEXTFILE_DIR_ENV] = self.metrics_textfile_dir
        env.update(self.env)
        return env

    def to_dict(self) -> dict[str, Any]:
        """The spec as a job file would hold it (plugin backends' tables at the top level)."""
        out = dataclasses.asdict(self)
        out.update(out.pop("backend_options"))
        return drop_none(out)

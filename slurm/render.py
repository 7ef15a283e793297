"""The SLURM job as text, by pure functions: the sbatch script and submitit's parameters.

The job is three pieces of shell, rendered from slurm/*.j2 by pure functions:
  setup     batch shell, before the step: log dir, head address, port, image, user setup
  node      what each node runs (one task per node): the node launcher, `python -m ddpkit.train.node`
            (torchrun in process, signals, shutdown budget, exit 75 on a requeue request)
  teardown  batch shell, after the step: requeue when the step exited 75 (or a node was
            stopped by srun after this attempt's requeue marker was written)
`render` puts them in one sbatch script under `#SBATCH` lines, and `submit` sends that script
to sbatch (cluster.sbatch): each node starts the node launcher directly. A sweep's job array
goes through submitit: the same resources as its parameters, setup/teardown as its
slurm_setup/slurm_teardown lines, the node script as what each submitit task runs.
"""

from __future__ import annotations

import re

from ddpkit.tools.backends import (
    JobState,
)
from ddpkit.tools.jobspec import ENV_NAME_RE, JobSpec, SpecError, node_command, standalone
from ddpkit.tools.templating import render_template, shell_quote
from ddpkit.train import dataclass_fields
from ddpkit.train.contract import EXIT_REQUEUE, REQUEUE_SIGNALS_ENV

# Values that land on `#SBATCH` lines, which sbatch (not a shell) parses: no quoting there,
# so only plain tokens are allowed.
SBATCH_TOKEN = re.compile(r"^[A-Za-z0-9_.,:/@%+=|&*!\[\]()-]+$")
PORT_BASE, PORT_SPAN = 20000, 20000  # rendezvous port = base + job id % span (submitit's rule)
# srun --wait: after the first node's task ends, the others get this long before they are
# killed. It must cover the shutdown budget: rank 0 saves last after a stop signal.
WAIT_MARGIN_S = 30
COMMENT = "ddpkit"  # --comment of every job, so `list` finds this kit's jobs
STATES = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUED": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "REQUEUE_FED": JobState.REQUEUED,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "CANCELLED": JobState.CANCELLED,
}  # fmt: skip  (every other state - FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ... - failed)


# --- the pieces (pure) ----------------------------------------------------------------------


def log_dir(spec: JobSpec) -> str:
    return spec.slurm.log_dir or f"{spec.run_dir}/slurm"


def _check_tokens(spec: JobSpec) -> None:
    s = spec.slurm
    for key, value in (
        ("slurm.partition", s.partition),
        ("slurm.account", s.account),
        ("slurm.qos", s.qos),
        ("slurm.constraint", s.constraint),
        ("slurm.log_dir (or train.run_dir)", log_dir(spec)),
        ("mem", spec.mem),
    ):
        if value is not None and not SBATCH_TOKEN.match(value):
            raise SpecError(
                f"{key} {value!r} cannot go on an #SBATCH line (spaces, quotes, $ or newlines); "
                "use a plain name or path"
            )


def cpus_per_task(spec: JobSpec) -> int:
    return spec.nproc_per_node * spec.cpus_per_proc


MAX_SLURM_GRACE_S = 65535  # sbatch --signal=SIG@SECONDS takes at most 0xffff seconds
GRACE_MARGIN_S = 60  # slurm.grace_s beyond the shutdown budget: the step's own teardown


def grace_s(spec: JobSpec) -> int:
    """Seconds before the time limit that SLURM sends the stop signal: slurm.grace_s, else
    the shutdown budget + a margin, so a longer save (train.shutdown_timeout_s) never needs
    a second setting to fit."""
    s = spec.slurm.grace_s
    return spec.shutdown_budget_s + GRACE_MARGIN_S if s is None else s


def validate(spec: JobSpec) -> None:
    """The SLURM backend's own rules (launch applies them to SLURM jobs only)."""
    s = spec.slurm  # single-value rules: declared on SlurmOptions' fields (check_options)
    if s.signal == "TERM":
        raise SpecError(
            "slurm.signal = TERM cannot be told from a plain `scancel` (SIGTERM), which must "
            'end the job, not requeue it; use slurm.signal = "USR1" (the default) or "USR2"'
        )
    grace = grace_s(spec)
    if not spec.shutdown_budget_s <= grace <= MAX_SLURM_GRACE_S:
        raise SpecError(
            f"slurm.grace_s = {grace} must cover the shutdown budget "
            f"({spec.shutdown_budget_s} s, train.shutdown_timeout_s rounded up) and be at most "
            f"{MAX_SLURM_GRACE_S} (sbatch --signal's limit); use e.g. "
            f"{spec.shutdown_budget_s + GRACE_MARGIN_S}, or unset it"
        )
    for name in s.secret_env:
        if not ENV_NAME_RE.match(name) or name in spec.env:
            raise SpecError(
                f"slurm.secret_env {name!r}: give variable names only, not in env (a value in "
                'env is written into the script), e.g. secret_env = ["WANDB_API_KEY"]'
            )
    if spec.fault_tolerance == "torchft" and spec.groups != spec.nodes:
        raise SpecError(
            f"fault_tolerance = torchft on SLURM runs one replica group per node (it restarts "
            f"in place when it dies); {spec.groups} groups on {spec.nodes} nodes: set "
            f"replica_groups = {spec.nodes}, or unset it"
        )
    for line in s.extra_sbatch:
        if "\n" in line or not line.startswith("--"):
            raise SpecError(
                f"slurm.extra_sbatch entry {line!r}: give one sbatch option per entry, "
                'starting with --, e.g. "--mail-type=END"'
            )


def sbatch_params(spec: JobSpec) -> dict[str, str | int | bool]:
    """The job's sbatch options, ONE set for both routes: the rendered `#SBATCH` lines and
    submitit's parameters. Keys are sbatch's long options with '_' for '-'; True = a flag."""
    _check_tokens(spec)
    s = spec.slurm
    params: dict[str, str | int | bool] = {
        "job_name": spec.name,
        "nodes": spec.nodes,
        "ntasks_per_node": 1,
        "cpus_per_task": cpus_per_task(spec),
    }
    if spec.accelerator == "gpu":
        params["gpus_per_node"] = spec.nproc_per_node
    if spec.mem is not None:
        params["mem"] = spec.mem
    params["time"] = spec.time_minutes
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(s, key):
            params[key] = getattr(s, key)
    if s.exclusive:
        params["exclusive"] = True
    params["open_mode"] = "append"  # a requeued job appends to its logs
    if spec.workspace:
        params["chdir"] = spec.workspace  # the job runs in the workspace, as on every backend
    params["signal"] = f"{s.signal}@{grace_s(spec)}"  # no "B:": the job step's processes get it
    params["requeue" if s.requeue_limit > 0 else "no_requeue"] = True
    params["comment"] = COMMENT
    for line in s.extra_sbatch:
        key, _, value = line[2:].partition("=")
        params[key.replace("-", "_")] = value or True
    return params


def sbatch_word(value: object) -> str:
    """A value as sbatch reads it from an `#SBATCH` line: a space ends the word and `#` starts
    a comment unless quoted, so such a value (a project path with a space) is double-quoted,
    with `\\`, `"` and `#` escaped (Slurm 22.05, tried on a real cluster); any other value
    is written as it is."""
    text = str(value)
    if not any(c.isspace() or c in '"\\#' for c in text):
        return text
    return '"' + re.sub(r'(["\\#])', r"\\\1", text) + '"'


def sbatch_options(spec: JobSpec) -> list[str]:
    """The `#SBATCH` options, in the order they are written."""
    opts = []
    for key, value in sbatch_params(spec).items():
        flag = dataclass_fields.flag(key)  # sbatch's long options: the kit's one spelling rule
        opts.append(flag if value is True else f"{flag}={sbatch_word(value)}")
        if key == "time":
            # sbatch opens --output before the script runs, so it must be a directory that
            # exists: the submit directory. The per-node logs go to the log dir (made by setup).
            # (submitit writes its own --output into the log dir it creates.)
            opts.append("--output=slurm-%x-%j.out")
    return opts


def srun_wait_s(spec: JobSpec) -> int:
    return spec.shutdown_budget_s + WAIT_MARGIN_S


def srun_args(spec: JobSpec, with_output: bool = True) -> list[str]:
    """srun's flags (submitit adds its own --output). --cpus-per-task again: srun stopped
    inheriting it on Slurm 22.05-23.02; --kill-on-bad-exit and --wait: a node that dies
    takes the step down instead of leaving the others waiting for a timeout."""
    args = [
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus_per_task(spec)}",
        "--kill-on-bad-exit=1",
        f"--wait={srun_wait_s(spec)}",
    ]
    if with_output:
        logs = log_dir(spec)
        args += [f"--output={logs}/%j_%t_log.out", f"--error={logs}/%j_%t_log.err"]
    return args


def enroot_ref(image: str) -> str:
    """A docker reference as enroot/pyxis want it: `registry#repo:tag` (nvcr.io#nvidia/x).
    A squashfs path or a reference without a registry host stays as it is."""
    if "#" in image or image.startswith(("/", "./")) or image.endswith(".sqsh"):
        return image
    host, sep, rest = image.partition("/")
    if sep and ("." in host or ":" in host or host == "localhost"):
        return f"{host}#{rest}"
    return image


def _cache_name(image: str, ext: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "+", image).strip("+") + ext


def image_plan(spec: JobSpec) -> dict[str, object]:
    """What setup does about the container image: its reference (DDPKIT_IMAGE) and, with
    slurm.image_cache, the one-time conversion into the cache (enroot import / apptainer pull)."""
    kind, image, cache = spec.slurm.container, spec.image, spec.slurm.image_cache
    plan: dict[str, object] = {"image": "", "image_pull": [], "image_source": "", "image_cache": ""}
    if kind == "none":
        return plan
    local_file = image.endswith((".sqsh", ".sif")) or image.startswith(("/", "./"))
    if kind == "pyxis":
        plan["image"] = enroot_ref(image)
        if cache and not local_file:
            plan.update(
                image=f"{cache}/{_cache_name(image, '.sqsh')}",
                image_pull=["enroot", "import", "-o"],
                image_source=f"docker://{enroot_ref(image)}",
                image_cache=cache,
            )
    else:  # apptainer
        source = image if local_file or "://" in image else f"docker://{image}"
        plan["image"] = source
        if cache and not local_file:
            plan.update(
                image=f"{cache}/{_cache_name(image, '.sif')}",
                image_pull=["apptainer", "pull"],
                image_source=source,
                image_cache=cache,
            )
    return plan


def setup_script(spec: JobSpec) -> str:
    venv = spec.slurm.venv if spec.slurm.container == "none" else None
    return render_template(
        "slurm/setup.sh.j2",
        log_dir=log_dir(spec),
        rdzv_port=spec.slurm.rdzv_port or 0,
        port_base=PORT_BASE,
        port_span=PORT_SPAN,
        cpus_per_task=cpus_per_task(spec),
        venv=venv or "",
        secret_env=spec.slurm.secret_env,
        user_setup=spec.slurm.setup,
        **image_plan(spec),
    ).rstrip("\n")


def node_argv(spec: JobSpec) -> list[str]:
    """The node launcher's command line; the rendezvous endpoint/id come as PET_* variables.
    fault_tolerance = torchft: each node is one replica group, its own torchrun (standalone),
    under the replica-group supervisor that restarts it in place; node 0's also runs the
    lighthouse, on the head address and the job's port (node.sh.j2 sets TORCHFT_LIGHTHOUSE).
    The supervisor finds its node's rank in SLURM_NODEID, as the node script has always said
    (DDPKIT_NODE_NUMBER, its default, holds the same)."""
    if spec.nodes == 1:
        rdzv = standalone(spec.nproc_per_node)
    else:
        rdzv = [
            f"--nnodes={spec.nodes}",
            f"--nproc-per-node={spec.nproc_per_node}",
            "--rdzv-backend=c10d",
        ]
    return node_command(
        spec, rdzv, python=node_python(spec), nodes=spec.nodes, node_rank_env="SLURM_NODEID"
    )


def node_python(spec: JobSpec) -> str:
    """The nodes' interpreter: slurm.python (load_spec fills in the submitting one), or the
    image's `python` inside a container."""
    if spec.slurm.container != "none":
        return "python"
    if spec.slurm.python:
        return spec.slurm.python
    return f"{spec.slurm.venv}/bin/python" if spec.slurm.venv else "python"


def node_env(spec: JobSpec) -> dict[str, str]:
    """The node's environment: the job's, and the one signal that asks for a requeue here:
    the --signal the kit asks SLURM for before the time limit. A plain `scancel` (SIGTERM)
    is a cancel, and SLURM's own preemption requeues the job by itself."""
    return {**spec.launch_env(), REQUEUE_SIGNALS_ENV: f"SIG{spec.slurm.signal}"}


def node_script(spec: JobSpec) -> str:
    flags: list[str] = ["--nv"] if spec.accelerator == "gpu" else []
    for mount in spec.slurm.container_mounts:
        flags += ["--bind", mount]
    return render_template(
        "slurm/node.sh.j2",
        env=sorted(node_env(spec).items()),
        multi_node=spec.nodes > 1 and spec.fault_tolerance != "torchft",
        torchft=spec.fault_tolerance == "torchft",
        apptainer=spec.slurm.container == "apptainer",
        apptainer_flags=flags,
        command=node_argv(spec),
    ).rstrip("\n")


# Run by the batch shell (on the host, outside any container) with the submitting Python:
# ddpkit.train.contract is stdlib only.
MARKER_CHECK = (
    "import sys; from ddpkit.train.contract import fresh_requeue_marker as f; "
    "sys.exit(0 if f(sys.argv[1], sys.argv[2], 0.0) else 1)"
)


def teardown_script(spec: JobSpec, array_prefix: str | None = None) -> str:
    """The batch shell's end. For a sweep's job array the run dir is <array_prefix><task id>
    (member i runs in runs/<name>-<i>), so every array task shares one script."""
    run_dir = shell_quote(spec.run_dir)
    if array_prefix is not None:
        run_dir = shell_quote(array_prefix) + '"$SLURM_ARRAY_TASK_ID"'
    return render_template(
        "slurm/teardown.sh.j2",
        requeue_limit=spec.slurm.requeue_limit,
        requeue_delay_s=spec.slurm.requeue_delay_s,
        exit_requeue=EXIT_REQUEUE,
        marker_check=MARKER_CHECK,
        python=spec.slurm.python or "python3",
        run_dir_shell=run_dir,
    ).rstrip("\n")


def render(spec: JobSpec) -> str:
    """The sbatch script (pure: reads nothing but the spec)."""
    return render_template(
        "slurm/sbatch.sh.j2",
        name=spec.name,
        nodes=spec.nodes,
        nproc=spec.nproc_per_node,
        sbatch_options=sbatch_options(spec),
        setup=setup_script(spec),
        node_script=node_script(spec),
        srun_args=srun_args(spec),
        pyxis=spec.slurm.container == "pyxis",
        mounts=spec.slurm.container_mounts,
        teardown=teardown_script(spec),
    )


def submitit_parameters(spec: JobSpec) -> dict[str, object]:
    """The same sbatch options for submitit: its own keys where it has one (it writes a
    default for them otherwise), every option again in additional_parameters (which win)."""
    params = sbatch_params(spec)
    return {
        "job_name": spec.name,
        "nodes": spec.nodes,
        "time": spec.time_minutes,
        "setup": setup_script(spec).splitlines(),
        "teardown": teardown_script(spec).splitlines(),
        "srun_args": srun_args(spec, with_output=False),
        "additional_parameters": params,
    }

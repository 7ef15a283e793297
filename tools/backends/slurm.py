"""SLURM backend: render an sbatch script; submit the same pieces through submitit.

The job is three pieces of shell, rendered from slurm/*.j2 by pure functions:
  setup     batch shell, before the step: log dir, head address, port, image, user setup
  node      what each node runs (one task per node): the node launcher, `python -m ddpkit.train.node`
            (torchrun in process, signals, shutdown budget, exit 75 on a requeue request)
  teardown  batch shell, after the step: requeue when the step exited 75 (or a node was
            stopped by srun after this attempt's requeue marker was written)
`render` puts them in one sbatch script under `#SBATCH` lines. `submit` hands the same
resources to submitit as parameters, setup/teardown as its slurm_setup/slurm_teardown lines,
and the node script as what each submitit task runs, so `render` shows what runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ddpkit.tools.backends import (
    Backend,
    JobState,
    JobStatus,
    check_node_env,
    last_job,
    record_job,
)
from ddpkit.tools.spec import ENV_NAME_RE, JobSpec, SpecError, parse_time_minutes
from ddpkit.tools.templating import render_template, shell_quote
from ddpkit.train import typed
from ddpkit.train.contract import EXIT_REQUEUE, PREEMPT_SIGNALS

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
    s = spec.slurm  # single-value rules: declared on SlurmSpec's fields (check_options)
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


def sbatch_options(spec: JobSpec) -> list[str]:
    """The `#SBATCH` options, in the order they are written."""
    opts = []
    for key, value in sbatch_params(spec).items():
        flag = typed.flag(key)  # sbatch's long options: the kit's one spelling rule
        opts.append(flag if value is True else f"{flag}={value}")
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


def node_command(spec: JobSpec) -> list[str]:
    """The node launcher's command line; the rendezvous endpoint/id come as PET_* variables."""
    if spec.nodes == 1:
        rdzv = ["--standalone", f"--nproc-per-node={spec.nproc_per_node}"]
    else:
        rdzv = [
            f"--nnodes={spec.nodes}",
            f"--nproc-per-node={spec.nproc_per_node}",
            "--rdzv-backend=c10d",
        ]
    return spec.node_argv(rdzv, python=node_python(spec))


def node_python(spec: JobSpec) -> str:
    """The nodes' interpreter: slurm.python (load_spec fills in the submitting one), or the
    image's `python` inside a container."""
    if spec.slurm.container != "none":
        return "python"
    if spec.slurm.python:
        return spec.slurm.python
    return f"{spec.slurm.venv}/bin/python" if spec.slurm.venv else "python"


def node_script(spec: JobSpec) -> str:
    flags: list[str] = ["--nv"] if spec.accelerator == "gpu" else []
    for mount in spec.slurm.container_mounts:
        flags += ["--bind", mount]
    return render_template(
        "slurm/node.sh.j2",
        env=sorted(spec.launch_env().items()),
        multi_node=spec.nodes > 1,
        apptainer=spec.slurm.container == "apptainer",
        apptainer_flags=flags,
        command=node_command(spec),
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


# --- submission (side effects) ----------------------------------------------------------------


@dataclass
class NodeCommand:
    """What each submitit task (one per node) runs: the rendered node script, in bash.

    submitit's own handlers would requeue at once on USR2 (before the checkpoint is written)
    and its process would die on USR1; here the preemption signals only get logged, because
    SLURM delivers them to the whole step and the node launcher saves and exits by itself.
    """

    script: str

    def __call__(self) -> int:
        for name in PREEMPT_SIGNALS:
            signal.signal(getattr(signal, name), _note_signal)
        rc = subprocess.run(["bash", "-c", self.script], check=False).returncode
        if rc != 0:
            # Not an exception: submitit would write an "error" result before the requeue,
            # and the real exit status (75: requeue) must reach the batch shell's teardown.
            raise SystemExit(rc)
        return rc


def _note_signal(signum: int, _frame: object) -> None:
    print(f"ddpkit: submitit task got {signal.Signals(signum).name}; waiting", file=sys.stderr)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    except FileNotFoundError:
        raise SpecError(f"{argv[0]} not found: is SLURM installed here? (make slurm-up)") from None


def _job_fields(job_id: str) -> dict[str, str] | None:
    """`scontrol show job` as a dict (None when slurmctld no longer knows the job)."""
    out = _run("scontrol", "show", "job", "-o", job_id)
    if out.returncode != 0 or "=" not in out.stdout:
        return None
    return dict(tok.split("=", 1) for tok in out.stdout.split() if "=" in tok)


def _sacct_fields(job_id: str) -> dict[str, str] | None:
    """The accounting record of a job slurmctld has forgotten (None without accounting)."""
    out = _run("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,JobName,State,ExitCode")
    line = next((ln for ln in out.stdout.splitlines() if ln.split("|")[0] == job_id), None)
    if out.returncode != 0 or line is None:
        return None
    jid, name, state, code = line.split("|")[:4]
    return {"JobId": jid, "JobName": name, "JobState": state.split()[0], "ExitCode": code}


def _named(params: dict[str, object], name: str) -> dict[str, object]:
    extra = dict(params["additional_parameters"])  # type: ignore[call-overload]
    return params | {"job_name": name, "additional_parameters": extra | {"job_name": name}}


def check_secrets(spec: JobSpec) -> None:
    """Every slurm.secret_env name is set here: sbatch passes this environment on."""
    missing = [name for name in spec.slurm.secret_env if name not in os.environ]
    if missing:
        raise SpecError(
            f"slurm.secret_env {', '.join(missing)} not set in this shell; export it before "
            "submitting (the value goes to the job by name, never into the script)"
        )


# --- the partition's limits (submit only: render never probes the cluster) ------------------

# sinfo's fields, one line per group of alike nodes: partition (default marked *), node
# count, generic resources, time limit, job size in nodes (MIN-MAX).
SINFO_FORMAT = "%P|%D|%G|%l|%s"
_UNLIMITED = ("infinite", "unlimited", "n/a", "none", "")


@dataclass
class PartitionLimits:
    name: str
    nodes: int  # nodes in the partition, whatever their state
    gpus_per_node: list[int]  # one entry per node
    time_minutes: int | None  # None: no limit
    max_job_nodes: int | None  # None: no limit


def _gpus(gres: str) -> int:
    """GPUs of one node from sinfo's %G: gpu:4, gpu:a100:8(S:0-1), gpu:a:2,gpu:b:2, (null)."""
    gres = re.sub(r"\([^)]*\)", "", gres)
    total = 0
    for item in gres.split(","):
        fields = item.strip().split(":")
        if fields[0] != "gpu":
            continue
        total += int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else 1
    return total


def _limit_minutes(text: str) -> int | None:
    if text.strip().lower() in _UNLIMITED:
        return None
    try:
        return parse_time_minutes(text)
    except ValueError:
        return None  # a form not known here: sbatch has the last word


def parse_sinfo(out: str, partition: str | None) -> PartitionLimits | None:
    """The limits of `partition` (None: the default one, marked *) from `sinfo -h -o
    SINFO_FORMAT`; None when sinfo does not list it."""
    groups = []
    for line in out.splitlines():
        cols = line.strip().split("|")
        if len(cols) != 5 or not cols[1].isdigit():
            continue
        name, default = cols[0].rstrip("*"), cols[0].endswith("*")
        if (partition is None and default) or name == partition:
            groups.append((name, int(cols[1]), _gpus(cols[2]), cols[3], cols[4]))
    if not groups:
        return None
    sizes = [g[4].partition("-")[2] for g in groups]
    max_job = [int(x) for x in sizes if x.isdigit()]
    limits = [_limit_minutes(g[3]) for g in groups]
    return PartitionLimits(
        name=groups[0][0],
        nodes=sum(g[1] for g in groups),
        gpus_per_node=[g[2] for g in groups for _ in range(g[1])],
        time_minutes=None if None in limits else max(limits),  # type: ignore[type-var]
        max_job_nodes=max(max_job) if len(max_job) == len(groups) else None,
    )


def partition_limits(spec: JobSpec) -> PartitionLimits | None:
    """The partition the job goes to, as sinfo reports it; None without sinfo or when it
    does not answer (sbatch then has the last word). An unknown partition: SpecError."""
    if shutil.which("sinfo") is None:
        return None
    part = spec.slurm.partition
    argv = ["sinfo", "-h", "-o", SINFO_FORMAT] + (["-p", part] if part else [])
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    limits = parse_sinfo(out.stdout, part)
    if limits is None and part and not out.stdout.strip():
        raise SpecError(
            f"slurm.partition {part!r} is not a partition of this cluster (sinfo lists none "
            "by that name); pass one that `sinfo -s` shows (PARTITION=...), or unset it"
        )
    return limits


def check_partition(spec: JobSpec) -> None:
    """Refuse, before anything is queued, a job the partition can never run: it would
    stay PENDING (Reason=PartitionConfig / Resources) with no hint."""
    lim = partition_limits(spec)
    if lim is None:
        return
    where = f"partition {lim.name}"
    fix = "or pick another partition (slurm.partition, PARTITION=)"
    most = min(lim.nodes, lim.max_job_nodes or lim.nodes)
    if spec.nodes > most:
        why = (
            f"has {lim.nodes} node(s)"
            if most == lim.nodes
            else f"takes jobs of at most {most} node(s)"
        )
        raise SpecError(
            f"{where} {why}, the job asks {spec.nodes} (--nodes {spec.nodes}): it would wait "
            f"in the queue forever; pass --nodes {most} or fewer (NODES=), {fix}"
        )
    if spec.accelerator == "gpu":
        want = spec.nproc_per_node
        able = sorted(lim.gpus_per_node, reverse=True)
        if sum(1 for g in able if g >= want) < spec.nodes:
            have = able[spec.nodes - 1] if able else 0
            raise SpecError(
                f"{where}: its nodes have at most {max(able, default=0)} GPU(s) each (sinfo "
                f"gres), the job asks {spec.nodes} node(s) x {want} (--gpus {want}): it would "
                f"wait in the queue forever; pass --gpus {have} or fewer (GPUS=)"
                + (', or accelerator = "cpu"' if not have else "")
                + f", {fix}"
            )
    if lim.time_minutes is not None and spec.time_minutes > lim.time_minutes:
        raise SpecError(
            f"{where} allows jobs of at most {lim.time_minutes} min, the job asks "
            f"{spec.time_minutes} min (time = {spec.time!r}): it would wait in the queue "
            f"forever; lower time (--set time=...), {fix}"
        )


def _check_job_id(job: str) -> str:
    if not re.fullmatch(r"\d+(_\d+)?", job):
        raise SpecError(
            f"job id {job!r} is not a SLURM job id; pass a number (an array task: 123_4), "
            "e.g. JOB=123"
        )
    return job


class SlurmBackend(Backend):
    name = "slurm"
    file_ext = "sbatch"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between polls")
        parser.add_argument("--follow", action="store_true", help="logs: keep following")

    def validate(self, spec: JobSpec) -> None:
        super().validate(spec)  # the [slurm] table's field checks (SlurmSpec)
        validate(spec)

    def render(self, spec: JobSpec) -> str:
        return render(spec)

    def submit(self, spec: JobSpec, opts: argparse.Namespace) -> int:
        import submitit  # lazy: only the SLURM backend needs it

        logs = Path(log_dir(spec))
        params = submitit_parameters(spec)
        if spec.slurm.container == "pyxis":
            raise SpecError(
                "submit cannot run pyxis jobs (submitit's task would start inside the image); "
                "use `make slurm-render` and `sbatch out/slurm/<name>.sbatch`"
            )
        check_secrets(spec)
        check_partition(spec)
        if spec.slurm.container == "none":
            check_node_env(spec, node_python(spec), "slurm.python")
        logs.mkdir(parents=True, exist_ok=True)
        executor = submitit.SlurmExecutor(folder=str(logs))
        executor.update_parameters(**params)
        try:
            job = executor.submit(NodeCommand(node_script(spec)))
        except (FileNotFoundError, subprocess.CalledProcessError) as e:
            print(f"error: sbatch failed ({e}); is SLURM up? (make slurm-up)", file=sys.stderr)
            return 1
        job_id = str(job.job_id)
        record_job(self.name, job_id, name=spec.name, log_dir=str(logs), run_dir=spec.run_dir)
        print(f"submitted job {job_id} ({spec.name}: {spec.nodes} node(s) x {spec.nproc_per_node})")
        print(f"logs: {logs}/{job_id}_<node>_log.out (.err); run dir: {spec.run_dir}")
        print(f"follow: python -m ddpkit.tools.launch logs slurm {job_id} --follow")
        if opts.wait:
            follower = LogFollower(logs, job_id)
            return self.wait(job_id, opts.poll_s, on_poll=lambda _st: follower.emit())
        return 0

    def submit_sweep(self, specs: list[JobSpec], opts: argparse.Namespace) -> int:
        """All members as ONE job array (submitit's batch): one sbatch, one queue entry, each
        array task runs its member's node script into its own run dir. Members that differ in
        resources (nodes, GPUs, time, ...) cannot share an array: they go as separate jobs."""
        import submitit

        base = specs[0].name.rsplit("-", 1)[0]
        logs = Path(specs[0].slurm.log_dir or f"runs/{base}-sweep/slurm")
        for spec in specs:  # one log dir and one name for the array: the same #SBATCH lines
            spec.slurm.log_dir = str(logs)
        params = [_named(submitit_parameters(s), base) for s in specs]
        if all(s.run_dir == f"runs/{s.name}" for s in specs):
            teardown = teardown_script(specs[0], array_prefix=f"runs/{base}-").splitlines()
            params = [p | {"teardown": teardown} for p in params]
        if any(p != params[0] for p in params[1:]):
            print("ddpkit: sweep members differ in resources; submitting them as separate jobs",
                  file=sys.stderr)  # fmt: skip
            return super().submit_sweep(specs, opts)
        if specs[0].slurm.container == "pyxis":
            raise SpecError("submit cannot run pyxis jobs; render each member and sbatch it")
        check_secrets(specs[0])
        check_partition(specs[0])  # the members share their resources (checked above)
        logs.mkdir(parents=True, exist_ok=True)
        executor = submitit.SlurmExecutor(folder=str(logs))
        executor.update_parameters(**params[0])
        try:
            with executor.batch():
                jobs = [executor.submit(NodeCommand(node_script(s))) for s in specs]
        except (FileNotFoundError, subprocess.CalledProcessError) as e:
            print(f"error: sbatch failed ({e}); is SLURM up? (make slurm-up)", file=sys.stderr)
            return 1
        ids = [str(j.job_id) for j in jobs]
        record_job(self.name, ids[0], name=base, log_dir=str(logs), members=ids,
                   run_dirs=[s.run_dir for s in specs])  # fmt: skip
        print(f"submitted job array {ids[0].split('_')[0]} ({len(ids)} members of {base}):")
        for job_id, spec in zip(ids, specs, strict=True):
            print(f"  {job_id}: {spec.name}, run dir {spec.run_dir}")
        print(
            f"logs: {logs}/<job>_<node>_log.out; status: python -m ddpkit.tools.launch status slurm ID"
        )
        if not opts.wait:
            return 0
        codes = [self.wait(job_id, opts.poll_s) for job_id in ids]
        return next((c for c in codes if c), 0)

    def poll(self, job: str) -> JobStatus:
        info = _job_fields(_check_job_id(job))
        source = "scontrol"
        if info is None:
            info, source = _sacct_fields(job), "sacct"
        if info is None:
            return JobStatus(job, JobState.UNKNOWN, detail="(neither slurmctld nor sacct knows it)")
        raw = info.get("JobState", "UNKNOWN")
        state = STATES.get(raw, JobState.FAILED)
        code = int(info.get("ExitCode", "0:0").split(":")[0]) if state.terminal else None
        keys = ("JobName", "JobState", "Reason", "ExitCode", "Restarts", "RunTime", "NodeList")
        detail = " ".join(f"{k}={info[k]}" for k in keys if k in info)
        return JobStatus(job, state, code, f"{detail} (from {source})")

    def logs(self, job: str | None, opts: argparse.Namespace) -> int:
        job_id = _check_job_id(self.job_or_last(job))
        record = last_job(self.name) if job is None else {}
        root = record.get("log_dir")
        if root is None:
            info = _job_fields(job_id) or {}
            root = str(Path(info["StdErr"]).parent) if info.get("StdErr") else None
        if root is None:
            raise SpecError(f"no log directory known for job {job_id}; pass the job's logs dir")
        follower = LogFollower(Path(str(root)), job_id)
        if not getattr(opts, "follow", False):
            return 0 if follower.emit() else 1
        return self.wait(job_id, opts.poll_s, on_poll=lambda _st: follower.emit())

    def cancel(self, job: str | None, opts: argparse.Namespace) -> int:
        """End the job: a save on the way out is welcome, a requeue is not. The job's
        requeue flag is cleared first, so the batch shell's teardown (which requeues on a
        checkpoint saved at a stop signal, and scancel's SIGTERM is one) leaves it ended."""
        job_id = _check_job_id(self.job_or_last(job))
        st = self.poll(job_id)
        if st.state.terminal:
            print(f"job {job_id} already ended ({st.state.value}); nothing to cancel")
            return 0
        _run("scontrol", "update", f"JobId={job_id}", "Requeue=0")
        rc = _run("scancel", job_id).returncode
        if rc == 0:
            print(f"cancelled job {job_id} (it may save a checkpoint on the way out; no requeue)")
        return rc

    def list_jobs(self, opts: argparse.Namespace) -> int:
        user = os.environ.get("USER") or str(os.getuid())
        out = _run("squeue", "-h", "-u", user, "-o", "%i|%j|%T|%M|%D|%k")
        if out.returncode != 0:
            print(f"error: squeue failed: {out.stderr.strip()}", file=sys.stderr)
            return 1
        print("JOBID\tNAME\tSTATE\tTIME\tNODES")
        for line in out.stdout.splitlines():
            jid, name, state, elapsed, nodes, comment = line.split("|")[:6]
            if comment == COMMENT:
                print(f"{jid}\t{name}\t{state}\t{elapsed}\t{nodes}")
        return 0


class LogFollower:
    """Every node's log of a job, each line prefixed by its node: `[node 1] ...`.
    emit() prints what is new since the last call; returns whether any log exists."""

    def __init__(self, root: Path, job_id: str) -> None:
        self.root, self.job_id = root, job_id
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, str] = {}

    def emit(self) -> bool:
        files = sorted(self.root.glob(f"{self.job_id}_*_log.*"))
        for path in files:
            node = path.name.split("_")[1]
            stream = "" if path.suffix == ".out" else " err"
            with path.open(errors="replace") as f:
                f.seek(self.offsets.get(path, 0))
                text = self.partial.pop(path, "") + f.read()
                self.offsets[path] = f.tell()
            lines = text.split("\n")
            if lines[-1]:
                self.partial[path] = lines[-1]  # a line still being written
            for line in lines[:-1]:
                sys.stdout.write(f"[node {node}{stream}] {line}\n")
        sys.stdout.flush()
        return bool(files)

"""SLURM backend: render an sbatch script; submit the same pieces through submitit.

The job is three pieces of shell, rendered from slurm/*.j2 by pure functions:
  setup     batch shell, before the step: log dir, head node, user setup lines
  node      what each node runs (one task per node): torchrun with c10d rendezvous
  teardown  batch shell, after the step: requeue when training saved on a preemption signal
`render` puts them in one sbatch script under `#SBATCH` lines. `submit` hands the same
resources to submitit as parameters, setup/teardown as its slurm_setup/slurm_teardown lines,
and the node script as what each submitit task runs, so `render` shows what runs.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tools.backends import last_job, record_job
from tools.spec import JobSpec, SpecError
from tools.templating import render_template

FILE_EXT = "sbatch"
EXIT_REQUEUE = 75  # train.config.EXIT_REQUEUE: "saved a checkpoint on a signal, requeue me"
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
TERMINAL_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT",
}  # fmt: skip
# Values that land on `#SBATCH` lines, which sbatch (not a shell) parses: no quoting there,
# so only plain tokens are allowed.
SBATCH_TOKEN = re.compile(r"^[A-Za-z0-9_.,:/@%+=|&*!\[\]()-]+$")


# --- the pieces (pure) ----------------------------------------------------------------------


def log_dir(spec: JobSpec) -> str:
    return spec.slurm.log_dir or f"{spec.run_dir}/slurm"


def requeue_marker(spec: JobSpec) -> str:
    return f"{spec.run_dir}/requeue.json"


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


def sbatch_options(spec: JobSpec) -> list[str]:
    """The `#SBATCH` options, in the order they are written."""
    _check_tokens(spec)
    s, logs = spec.slurm, log_dir(spec)
    opts = [
        f"--job-name={spec.name}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={spec.nproc_per_node * spec.cpus_per_proc}",
    ]
    if spec.accelerator == "gpu":
        opts.append(f"--gpus-per-node={spec.nproc_per_node}")
    if spec.mem is not None:
        opts.append(f"--mem={spec.mem}")
    opts.append(f"--time={spec.time_minutes}")
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(s, key):
            opts.append(f"--{key}={getattr(s, key)}")
    if s.exclusive:
        opts.append("--exclusive")
    opts += [
        f"--output={logs}/%j_0_log.out",
        f"--error={logs}/%j_0_log.err",
        "--open-mode=append",  # a requeued job appends to its logs
        f"--signal={s.signal}@{s.grace_s}",  # no "B:": the job step's processes get it
        "--requeue" if s.requeue_limit > 0 else "--no-requeue",
    ]
    return opts + list(s.extra_sbatch)


def env_list(spec: JobSpec) -> list[tuple[str, str]]:
    return sorted(spec.launch_env().items())


def _image_ref(spec: JobSpec) -> str:
    image = spec.image
    if spec.slurm.container == "apptainer" and not image.endswith(".sif") and "://" not in image:
        return f"docker://{image}"
    return image


def setup_script(spec: JobSpec) -> str:
    venv = spec.slurm.venv if spec.slurm.container == "none" else None
    return render_template(
        "slurm/setup.sh.j2", log_dir=log_dir(spec), venv=venv or "", user_setup=spec.slurm.setup
    ).rstrip("\n")


def node_script(spec: JobSpec) -> str:
    launcher: list[str] = []
    if spec.slurm.container == "apptainer":
        launcher = ["apptainer", "exec"]
        if spec.accelerator == "gpu":
            launcher.append("--nv")
        for mount in spec.slurm.container_mounts:
            launcher += ["--bind", mount]
        launcher.append(_image_ref(spec))
    return render_template(
        "slurm/node.sh.j2",
        env=env_list(spec),
        trap_signals=["USR1", "USR2", "TERM"],
        launcher=launcher,
        nodes=spec.nodes,
        nproc=spec.nproc_per_node,
        rdzv_port=spec.rdzv_port,
        max_restarts=spec.max_restarts,
        signals_to_handle=SIGNALS_TO_HANDLE,
        shutdown_timeout=int(spec.train.get("shutdown_timeout_s", 30)),
        train_args=spec.train_argv(),
        requeue_marker=requeue_marker(spec),
        exit_requeue=EXIT_REQUEUE,
    ).rstrip("\n")


def teardown_script(spec: JobSpec) -> str:
    return render_template(
        "slurm/teardown.sh.j2",
        requeue_marker=requeue_marker(spec),
        requeue_limit=spec.slurm.requeue_limit,
        exit_requeue=EXIT_REQUEUE,
    ).rstrip("\n")


def srun_args(spec: JobSpec) -> list[str]:
    logs = log_dir(spec)
    args = [
        "--ntasks-per-node=1",
        f"--output={logs}/%j_%t_log.out",
        f"--error={logs}/%j_%t_log.err",
    ]
    if spec.slurm.container == "pyxis":
        args.append(f"--container-image={spec.image}")
    return args


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


# --- submission (side effects) ----------------------------------------------------------------


@dataclass
class NodeCommand:
    """What each submitit task (one per node) runs: the rendered node script, in bash.

    submitit's own handlers would requeue at once on USR2 (before the checkpoint is written)
    and its process would die on USR1; here the preemption signals only get logged, because
    SLURM delivers them to the whole step and the training saves and exits by itself.
    """

    script: str

    def __call__(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, _note_signal)
        rc = subprocess.run(["bash", "-c", self.script], check=False).returncode
        if rc != 0:
            # Not an exception: submitit would write an "error" result before the requeue,
            # and the real exit status (75: requeue) must reach the batch shell's teardown.
            raise SystemExit(rc)
        return rc


def _note_signal(signum: int, _frame: object) -> None:
    print(f"ddpkit: submitit task got {signal.Signals(signum).name}; waiting", file=sys.stderr)


def submitit_parameters(spec: JobSpec) -> dict[str, object]:
    """The spec's resources as submitit SlurmExecutor parameters (same #SBATCH lines)."""
    _check_tokens(spec)
    s = spec.slurm
    extra: dict[str, object] = {
        "open-mode": "append",
        "signal": f"{s.signal}@{s.grace_s}",
        "requeue" if s.requeue_limit > 0 else "no-requeue": True,
    }
    for line in s.extra_sbatch:
        key, _, value = line[2:].partition("=")
        extra[key] = value or True
    params: dict[str, object] = {
        "job_name": spec.name,
        "nodes": spec.nodes,
        "ntasks_per_node": 1,
        "cpus_per_task": spec.nproc_per_node * spec.cpus_per_proc,
        "time": spec.time_minutes,
        "setup": setup_script(spec).splitlines(),
        "teardown": teardown_script(spec).splitlines(),
        "additional_parameters": extra,
    }
    if spec.accelerator == "gpu":
        params["gpus_per_node"] = spec.nproc_per_node
    if spec.mem is not None:
        params["mem"] = spec.mem
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(s, key):
            params[key] = getattr(s, key)
    if s.exclusive:
        params["exclusive"] = True
    return params


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--poll-s", type=float, default=2.0, help="--wait: seconds between polls")


def submit(spec: JobSpec, opts: argparse.Namespace) -> int:
    if spec.slurm.container == "pyxis":
        raise SpecError(
            "submit cannot run pyxis jobs (submitit's task would start inside the image); "
            "use `make slurm-render` and `sbatch out/slurm/<name>.sbatch`"
        )
    import submitit  # lazy: only the SLURM backend needs it

    logs = Path(log_dir(spec))
    logs.mkdir(parents=True, exist_ok=True)
    executor = submitit.SlurmExecutor(folder=str(logs))
    executor.update_parameters(**submitit_parameters(spec))
    try:
        job = executor.submit(NodeCommand(node_script(spec)))
    except (FileNotFoundError, subprocess.CalledProcessError) as e:
        print(f"error: sbatch failed ({e}); is SLURM up? (make slurm-up)", file=sys.stderr)
        return 1
    job_id = str(job.job_id)
    record_job("slurm", job_id, name=spec.name, log_dir=str(logs), run_dir=spec.run_dir)
    print(f"submitted job {job_id} ({spec.name}: {spec.nodes} node(s) x {spec.nproc_per_node})")
    print(f"logs: {logs}/{job_id}_<node>_log.out (.err); run dir: {spec.run_dir}")
    print(f"follow: tail -F {logs}/{job_id}_0_log.out   or   make slurm-logs JOB={job_id}")
    if opts.wait:
        return wait(job_id, logs, opts.poll_s)
    return 0


def _job_fields(job_id: str) -> dict[str, str] | None:
    """`scontrol show job` as a dict (None when SLURM no longer knows the job)."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    )
    if out.returncode != 0 or "=" not in out.stdout:
        return None
    return dict(tok.split("=", 1) for tok in out.stdout.split() if "=" in tok)


def wait(job_id: str, logs: Path, poll_s: float = 2.0) -> int:
    """Follow the job (state changes and node 0's log) until it ends; return its exit status."""
    log = logs / f"{job_id}_0_log.out"
    offset, last = 0, ""
    while True:
        info = _job_fields(job_id)
        if log.exists():
            with log.open() as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
            sys.stdout.write(chunk)
        if info is None:
            print(f"job {job_id}: no longer known to slurmctld; see {logs}", file=sys.stderr)
            return 1
        state = info.get("JobState", "UNKNOWN")
        desc = f"{state} restarts={info.get('Restarts', '0')}"
        if desc != last:
            print(f"job {job_id}: {desc}", file=sys.stderr, flush=True)
            last = desc
        if state in TERMINAL_STATES:
            code = int(info.get("ExitCode", "1:0").split(":")[0])
            return code if state == "COMPLETED" or code else 1
        time.sleep(poll_s)


def _job_or_last(job: str | None) -> tuple[str, dict[str, object]]:
    if job is not None:
        if not job.isdigit():
            raise SpecError(f"job id {job!r} is not a SLURM job id; pass a number, e.g. JOB=123")
        return job, {}
    record = last_job("slurm")
    return str(record["job"]), record


def status(job: str | None, opts: argparse.Namespace) -> int:
    job_id, _ = _job_or_last(job)
    info = _job_fields(job_id)
    if info is None:
        print(f"job {job_id}: not known to slurmctld (finished long ago, or never existed)")
        return 1
    keys = ("JobId", "JobName", "JobState", "Reason", "ExitCode", "Restarts", "RunTime", "NodeList")
    print(" ".join(f"{k}={info[k]}" for k in keys if k in info))
    return 0


def logs(job: str | None, opts: argparse.Namespace) -> int:
    job_id, record = _job_or_last(job)
    log_root = record.get("log_dir")
    if log_root is None:
        info = _job_fields(job_id) or {}
        log_root = str(Path(info.get("StdOut", "")).parent) if info.get("StdOut") else None
    if log_root is None:
        print(f"error: no log directory known for job {job_id}", file=sys.stderr)
        return 1
    files = sorted(Path(str(log_root)).glob(f"{job_id}_*_log.*"))
    if not files:
        print(f"job {job_id}: no logs yet in {log_root}")
        return 1
    for path in files:
        print(f"==> {path} <==")
        print(path.read_text(errors="replace"), end="")
    return 0


def cancel(job: str | None, opts: argparse.Namespace) -> int:
    job_id, _ = _job_or_last(job)
    rc = subprocess.run(["scancel", job_id], check=False).returncode
    if rc == 0:
        print(f"cancelled job {job_id}")
    return rc

"""What the SLURM backend does on the cluster: sbatch, submitit's task (sweeps), scontrol/sacct/
sinfo, node logs.

Side effects only here; render.py stays pure (render never probes the cluster).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ddpkit.tools.jobspec import JobSpec, SpecError, parse_time_minutes
from ddpkit.train.contract import PREEMPT_SIGNALS


@dataclass
class NodeCommand:
    """What each submitit task (one per node) of a sweep's job array runs: the rendered node
    script, in bash. (A single job is the rendered script itself: cluster.sbatch.)

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


class SbatchError(Exception):
    """sbatch refused the job (the cluster's answer, not the user's input: exit 1)."""


def sbatch(script: str, logs: Path) -> str:
    """Queue the rendered script itself (what `render` prints): each node starts the node
    launcher at once, no submitit Python before it (~0.4 CPU-s and a process start per node).
    The batch shell writes into the log dir, task 0's files as submitit named them, so
    `logs` shows its requeue lines; the script is kept there as <id>_submission.sh.
    Returns the job id; sbatch's refusal is one line (SbatchError)."""
    logs = logs.resolve()
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f".submission-{os.getpid()}.sh"
    path.write_text(script)
    try:
        out = run_cmd(
            "sbatch", "--parsable", f"--output={logs}/%j_0_log.out",
            f"--error={logs}/%j_0_log.err", str(path),
        )  # fmt: skip
    except SpecError:  # no sbatch here
        path.unlink(missing_ok=True)
        raise
    if out.returncode != 0:
        path.unlink(missing_ok=True)
        raise SbatchError(sbatch_failure(out.stderr, out.returncode))
    job_id = out.stdout.strip().split(";")[0]  # --parsable: "id" or "id;cluster"
    path.replace(logs / f"{job_id}_submission.sh")
    return job_id


# What sbatch says when it cannot reach slurmctld or read its configuration: only then is
# "is SLURM up?" the hint. Any other refusal (a bad directive, an unknown partition, a limit)
# is the cluster's own words, with no guess at a cause.
SLURM_DOWN = (
    "Unable to contact slurm controller",
    "Could not establish a configuration source",
    "Unable to process configuration file",
    "Socket timed out",
    "Connection refused",
    "connect failure",
)


def sbatch_failure(stderr: str, rc: int) -> str:
    """One line for sbatch's refusal: its own last line, and the up hint only when down."""
    lines = stderr.strip().splitlines()
    tail = lines[-1] if lines else f"exit {rc}"
    down = any(marker in stderr for marker in SLURM_DOWN)
    return f"sbatch failed ({tail})" + ("; is SLURM up? (make slurm-up)" if down else "")


def run_cmd(*argv: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    except FileNotFoundError:
        raise SpecError(f"{argv[0]} not found: is SLURM installed here? (make slurm-up)") from None


def job_fields(job_id: str) -> dict[str, str] | None:
    """`scontrol show job` as a dict (None when slurmctld no longer knows the job)."""
    out = run_cmd("scontrol", "show", "job", "-o", job_id)
    if out.returncode != 0 or "=" not in out.stdout:
        return None
    return dict(tok.split("=", 1) for tok in out.stdout.split() if "=" in tok)


def sacct_fields(job_id: str) -> dict[str, str] | None:
    """The accounting record of a job slurmctld has forgotten (None without accounting)."""
    out = run_cmd("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,JobName,State,ExitCode")
    line = next((ln for ln in out.stdout.splitlines() if ln.split("|")[0] == job_id), None)
    if out.returncode != 0 or line is None:
        return None
    jid, name, state, code = line.split("|")[:4]
    return {"JobId": jid, "JobName": name, "JobState": state.split()[0], "ExitCode": code}


def named(params: dict[str, object], name: str) -> dict[str, object]:
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


def check_job_id(job: str) -> str:
    if not re.fullmatch(r"\d+(_\d+)?", job):
        raise SpecError(
            f"job id {job!r} is not a SLURM job id; pass a number (an array task: 123_4), "
            "e.g. JOB=123"
        )
    return job


def job_hosts(job_id: str) -> list[str]:
    """The job's nodes by host name, in SLURM's order (task t of a one-task-per-node step
    runs on the t-th); [] while slurmctld has none to tell (pending, or forgotten)."""
    nodes = (job_fields(job_id) or {}).get("NodeList", "")
    if not nodes or nodes == "(null)":
        return []
    out = run_cmd("scontrol", "show", "hostnames", nodes)
    return out.stdout.split() if out.returncode == 0 else []


class LogFollower:
    """Every node's log of a job, each line prefixed by its node's host name as squeue and
    sinfo show it: `[node2] ...` (`[node 1]`, SLURM's task number, when the host is not
    known). Not by node rank: torchrun's rendezvous orders the nodes its own way, so global
    rank 0 may print on the second node. emit() prints what is new since the last call;
    returns whether any log exists."""

    def __init__(self, root: Path, job_id: str) -> None:
        self.root, self.job_id = root, job_id
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, str] = {}
        self.hosts: list[str] = []

    def label(self, task: str) -> str:
        if not self.hosts:
            self.hosts = job_hosts(self.job_id)
        if task.isdigit() and int(task) < len(self.hosts):
            return self.hosts[int(task)]
        return f"node {task}"

    def emit(self) -> bool:
        files = sorted(self.root.glob(f"{self.job_id}_*_log.*"))
        for path in files:
            node = self.label(path.name.split("_")[1])
            stream = "" if path.suffix == ".out" else " err"
            with path.open(errors="replace") as f:
                f.seek(self.offsets.get(path, 0))
                text = self.partial.pop(path, "") + f.read()
                self.offsets[path] = f.tell()
            lines = text.split("\n")
            if lines[-1]:
                self.partial[path] = lines[-1]  # a line still being written
            for line in lines[:-1]:
                sys.stdout.write(f"[{node}{stream}] {line}\n")
        sys.stdout.flush()
        return bool(files)

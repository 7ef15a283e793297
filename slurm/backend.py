"""SLURM backend: render an sbatch script; submit sends that script to sbatch (a sweep's job
array goes through submitit).

The backend's shape, as every backend: this module holds the Backend subclass; render.py the
pure pieces (spec -> text: the job's three pieces of shell, and how `render` and `submit`
carry the same ones); cluster.py what touches the cluster (submitit, scontrol, sinfo).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

# The pure pieces and the cluster probes, named here too: `slurm.render(spec)`,
# `slurm.check_partition(spec)` read as the backend's own words.
from ddpkit.slurm.cluster import (
    LogFollower,
    NodeCommand,
    SbatchError,
    check_job_id,
    check_partition,
    check_secrets,
    job_fields,
    named,
    parse_sinfo,
    partition_limits,
    run_cmd,
    sacct_fields,
    sbatch,
    sbatch_failure,
)
from ddpkit.slurm.options import SlurmOptions
from ddpkit.slurm.render import (
    COMMENT,
    GRACE_MARGIN_S,
    STATES,
    enroot_ref,
    grace_s,
    log_dir,
    node_python,
    node_script,
    render,
    sbatch_options,
    setup_script,
    submitit_parameters,
    teardown_script,
    validate,
)
from ddpkit.tools.backends import (
    Backend,
    JobState,
    JobStatus,
    last_job,
    record_job,
)
from ddpkit.tools.backends.node_checks import check_node_env
from ddpkit.tools.jobspec import JobSpec, SpecError
from ddpkit.train.jsonshape import Opt

__all__ = [
    "GRACE_MARGIN_S",
    "LogFollower",
    "NodeCommand",
    "SlurmBackend",
    "check_partition",
    "enroot_ref",
    "grace_s",
    "log_dir",
    "node_script",
    "parse_sinfo",
    "partition_limits",
    "render",
    "sbatch_options",
    "setup_script",
    "submitit_parameters",
    "teardown_script",
    "validate",
]


def check_paths(spec: JobSpec) -> None:
    """The paths sbatch takes: a workspace with a space or a non-ASCII letter is fine (its
    #SBATCH --chdir is quoted, render.sbatch_word); a line break cannot be on an #SBATCH line,
    and SLURM reads `%` and `\\` in a log file's name as its own patterns (%j, an escape), so
    the log dir, where sbatch writes the batch shell's output, must hold neither."""
    workspace = spec.workspace or os.getcwd()
    if any(c in workspace for c in "\r\n"):
        raise SpecError(
            f"workspace {workspace!r} holds a line break, which no #SBATCH line can; "
            "move the project to a directory without one"
        )
    logs = os.path.join(workspace, log_dir(spec))  # as submit passes it (absolute)
    found = [c for c in ("%", "\\") if c in logs]
    if found:
        raise SpecError(
            f"the SLURM log dir {logs} holds {' and '.join(found)}, which SLURM reads as its "
            "file-name patterns; move the project to a path without them, or set "
            "slurm.log_dir to a directory whose path has none"
        )


class SlurmBackend(Backend):
    name = "slurm"
    file_ext = "sbatch"
    Options = SlurmOptions  # the job file's [slurm] table
    make_vars = {"PARTITION": "partition"}
    runs_torchft = True  # a replica group per node, the lighthouse on the first (render.py)
    job_file_lines = (
        '# partition = "gpu"',
        '# python = "/path/to/venv/bin/python"  # default: the Python that runs `ddpkit submit`',
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between polls")
        parser.add_argument(
            "-f", "--follow", action="store_true", help="logs: keep following, to the job's end"
        )

    def entry_python(self, spec: JobSpec) -> str:
        return node_python(spec) if spec.slurm.container == "none" else sys.executable

    def validate(self, spec: JobSpec) -> None:
        super().validate(spec)  # the [slurm] table's field checks (SlurmOptions)
        validate(spec)
        check_paths(spec)

    def stop_window(self, spec: JobSpec) -> tuple[int, str]:
        lead = grace_s(spec)
        return lead, f"SLURM --signal={spec.slurm.signal}@{lead} lead time, slurm.grace_s"

    def render(self, spec: JobSpec) -> str:
        return render(spec)

    def submit(self, spec: JobSpec, opts: argparse.Namespace) -> int:
        """sbatch of the rendered script (render(spec), byte for byte), after the checks."""
        logs, script = Path(log_dir(spec)), render(spec)  # pure: its refusals come first
        check_secrets(spec)
        check_partition(spec)
        if spec.slurm.container == "none":
            check_node_env(spec, node_python(spec), "slurm.python")
        try:
            job_id = sbatch(script, logs)
        except SbatchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        record_job(self.name, job_id, name=spec.name, log_dir=str(logs), run_dir=spec.run_dir)
        print(f"submitted job {job_id} ({spec.name}: {spec.nodes} node(s) x {spec.nproc_per_node})")
        print(f"logs: {logs}/{job_id}_<node>_log.out (.err); run dir: {spec.run_dir}")
        print(f"follow: ddpkit logs slurm {job_id} --follow")
        if opts.wait:
            follower = LogFollower(logs, job_id)
            on_poll = lambda _st: follower.emit()  # noqa: E731
            return self.wait(job_id, opts.poll_s, on_poll=on_poll, run_dir=spec.run_dir)
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
        params = [named(submitit_parameters(s), base) for s in specs]
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
        except FileNotFoundError as e:
            print(f"error: sbatch failed ({e}); is SLURM installed here? (make slurm-up)",
                  file=sys.stderr)  # fmt: skip
            return 1
        except subprocess.CalledProcessError as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
            print(f"error: {sbatch_failure(err or str(e), e.returncode)}", file=sys.stderr)
            return 1
        ids = [str(j.job_id) for j in jobs]
        record_job(self.name, ids[0], name=base, log_dir=str(logs), members=ids,
                   run_dirs=[s.run_dir for s in specs])  # fmt: skip
        print(f"submitted job array {ids[0].split('_')[0]} ({len(ids)} members of {base}):")
        for job_id, spec in zip(ids, specs, strict=True):
            print(f"  {job_id}: {spec.name}, run dir {spec.run_dir}")
        print(f"logs: {logs}/<job>_<node>_log.out; status: ddpkit status slurm ID")
        if not opts.wait:
            return 0
        codes = [self.wait(job_id, opts.poll_s) for job_id in ids]
        return next((c for c in codes if c), 0)

    def poll(self, job: str) -> JobStatus:
        info = job_fields(check_job_id(job))
        source = "scontrol"
        if info is None:
            info, source = sacct_fields(job), "sacct"
        if info is None:
            return JobStatus(job, JobState.UNKNOWN, detail="(neither slurmctld nor sacct knows it)")
        raw = info.get("JobState", "UNKNOWN")
        state = STATES.get(raw, JobState.FAILED)
        code = int(info.get("ExitCode", "0:0").split(":")[0]) if state.terminal else None
        keys = ("JobName", "JobState", "Reason", "ExitCode", "Restarts", "RunTime", "NodeList")
        detail = " ".join(f"{k}={info[k]}" for k in keys if k in info)
        return JobStatus(job, state, code, f"{detail} (from {source})")

    def logs(self, job: str | None, opts: argparse.Namespace) -> int:
        job_id = check_job_id(self.job_or_last(job))
        record = last_job(self.name, {"log_dir": Opt(str)}) if job is None else {}
        root = record.get("log_dir")
        if root is None:
            info = job_fields(job_id) or {}
            root = str(Path(info["StdErr"]).parent) if info.get("StdErr") else None
        if root is None:
            raise SpecError(f"no log directory known for job {job_id}; pass the job's logs dir")
        follower = LogFollower(Path(str(root)), job_id)
        if not getattr(opts, "follow", False):
            return 0 if follower.emit() else 1
        return self.wait(job_id, opts.poll_s, on_poll=lambda _st: follower.emit())

    def cancel(self, job: str | None, opts: argparse.Namespace) -> int:
        """End the job: a save on the way out is welcome, a requeue is not. scancel's SIGTERM
        asks for none (only slurm.signal does, train/contract.py's DDPKIT_REQUEUE_SIGNALS);
        the requeue flag is cleared first all the same, for a script of its own that writes
        the marker on any signal."""
        job_id = check_job_id(self.job_or_last(job))
        st = self.poll(job_id)
        if st.state.terminal:
            print(f"job {job_id} already ended ({st.state.value}); nothing to cancel")
            return 0
        run_cmd("scontrol", "update", f"JobId={job_id}", "Requeue=0")
        rc = run_cmd("scancel", job_id).returncode
        if rc == 0:
            print(f"cancelled job {job_id} (it may save a checkpoint on the way out; no requeue)")
        return rc

    def list_jobs(self, opts: argparse.Namespace) -> int:
        user = os.environ.get("USER") or str(os.getuid())
        out = run_cmd("squeue", "-h", "-u", user, "-o", "%i|%j|%T|%M|%D|%k")
        if out.returncode != 0:
            print(f"error: squeue failed: {out.stderr.strip()}", file=sys.stderr)
            return 1
        print("JOBID\tNAME\tSTATE\tTIME\tNODES")
        for line in out.stdout.splitlines():
            jid, name, state, elapsed, nodes, comment = line.split("|")[:6]
            if comment == COMMENT:
                print(f"{jid}\t{name}\t{state}\t{elapsed}\t{nodes}")
        return 0

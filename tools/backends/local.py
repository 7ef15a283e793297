"""Local backend: the job on this machine, through the same node launcher as every cluster.

    render   the command (a bash script): `python -m ddpkit.train.node --standalone ... -- <entry>`
    submit   runs it in the foreground, its output also in a log of its own,
             <run dir>/local/node-0.<start>-<job>.log, and node-0.log names the last one;
             the exit status is the node launcher's (0, 2 bad input, 3 diverged, 75 requeue)
    status / logs / cancel   of the last local job; cancel sends SIGTERM (the stop signal a
             scheduler sends), so the entry point can save and ask for a requeue

One node only (torchrun --standalone); `nproc_per_node` (--gpus) processes.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ddpkit.tools.backends import (
    Backend,
    JobState,
    JobStatus,
    drop_job,
    last_job,
    record_job,
)
from ddpkit.tools.backends.node_checks import check_node_env, node_imports
from ddpkit.tools.jobspec import JobSpec, SpecError, node_command, standalone
from ddpkit.tools.templating import shell_join, shell_quote
from ddpkit.train.contract import (
    CKPT_SUBDIR,
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_REQUEUE,
    METRICS_FILE,
    STOP_SIGNALS,
    SUMMARY_FILE,
    pid_alive,
)
from ddpkit.train.jsonshape import Opt

# What submit records and status/logs read back (last_job checks it).
RECORD = {"run_dir": str, "log": str, "exit_code": Opt(int)}

# To the node launcher: the stop signals (train.contract) and a closing terminal's SIGHUP.
FORWARDED = tuple(getattr(signal, name) for name in (*STOP_SIGNALS, "SIGHUP"))


def node_argv(spec: JobSpec) -> list[str]:
    if spec.nodes != 1:
        raise SpecError(
            f"local runs one node, got nodes = {spec.nodes}; use --nodes 1, or the slurm or "
            "k8s backend for several nodes"
        )
    # The interpreter running the launcher runs the job: the one with torch in it. torchft:
    # the supervisor runs the lighthouse and every group on this machine.
    return node_command(spec, standalone(spec.nproc_per_node), python=sys.executable)


def check_gpus(spec: JobSpec) -> None:
    """At submit (render reads nothing of the machine): more processes than GPUs is refused;
    no GPU at all is said in one line, since the job then runs on gloo CPU processes."""
    gpus = visible_gpus()
    if spec.accelerator == "gpu" and gpus and spec.nproc_per_node > gpus:
        raise SpecError(
            f"{spec.nproc_per_node} processes on {gpus} visible GPU(s): one process per GPU; "
            f"pass --gpus {gpus} (or fewer)"
        )
    if spec.accelerator == "gpu" and not gpus:
        print(
            f"ddpkit: no GPU visible; {spec.nproc_per_node} CPU process(es) with gloo",
            file=sys.stderr,
        )


def visible_gpus() -> int:
    """GPUs this machine shows the job (CUDA_VISIBLE_DEVICES honoured), without importing
    torch: the NVIDIA device nodes, or the visible list when it is set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(list(Path("/dev").glob("nvidia[0-9]*")))


def plot_run(run_dir: Path) -> None:
    try:
        import matplotlib  # noqa: F401  (the [plot] extra)
    except ImportError:
        print("(plots skipped: pip install 'ddpkit[plot]' for them)", file=sys.stderr)
        return
    from ddpkit.tools import plot

    plot.main([str(run_dir)])


def log_path(spec: JobSpec) -> Path:
    """node-0.log: the last job's log (a symbolic link to it)."""
    return Path(spec.run_dir) / "local" / "node-0.log"


def job_log(latest: Path, job: str) -> Path:
    """A new job's own log beside `latest`, which is made to name it: one log per job, and
    the documented path shows the last one (a job still running keeps writing to its own)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    own = latest.with_name(f"{latest.stem}.{stamp}-{job}{latest.suffix}")
    own.touch()
    link = latest.with_name(f".{latest.name}.{job}.tmp")
    try:
        link.unlink(missing_ok=True)
        link.symlink_to(own.name)
        os.replace(link, latest)
    except OSError:  # no symbolic links here: the job's own log is still recorded
        link.unlink(missing_ok=True)
    return own


class LocalBackend(Backend):
    name = "local"
    file_ext = "sh"
    runs_torchft = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--plot", action="store_true", help="submit: PNG charts of the metrics at the end"
        )
        parser.add_argument(
            "-f", "--follow", action="store_true", help="logs: show the log as it grows, to the end"
        )

    def render(self, spec: JobSpec) -> str:
        lines = [
            "#!/bin/bash",
            f"# ddpkit job {spec.name} on this machine: {spec.nproc_per_node} process(es), "
            "torchrun --standalone through the node launcher (train/node.py).",
        ]
        if spec.fault_tolerance == "torchft":
            lines.append(
                f"# fault_tolerance = torchft: torchft's lighthouse and {spec.groups} replica "
                "groups (one torchrun each, restarted alone when it dies; train/replica_groups.py)."
            )
        lines += [f"export {k}={shell_quote(v)}" for k, v in sorted(spec.launch_env().items())]
        lines.append(f"exec {shell_join(node_argv(spec))}")
        return "\n".join(lines) + "\n"

    def submit(self, spec: JobSpec, opts: argparse.Namespace) -> int:
        argv = node_argv(spec)
        check_gpus(spec)
        # The user's import paths (model, dataset, loss): checked in a Python of their own
        # before the run. torch and the node launcher need no such check here: the launcher
        # is this interpreter, and it imports both first, refusing in one line (train/node.py).
        if len(node_imports(spec)) > 2:
            check_node_env(spec, sys.executable, "python")
        # Unbuffered Python (the launcher, the workers): a script's prints reach the terminal
        # and the log as they happen, not in 8 KiB blocks at its end (a job's env may differ).
        env = {"PYTHONUNBUFFERED": "1", **os.environ, **spec.launch_env()}
        log_path(spec).parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        log = job_log(log_path(spec), str(proc.pid))
        with log.open("wb", buffering=0) as sink:  # `ddpkit logs local` reads it live
            record_job(self.name, str(proc.pid), run_dir=spec.run_dir, log=str(log))
            # A stop signal to this launcher reaches the job as it would from a scheduler.
            previous = {s: signal.signal(s, lambda n, _f: proc.send_signal(n)) for s in FORWARDED}
            try:
                assert proc.stdout is not None
                for chunk in iter(proc.stdout.readline, b""):
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                    sink.write(chunk)
                rc = proc.wait()
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
        if rc < 0:  # the launcher itself died by a signal (an OOM kill, a kill -9): say so
            rc = 128 - rc
            name = signal.Signals(rc - 128).name if rc - 128 in signal.valid_signals() else rc
            print(
                f"ddpkit: the node launcher (pid {proc.pid}) was killed by {name}, and its "
                f"workers with it; `ddpkit run` again resumes from the newest checkpoint in "
                f"{spec.checkpoint_dir} (the kit's trainer; your own script, from what it saved)",
                file=sys.stderr,
                flush=True,
            )
        if rc == EXIT_BAD_INPUT:  # refused before it ran (a dir in use): no record changes
            drop_job(self.name, str(proc.pid))
        else:
            record_job(self.name, str(proc.pid), run_dir=spec.run_dir, log=str(log), exit_code=rc)
        run_dir = Path(spec.run_dir)
        if rc == 0 and getattr(opts, "plot", False) and (run_dir / METRICS_FILE).is_file():
            plot_run(run_dir)
        if rc == 0 and run_dir.is_dir():  # after a failure the run's own error line is the news
            found = [n for n in (SUMMARY_FILE, METRICS_FILE, CKPT_SUBDIR) if (run_dir / n).exists()]
            listed = f" ({', '.join(found)})" if found else ""  # a user's script may write none
            print(f"outputs: {run_dir.resolve()}{listed}")
        return rc

    def poll(self, job: str) -> JobStatus:
        record = last_job(self.name, RECORD)
        if str(record["job"]) != job:
            return JobStatus(job, JobState.UNKNOWN, detail="(not the last local job)")
        where = f"run dir {record['run_dir']}"
        if "exit_code" in record:
            rc = int(record["exit_code"])
            if rc == 0:
                return JobStatus(job, JobState.SUCCEEDED, rc, where)
            if rc == EXIT_REQUEUE:  # nobody requeues here: submit again to resume
                return JobStatus(job, JobState.CANCELLED, rc, f"saved on a stop signal; {where}")
            if rc in (128 + signal.SIGTERM, EXIT_INTERRUPTED):  # a stop, not a failure
                return JobStatus(job, JobState.CANCELLED, rc, f"stopped by a signal; {where}")
            return JobStatus(job, JobState.FAILED, rc, where)
        if not pid_alive(int(job)):  # gone, or a zombie its parent has not reaped yet
            return JobStatus(job, JobState.UNKNOWN, detail="the launcher ended without a record")
        return JobStatus(job, JobState.RUNNING, detail=where)

    def logs(self, job: str | None, opts: argparse.Namespace) -> int:
        record = last_job(self.name, RECORD)
        path = Path(record["log"])
        if not path.is_file():
            print(f"job {record['job']}: no log yet ({path})")
            return 1
        if not getattr(opts, "follow", False):
            sys.stdout.write(path.read_text(errors="replace"))
            return 0
        job = str(record["job"])
        with path.open("rb") as log:
            while True:
                ended = self.poll(job).state is not JobState.RUNNING  # then a last read
                sys.stdout.buffer.write(log.read())
                sys.stdout.flush()
                if ended:
                    break
                time.sleep(0.5)
        for _ in range(20):  # the launcher's end is recorded just after it is reaped
            st = self.poll(job)
            if st.state is not JobState.UNKNOWN:
                break
            time.sleep(0.25)
        return 0 if st.state is JobState.SUCCEEDED else st.exit_code or 1

    def cancel(self, job: str | None, opts: argparse.Namespace) -> int:
        job = self.job_or_last(job)
        if self.poll(job).state is not JobState.RUNNING:  # never signal a reused pid
            print(f"job {job}: not running")
            return 1
        try:
            os.kill(int(job), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            print(f"job {job}: not running")
            return 1
        print(f"sent SIGTERM to job {job} (it saves and exits 75 when it supports requeue)")
        return 0

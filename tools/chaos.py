"""Fault drills: run a job, inject real failures while it trains, report the goodput.

    ddpkit chaos [--config FILE] [--set KEY=VALUE ...] [--backend local|slurm]
                 --inject KIND@WHEN[:TARGET] [--inject ...] [--seed N]
    ddpkit chaos --attach RUN_DIR --inject ...     (a job running already, on this machine:
                                                    its run dir as this machine sees it)

KIND      kill-rank  SIGKILL one worker (an OOM kill, a crashed process)
          kill-node  SIGKILL every process of one node: its workers and their launcher
          stop-rank  SIGSTOP one worker (a hang: its peers wait in a collective)
          preempt    the preemption signal to every launcher (SLURM's --signal, a pod delete)
WHEN      step=N (the run's logged step reaches N), time=S (seconds after the job started,
          or after the previous injection's recovery), random=A-B (a time drawn with --seed)
TARGET    rank=R (kill-rank/stop-rank; default 1), node=N (kill-node; the node rank, default 1)

Injections fire in order, each once the previous one's failure was recovered (a new
attempt started). Every injection is a record in the run's goodput log (its true start, so
the report can say how long detection took). At the end the goodput table is printed.

The processes are found in this machine's /proc by the run dir their launcher gave them
(DDPKIT_RUN_DIR, read inside the process's own mount namespace, so the directory matches
wherever it is mounted): the local backend, the local SLURM cluster, a container run here,
the local Kubernetes cluster's pods (attach to the claim's directory). On a
real cluster, run the drill's injections on the node itself, inside the allocation (`srun
--overlap --jobid JOB -w NODE ddpkit chaos --attach RUN_DIR ...`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import posixpath
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpkit.train import contract, failure, goodput
from ddpkit.train.contract import METRICS_FILE, RUN_DIR_ENV
from ddpkit.train.errors import CliParser, UserError

KINDS = failure.drill_kinds()  # kill-rank, kill-node, stop-rank, preempt
TARGET_WAIT_S = 30  # the injection's rank or node, once the job's first workers run
ATTACH_WAIT_S = 600  # --attach to a queued job: how long its workers may take to start


class ChaosError(UserError):
    """A bad drill (one line, exit 2)."""


@dataclass
class Injection:
    kind: str
    when: str  # "step" | "time"
    at: float  # the step, or seconds
    target: int

    @classmethod
    def parse(cls, text: str, rng: random.Random) -> Injection:
        kind, _, rest = text.partition("@")
        if kind not in KINDS:
            raise ChaosError(f"--inject {text!r}: the kind must be one of {', '.join(KINDS)}")
        when, _, target = rest.partition(":")
        key, _, value = when.partition("=")
        usage = (
            f"--inject {text!r}: write KIND@step=N, KIND@time=S or KIND@random=A-B, "
            "then optionally :rank=R or :node=N (e.g. kill-rank@step=40:rank=1)"
        )
        try:
            if key == "random":
                lo, hi = (_seconds(x) for x in value.split("-"))
                if lo > hi:
                    raise ChaosError(f"random=A-B needs A <= B (got {value})")
                at, key = rng.uniform(lo, hi), "time"
            elif key == "step":
                at = float(_whole(value, "step"))
            elif key == "time":
                at = _seconds(value)
            else:
                raise ValueError
            tkey, _, tval = target.partition("=")
            if target and tkey not in ("rank", "node"):
                raise ValueError
            want = TARGETS[kind]
            if target and tkey != want:
                fix = f":{want}=N" if want else "no target (it hits every launcher)"
                raise ChaosError(f"{kind} takes {fix}, not :{tkey}=")
            who = _whole(tval, tkey) if target else 1
        except ChaosError as e:
            raise ChaosError(f"--inject {text!r}: {e}") from None
        except ValueError:
            raise ChaosError(usage) from None
        return cls(kind, key, at, who)

    def check_against(self, nodes: int, world: int) -> None:
        """The target is in the job: a rank below its world size, a node below its node
        count (before anything starts, not once the job has trained a minute)."""
        if self.kind == "kill-node" and self.target >= nodes:
            raise ChaosError(
                f"--inject {self.kind}:node={self.target}: the job has {nodes} node(s) "
                f"(node 0..{nodes - 1})"
            )
        if self.kind in ("kill-rank", "stop-rank") and self.target >= world:
            raise ChaosError(
                f"--inject {self.kind}:rank={self.target}: the job has {world} rank(s) "
                f"(rank 0..{world - 1})"
            )


# The target key each drill kind takes (preempt: none, it signals every launcher).
TARGETS = {"kill-rank": "rank", "stop-rank": "rank", "kill-node": "node", "preempt": ""}


def _seconds(raw: str) -> float:
    """A time of the drill: finite, not negative (nan, inf, 1e400, -5 are refused)."""
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ChaosError(f"{raw!r}: a time is a number of seconds >= 0")
    return value


def _whole(raw: str, what: str) -> int:
    """A step, rank or node number: a whole number >= 0."""
    if not raw.strip().isdigit():
        raise ChaosError(f"{what}={raw!r}: must be a whole number >= 0")
    return int(raw)


@dataclass
class Proc:
    pid: int
    ppid: int
    rank: int
    node_rank: int
    attempt: int


def workers(run_dir: Path) -> list[Proc]:
    """The live workers of the run on this machine: torchrun set RANK and GROUP_RANK for
    them, and the node launcher DDPKIT_RUN_DIR (their /proc environ, as exec'd)."""
    want = _identity(run_dir)
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        env = _environ(int(entry.name))
        if "RANK" not in env or "GROUP_RANK" not in env or RUN_DIR_ENV not in env:
            continue
        if _run_dir_of(entry, env[RUN_DIR_ENV]) != want:
            continue
        state = stat.rsplit(")", 1)[1].split()
        if state[0] in ("Z", "X"):
            continue
        out.append(
            Proc(
                int(entry.name),
                int(state[1]),
                int(env["RANK"]),
                int(env["GROUP_RANK"]),
                goodput.attempt_number(env),
            )
        )
    return out


def _identity(path: Path) -> tuple[int, int] | str:
    """A directory as (device, inode), which names it across mount namespaces; its resolved
    path where it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return str(path.resolve())
    return st.st_dev, st.st_ino


def _run_dir_of(proc: Path, rd: str) -> tuple[int, int] | str:
    """The run dir a process was given, as _identity says it: the path is read inside the
    process's own mount namespace through /proc/PID/root, so a worker in a container or a
    pod (its run dir a bind mount at another path) matches the directory this machine sees."""
    try:
        cwd = os.readlink(proc / "cwd")
    except OSError:
        cwd = "/"
    inside = posixpath.normpath(posixpath.join(cwd, rd))
    try:
        st = os.stat(f"{proc}/root{inside}")
        return st.st_dev, st.st_ino
    except OSError:
        return str(Path(inside).resolve())


def logged_step(run_dir: Path) -> int:
    """The last step the run logged (metrics.jsonl's last line; its last 4 KB read)."""
    try:
        with (run_dir / METRICS_FILE).open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            step = json.loads(f.read().decode(errors="replace").strip().splitlines()[-1])["step"]
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return 0  # none yet, or a line cut short
    return step if isinstance(step, int) else 0


def _aimed_at(procs: list, inj: Injection) -> list:
    """The workers `inj` hits: all of them (preempt), a node's (kill-node), one rank's."""
    if inj.kind == "preempt":
        return procs
    if inj.kind == "kill-node":
        return [p for p in procs if p.node_rank == inj.target]
    return [p for p in procs if p.rank == inj.target]


def inject(run_dir: Path, inj: Injection) -> str:
    """Send the failure now; returns what was done. Nothing to hit: ChaosError."""
    procs = workers(run_dir)
    if inj.kind == "preempt":
        launchers = sorted({p.ppid for p in procs})
        if not launchers:
            raise ChaosError(f"no workers of {run_dir} on this machine to preempt")
        goodput.record(run_dir, "inject", what=failure.drilled(inj.kind).name)
        for pid in launchers:
            os.kill(pid, _preempt_signal(pid))
        return f"preemption signal to launcher(s) {launchers}"
    if inj.kind == "kill-node":
        mine = _aimed_at(procs, inj)
        if not mine:
            raise ChaosError(f"no workers of node rank {inj.target} of {run_dir} on this machine")
        parents = sorted({p.ppid for p in mine})
        goodput.record(
            run_dir, "inject", what=failure.drilled(inj.kind).name, node=_node_of(mine[0].pid)
        )
        for pid in [*parents, *(p.pid for p in mine)]:  # the launcher first: no restart
            _kill(pid, signal.SIGKILL)
        return f"SIGKILL to node rank {inj.target}: launcher(s) {parents} and their workers"
    hit = _aimed_at(procs, inj)
    if not hit:
        raise ChaosError(f"no worker of rank {inj.target} of {run_dir} on this machine")
    p = hit[0]
    what = failure.drilled(inj.kind).name
    goodput.record(run_dir, "inject", what=what, rank=p.rank, node=_node_of(p.pid))
    _kill(p.pid, signal.SIGKILL if inj.kind == "kill-rank" else signal.SIGSTOP)
    return f"{'SIGKILL' if inj.kind == 'kill-rank' else 'SIGSTOP'} to rank {p.rank} (pid {p.pid})"


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def _node_of(pid: int) -> str | None:
    """The node name the worker's records carry (goodput.node_name, read from its env)."""
    env = _environ(pid)
    if not env:
        return None
    return contract.node_name(env)


def _preempt_signal(launcher: int) -> int:
    """The signal that asks this launcher's job for a requeue: its own DDPKIT_REQUEUE_SIGNALS
    (a SLURM job's is its --signal, USR1 by default), not the drill's environment (found by a
    drill: SIGTERM to a SLURM job read as a cancel, exit 143, not requeued)."""
    from ddpkit.train.contract import requeue_signals

    return getattr(signal, requeue_signals(_environ(launcher))[0])


def attempts(run_dir: Path) -> int:
    return sum(1 for r in goodput.read(run_dir) if r["kind"] == "attempt")


def _await_target(run_dir: Path, inj: Injection, alive: Callable[[], bool]) -> None:
    """Until the injection's target runs: between attempts there are no workers for a while
    (wait for them to come back); once some run, the target's rank or node has TARGET_WAIT_S
    to start too (a drill at time=4 found rank 0 but not yet rank 1 on a loaded machine:
    "no worker of rank 1"), then inject() says what is missing."""
    since = None
    while alive():
        procs = workers(run_dir)
        if _aimed_at(procs, inj):
            return
        if procs:
            since = since or time.monotonic()
            if time.monotonic() - since > TARGET_WAIT_S:
                return
        time.sleep(0.2)


def drill(
    run_dir: Path,
    plan: list[Injection],
    alive: Callable[[], bool],
    say: Callable[[str], None] = print,
) -> None:
    """Fire `plan` in order against the run while `alive()` says the job runs."""
    t0 = time.monotonic()
    for i, inj in enumerate(plan):
        while alive():
            if inj.when == "step" and logged_step(run_dir) >= inj.at:
                break
            if inj.when == "time" and time.monotonic() - t0 >= inj.at:
                break
            time.sleep(0.2)
        else:
            say(f"chaos: the job ended before {inj.kind} could fire")
            return
        _await_target(run_dir, inj, alive)
        if not alive():
            say(f"chaos: the job ended before {inj.kind} could fire")
            return
        before = attempts(run_dir)
        say(f"chaos: {inj.kind}: {inject(run_dir, inj)}")
        if i == len(plan) - 1:
            return  # the last one: the caller waits for the job (attached: await_end)
        while alive() and attempts(run_dir) <= before:
            time.sleep(0.2)  # recovered once a new attempt started (or the job ended)
        t0 = time.monotonic()


def _attached(run_dir: Path) -> Callable[[], bool]:
    """Whether a job chaos did not start still runs: neither the trainer's last step (`done`)
    nor node 0's launcher exit 0 (`finished`, a user's script too) is noted after its latest
    attempt began, and its workers were seen in the last ATTACH_WAIT_S (between attempts
    there are none: a restart in place, a requeue, recreated pods)."""
    seen = [time.monotonic()]

    def alive() -> bool:
        if _ended(goodput.read(run_dir)):
            return False
        if workers(run_dir):
            seen[0] = time.monotonic()
        return time.monotonic() - seen[0] < ATTACH_WAIT_S

    return alive


def _ended(recs: list[dict]) -> bool:
    """The run's last attempt ended it: a `done` or `finished` record after the newest
    `attempt` (a run dir used again keeps the records of the run before)."""
    ends = [r["time"] for r in recs if r["kind"] in ("done", "finished")]
    starts = [r["time"] for r in recs if r["kind"] == "attempt"]
    return bool(ends) and max(ends) >= max(starts, default=0.0)


def await_end(run_dir: Path, alive: Callable[[], bool]) -> None:
    """Until the attached job's last attempt ended (`_attached`): its `done` record, or no
    workers for ATTACH_WAIT_S. Between attempts there are none for a while (a restart in
    place, a requeue, recreated pods): the report once they were gone came before the job
    resumed (a Kubernetes drill's preemption: 90% said at 944 s, the job trained on to
    1,054 s). Ctrl-C: the report now."""
    said = False
    try:
        while alive():
            if not said and not workers(run_dir):
                print(
                    "chaos: no workers now (between attempts?): the report once the job's last "
                    f"step is noted, or after {ATTACH_WAIT_S} s without workers (Ctrl-C: now)",
                    file=sys.stderr,
                )
                said = True
            time.sleep(1)
    except KeyboardInterrupt:
        pass


def build_parser() -> argparse.ArgumentParser:
    class _Parser(CliParser):
        error_class = ChaosError

    p = _Parser(prog="ddpkit chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="the job file (default: ./ddpkit.toml, else the kit's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--backend", default="local", choices=("local", "slurm"))
    p.add_argument("--attach", metavar="RUN_DIR", help="drill a job that runs already")
    p.add_argument("--inject", action="append", default=[], required=True, metavar="KIND@WHEN")
    p.add_argument("--seed", type=int, default=0, help="for random=A-B times")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    rng = random.Random(args.seed)
    plan = [Injection.parse(text, rng) for text in args.inject]
    if args.attach:
        run_dir = Path(args.attach)
        check_attach(run_dir)
        deadline = time.monotonic() + ATTACH_WAIT_S
        while not workers(run_dir) and time.monotonic() < deadline:
            time.sleep(0.5)  # a queued job: wait for its workers to start
        alive = _attached(run_dir)
        drill(run_dir, plan, alive=alive)
        await_end(run_dir, alive)
        return _report(run_dir, 0)
    from ddpkit.tools.jobspec import load_spec
    from ddpkit.tools.jobspec.load import default_job_file

    spec = load_spec(args.config or default_job_file(), args.set)
    for inj in plan:
        inj.check_against(spec.nodes, spec.nodes * _procs_per_node(spec))
    run_dir = Path(str(spec.workspace)) / spec.run_dir  # an absolute run_dir stays as it is
    cmd = [sys.executable, "-m", "ddpkit.cli", "submit", args.backend, "--wait"]
    if args.config:
        cmd += ["--config", args.config]
    for s in args.set:
        cmd += ["--set", s]
    before = _last_job(args.backend, spec.workspace)
    # A SIGTERM to the drill (a scheduler's, a `kill`) ends it as Ctrl-C does: the job goes too.
    signal.signal(signal.SIGTERM, _interrupt)
    job = subprocess.Popen(cmd)  # the job's own output goes to this terminal
    try:
        drill(run_dir, plan, alive=lambda: job.poll() is None)
        rc = job.wait()
    finally:
        if job.poll() is None:  # the drill was stopped: so is its job, and all under it
            _stop(job, args.backend, spec.workspace, before)
    return _report(run_dir, rc)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _procs_per_node(spec: Any) -> int:
    """The job's processes per node as a number (gpu/auto: the GPUs here, else 1)."""
    n = spec.nproc_per_node
    return int(n) if str(n).isdigit() else 1


def _last_job(backend: str, workspace: Any) -> str | None:
    from ddpkit.tools.backends import last_job

    with contextlib.suppress(Exception):
        cwd = os.getcwd()
        try:
            os.chdir(str(workspace))
            return str(last_job(backend, {})["job"])
        finally:
            os.chdir(cwd)
    return None


def _stop(job: subprocess.Popen, backend: str, workspace: Any, before: str | None) -> None:
    """End the drill's job: its `ddpkit submit --wait` (which passes the stop on to a local
    job's launcher and its workers), and a job it queued on a scheduler (cancelled), so that
    nothing of the drill is left running."""
    print("chaos: stopped; ending the drill's job", file=sys.stderr, flush=True)
    job.send_signal(signal.SIGINT)
    try:
        job.wait(timeout=120)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
    queued = _last_job(backend, workspace)
    if backend != "local" and queued and queued != before:
        subprocess.run(
            [sys.executable, "-m", "ddpkit.cli", "cancel", backend, queued],
            cwd=str(workspace), check=False, timeout=120,
        )  # fmt: skip


def check_attach(run_dir: Path) -> None:
    """--attach DIR drills a job that runs: DIR must exist (a queued job's: attach once it
    started), and its newest run must not have ended with nothing of it left running."""
    if not run_dir.is_dir():
        raise ChaosError(
            f"--attach {run_dir}: no such directory; attach once the job has started (its "
            "run dir exists), or drill a new job with --config"
        )
    recs = goodput.read(run_dir)
    if _ended(recs) and not workers(run_dir):
        when = time.strftime("%H:%M:%S", time.localtime(max(r["time"] for r in recs)))
        raise ChaosError(
            f"--attach {run_dir}: its run ended at {when} and nothing of it runs here; a drill "
            "needs a job that runs"
        )


def _report(run_dir: Path, rc: int) -> int:
    rep = goodput.write_report(run_dir)
    if rep is None:
        print(f"chaos: no goodput records in {run_dir}", file=sys.stderr)
        return rc or 1
    # The table only: its first line is the run's goodput line (the job's own output said it
    # already when it recovered; the table adds the figures), and goodput.json has the rest.
    print(rep.table())
    print(f"chaos: the whole report: {run_dir / goodput.REPORT_FILE}")
    return rc


if __name__ == "__main__":
    from ddpkit.train.errors import run_cli

    sys.exit(run_cli(main))

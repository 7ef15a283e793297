"""The goodput report: a run's records turned into productive time, start-up, checkpoint time
that blocked training and the failures with what each cost; its one line, its table and
`ddpkit status`'s lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddpkit.train import failure
from ddpkit.train.contract import RUN_ID_ENV
from ddpkit.train.goodput.records import NODE_FAILURES_TO_EXCLUDE, REPORT_FILE, read


@dataclass
class Loss:
    """One failure (or preemption) and what it cost, in seconds."""

    kind: str  # killed | crashed | hang | left early | node lost | preempted | <injected kind>
    attempt: int  # the attempt it ended (0 = the first launch; counts across requeues)
    at: float  # when it happened (epoch seconds; the injection's time for a drill)
    rank: int | None = None
    node: str | None = None  # its host, as its scheduler names it (places.host)
    node_number: int | None = None  # SLURM's node number, else the rendezvous' (places)
    detect_s: float = 0.0
    restart_s: float = 0.0
    load_s: float = 0.0
    # The steps done again: None when unknown (the entry point notes no `ready`/`save`, so
    # nobody knows which steps were kept), then not in lost_s, which is a floor.
    recompute_s: float | None = 0.0
    recovered: bool = False  # a later attempt got going again

    @property
    def lost_s(self) -> float:
        return self.detect_s + self.restart_s + self.load_s + (self.recompute_s or 0.0)


@dataclass
class Report:
    wall_s: float
    productive_s: float | None  # None: nothing noted `ready` (a script that records no steps)
    ckpt_blocking_s: float
    startup_s: float
    attempts: int
    failures: list[Loss] = field(default_factory=list)
    finished: bool = False
    # A finished run's wall ends at its last step (`done`), so the figure is the same at the
    # last step (the summary, the end-of-run line) and after the processes exit; the time its
    # processes then took to end (the summary's gather, the pods' exit) is this, not hidden.
    teardown_s: float = 0.0
    run: str | None = None  # the run reported (contract.RUN_ID_ENV)
    # The step its first attempt resumed at, from a checkpoint an earlier run left in the same
    # checkpoint dir (a local smoke test's, a rerun's): not a failure of this run, said apart.
    resumed_step: int | None = None
    cancelled: str | None = None  # the stop signal of a cancel (not a requeue, not a failure)
    launches: int = 1  # >1: the scheduler started the run again (a requeue, recreated pods)

    @property
    def goodput(self) -> float | None:
        if self.productive_s is None or self.wall_s <= 0:
            return None
        return min(1.0, self.productive_s / self.wall_s)

    @property
    def lost_s(self) -> float:
        return sum(f.lost_s for f in self.failures)

    def failing_nodes(self, times: int = NODE_FAILURES_TO_EXCLUDE) -> list[str]:
        """The nodes with at least `times` failures (a preemption is no node's fault): on
        SLURM the requeue excludes them from the next attempt."""
        counts: dict[str, int] = {}
        for f in self.failures:
            if f.node and failure.counts_against_node(f.kind):
                counts[f.node] = counts.get(f.node, 0) + 1
        return sorted(n for n, c in counts.items() if c >= times)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["goodput"] = self.goodput
        out["lost_s"] = round(self.lost_s, 3)
        out["failing_nodes"] = self.failing_nodes()
        for f, d in zip(self.failures, out["failures"], strict=True):
            d["lost_s"] = round(f.lost_s, 3)
        return out

    def line(self) -> str:
        """The run's goodput in one sentence."""
        n = len(self.failures)
        what = f"{n} failure{'s' if n != 1 else ''}, {self.lost_s:.0f} s lost"
        if any(f.recompute_s is None for f in self.failures):
            what += " or more"
        if self.cancelled:
            what += f"; cancelled ({self.cancelled})"
        if self.goodput is None:
            return (
                f"goodput unknown ({what}, {self.wall_s:.0f} s wall): the entry point notes no "
                "steps (ddpkit.train.goodput.note)"
            )
        return f"goodput {self.goodput:.0%}: {what}"

    def resumed_line(self) -> str | None:
        """Where the run started, when it resumed an earlier run's checkpoint."""
        if not self.resumed_step:
            return None
        return (
            f"resumed at step {self.resumed_step} from a checkpoint an earlier run left in the "
            "checkpoint dir (not a failure of this run; `--set train.resume=never` starts over)"
        )

    def table(self) -> str:
        """The drill's report: the totals, then one row per failure."""
        productive = "unknown" if self.productive_s is None else f"{self.productive_s:.1f} s"
        rows = [
            self.line(),
            f"  wall {self.wall_s:.1f} s, productive {productive}, "
            f"start-up {self.startup_s:.1f} s, checkpoints blocking {self.ckpt_blocking_s:.1f} s, "
            f"attempts {self.attempts}"
            + (f", after the last step {self.teardown_s:.1f} s (not in the wall)"
               if self.teardown_s >= 0.05 else ""),
        ]  # fmt: skip
        if self.failures:
            head = ("kind", "attempt", "rank", "node", "detect", "restart", "load", "redo", "lost")
            table = [head] + [
                tuple(str(c) for c in (
                    f.kind,
                    f.attempt,
                    "-" if f.rank is None else f.rank,
                    f.node or "-",
                    *("?" if v is None else f"{v:.1f}s"
                      for v in (f.detect_s, f.restart_s, f.load_s, f.recompute_s)),
                    f"{f.lost_s:.1f}s",
                ))
                for f in self.failures
            ]  # fmt: skip
            # columns as wide as their longest cell: a Kubernetes node's name is not cut
            widths = [max(9, *(len(r[i]) for r in table)) + 1 for i in range(len(head))]
            rows += ["  " + "".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
                     for r in table]  # fmt: skip
            if any(f.recompute_s is None for f in self.failures):
                rows.append(
                    "  ?: unknown (the entry point notes no steps: ddpkit.train.goodput.note)"
                )
        if resumed := self.resumed_line():
            rows.append(f"  {resumed}")
        return "\n".join(rows)


def _left_at(e: dict[str, Any]) -> float | None:
    """When a worker left of its own accord: its code returned, or it exited 0."""
    if e.get("returned") is not None:
        return float(e["returned"])
    return float(e["time"]) if e.get("code") == 0 else None


def _culprit(
    ends: list[dict[str, Any]], nodes: set[str], left: list[dict[str, Any]] = ()
) -> tuple[str, int | None, str | None]:
    """(kind, rank, node) of an attempt's failure from its workers' ends (exact times).
    `left`: the ends of workers that left of their own accord (exit 0, or their code
    returned); one that left before the first failure, whose own code had not returned,
    is the cause: its peers' collectives were left waiting (a shorter data shard)."""
    silent = sorted(nodes - {e.get("node") for e in [*ends, *left]})
    if not ends:
        return failure.NODE_LOST.name, None, silent[0] if silent else None  # nobody lived to say
    first = min(ends, key=lambda e: e["time"])  # the launcher timed every end as it happened
    early = sorted(
        (t, int(e.get("rank", 0)), e)
        for e in left
        if (t := _left_at(e)) is not None and t < first["time"]
    )
    if early and first.get("returned") is None:
        _, rank, e = early[0]
        return failure.LEFT_EARLY.name, rank, e.get("node")
    if first.get("missing"):  # it gave up waiting: the rank it waited for is the cause
        hung = int(first["missing"][0])
        # ... and when that rank's own end was a failure of its own (not the launcher's stop),
        # that is the kind: a rank killed under load may be reaped after its peer gave up
        theirs = [e for e in ends if e.get("rank") == hung and not e.get("stopped")]
        if theirs and not theirs[0].get("missing") and not theirs[0].get("stuck"):
            return (
                failure.kind_of(int(theirs[0].get("code", 1)), theirs[0]),
                hung,
                theirs[0].get("node"),
            )
        return (
            failure.HANG.name,
            hung,
            next((e.get("node") for e in ends if e.get("rank") == hung), None),
        )
    if silent:  # a node whose launcher reported nothing died with its workers
        return failure.NODE_LOST.name, None, silent[0]
    by_node: dict[str, list[dict[str, Any]]] = {}
    for e in ends:
        by_node.setdefault(str(e.get("node")), []).append(e)
    mates = by_node[str(first.get("node"))]
    # Every worker of a node SIGKILLed at once, its launcher alive (the OOM killer, a drill's
    # kill of the workers): the node's. Not the SIGKILL torchrun's stop sends a rank that did
    # not end within the shutdown budget (a rank stuck beside the killed one): that read as a
    # lost node in CI (Kubernetes, one rank of two killed).
    if len(by_node) > 1 and all(
        e.get("code") == -signal.SIGKILL and not e.get("stopped") for e in mates
    ):
        return failure.NODE_LOST.name, None, first.get("node")
    return failure.kind_of(int(first.get("code", 1)), first), first.get("rank"), first.get("node")


# How a worker ends when a cancel reaches it first (its own handler, or the signal itself)
_CANCEL_CODES = {-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGINT}


def _failed_first(ends: list[dict[str, Any]], stop: dict[str, Any]) -> bool:
    """A worker of the attempt failed on its own before the stop signal arrived: the stop
    (SLURM's srun ends the step's other tasks once one node failed) followed a failure, it
    did not cause one. Not a worker the launcher stopped, nor one the cancel reached first."""
    return any(
        e["time"] <= stop["time"] and not e.get("stopped") and e.get("code") not in _CANCEL_CODES
        for e in ends
    )


def _place(group: list[dict[str, Any]], rank: int | None) -> tuple[int | None, str | None]:
    """(node number, host) of `rank` in an attempt, from its launchers' `attempt` records
    (each names its node's ranks): a rank that never ended by itself (hung, its node gone)
    is placed too."""
    if rank is None:
        return None, None
    for r in group:
        lo_hi = r.get("ranks")
        if r["kind"] == "attempt" and isinstance(lo_hi, list) and len(lo_hi) == 2:
            with contextlib.suppress(TypeError, ValueError):
                if int(lo_hi[0]) <= int(rank) < int(lo_hi[1]):
                    number = r.get("node_number")
                    return (int(number) if isinstance(number, int) else None), r.get("node")
    return None, None


def _cut_short(order: list[list[dict[str, Any]]], i: int, injects: list[dict[str, Any]]) -> bool:
    """Attempt `i` is an in-place restart cut short: its launcher restarted the workers after
    the failure before it (the same launch), they never got ready nor ended on their own, no
    drill fired in it, and the job went on as a new launch (Kubernetes: a peer's pod was
    recreated, so this pod was too, ddpkit.k8s.attempt). Its time is that failure's
    recovery, not a failure of its own."""
    g, before, after = order[i], order[i - 1], order[i + 1]
    launch = g[0].get("launch")
    if before[0].get("launch") != launch or after[0].get("launch") == launch:
        return False
    if any(r["kind"] in ("ready", "stop", "done") for r in g):
        return False
    if any(r["kind"] == "end" and r.get("code") != 0 for r in g):
        return False
    start, end = g[0]["time"], after[0]["time"]
    return not any(start <= r["time"] < end for r in injects)


def report(
    run_dir: str | Path, now: float | None = None, ended: bool = False, run: str | None = None
) -> Report | None:
    """The goodput of the run in `run_dir` from its records; None when there are none.
    ended: the job step is over (the batch shell asks before a requeue), so an attempt that
    left no end record did not run on: every one of its nodes died with it (a 1-node job's
    lost node), and that is a failure too. run: the run to report (default: this process's run,
    contract.RUN_ID_ENV, else the newest in the run dir)."""
    recs = read(run_dir, run or os.environ.get(RUN_ID_ENV))
    if not recs:
        return None
    groups: dict[tuple[Any, int], list[dict[str, Any]]] = {}
    for r in recs:
        if r["kind"] != "inject":  # the drill's own records belong to no attempt
            groups.setdefault((r.get("launch"), int(r.get("attempt") or 0)), []).append(r)
    order = sorted(groups.values(), key=lambda g: g[0]["time"])
    injects = [r for r in recs if r["kind"] == "inject"]
    productive: float | None = None
    blocking = startup = 0.0
    losses: list[Loss] = []
    finished = False
    cancelled: str | None = None
    cut_short = {i for i in range(1, len(order) - 1) if _cut_short(order, i, injects)}
    for i, g in enumerate(order):
        if i in cut_short:
            continue
        starts = [r["time"] for r in g if r["kind"] == "attempt"] or [g[0]["time"]]
        start = min(starts)
        ready = next((r for r in g if r["kind"] == "ready"), None)
        saves = [r for r in g if r["kind"] == "save"]
        done = next((r for r in g if r["kind"] == "done"), None)
        stop = next((r for r in g if r["kind"] == "stop"), None)
        ends = [r for r in g if r["kind"] == "end" and r.get("code") != 0]
        left = [r for r in g if r["kind"] == "end" and _left_at(r) is not None]
        if stop is not None and stop.get("cancel") and _failed_first(ends, stop):
            stop = None  # srun stopping a step after a node failed: the failure is the story
        blocked = sum(float(s.get("blocking_s") or 0) for s in saves)
        blocking += blocked
        if ready is not None:
            productive = productive or 0.0
            load = float(ready.get("load_s") or 0)
            if i == 0 or not losses:
                startup += max(0.0, ready["time"] - start - load)
        if done is not None:
            finished = True
        if ready is not None:
            kept_end = (done or stop or (saves[-1] if saves else ready))["time"]
            kept = [s for s in saves if s["time"] <= kept_end]
            blocked_kept = sum(float(s.get("blocking_s") or 0) for s in kept)
            productive = (productive or 0.0) + max(0.0, kept_end - ready["time"] - blocked_kept)
        else:
            kept_end = start
        if done is not None:
            continue
        if stop is not None and stop.get("cancel"):  # the user's or an admin's stop: no failure
            cancelled = str(stop["cancel"])
            continue
        nxt = next((order[j] for j in range(i + 1, len(order)) if j not in cut_short), None)
        if stop is None and not ends and nxt is None and not ended:
            continue  # still running (or its node vanished without a word: nothing to say)
        window_end = nxt[0]["time"] if nxt else float("inf")
        inj = next((r for r in injects if start <= r["time"] < window_end), None)
        if stop is not None:
            kind, rank, node = failure.PREEMPTED.name, None, stop.get("node")
            at = stop["time"]
            down = at
        else:
            nodes = {str(r.get("node")) for r in g if r["kind"] == "attempt"}
            # A node whose launcher started the next in-place attempt was not lost, even if
            # none of its workers' ends was noted (torchrun reaped them first, under load).
            if order[i + 1 :] and order[i + 1][0].get("launch") == g[0].get("launch"):
                nodes -= {str(r.get("node")) for r in order[i + 1] if r["kind"] == "attempt"}
            kind, rank, node = _culprit(ends, nodes, left)
            if inj is not None:
                kind = str(inj.get("what") or kind)
                rank = inj.get("rank", rank)
                node = inj.get("node", node)
            number, host = _place(g, rank)
            node = host or node
            first_end = min((e["time"] for e in ends), default=kept_end)
            at = inj["time"] if inj is not None else first_end
            down = max((e["time"] for e in ends), default=at)
        loss = Loss(kind, i, at, rank, node)
        if stop is None:
            loss.node_number = number
        loss.detect_s = max(0.0, down - at)
        loss.recompute_s = max(0.0, at - kept_end) if ready is not None else None
        if nxt is not None:
            n_ready = next((r for r in nxt if r["kind"] == "ready"), None)
            loss.recovered = True
            if n_ready is not None:
                loss.load_s = float(n_ready.get("load_s") or 0)
                loss.restart_s = max(0.0, n_ready["time"] - down - loss.load_s)
            else:
                loss.restart_s = max(0.0, nxt[0]["time"] - down)
        losses.append(loss)
    first_ready = next((r for r in order[0] if r["kind"] == "ready"), None) if order else None
    resumed = None
    if first_ready is not None and not first_ready.get("fresh"):
        with contextlib.suppress(TypeError, ValueError):
            resumed = int(first_ready.get("step") or 0) or None
    latest = max(r["time"] for r in recs)
    if finished:
        last = max(r["time"] for r in recs if r["kind"] == "done")
    else:
        last = latest if now is None else now
    return Report(
        wall_s=max(0.0, last - recs[0]["time"]),
        teardown_s=max(0.0, latest - last) if finished else 0.0,
        productive_s=productive,
        ckpt_blocking_s=blocking,
        startup_s=startup,
        attempts=len(order) - len(cut_short),
        failures=losses,
        finished=finished,
        run=next((r["run"] for r in recs if r.get("run")), None),
        resumed_step=resumed,
        cancelled=cancelled,
        launches=len({r.get("launch") for r in recs if r["kind"] != "inject"}),
    )


def write_report(run_dir: str | Path) -> Report | None:
    """Compute the report and write it to <run_dir>/goodput.json (atomically)."""
    rep = report(run_dir)
    if rep is None:
        return None
    path = Path(run_dir) / REPORT_FILE
    with contextlib.suppress(OSError):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rep.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)
    return rep


def status_lines(run_dir: str | Path) -> list[str]:
    """What `ddpkit status` adds for a run whose run dir is on this machine: the goodput so
    far and one line per failure (kind, rank, node, attempt, seconds lost). A torchft job
    (fault_tolerance = "torchft") keeps them per replica group, in <run dir>/group-<g>: one
    block per group, each headed by its name."""
    rep = report(run_dir, now=time.time())
    if rep is None:
        out: list[str] = []
        groups = {
            int(n): g
            for g in Path(run_dir).glob("group-*")
            if (n := g.name.removeprefix("group-")).isdigit()
        }
        for _, g in sorted(groups.items()):
            if lines := status_lines(g):
                out += [f"  {g.name}:", *(f"  {line}" for line in lines)]
        return out
    out = [f"  {rep.line()} (wall {rep.wall_s:.0f} s, {rep.attempts} attempt(s))"]
    if resumed := rep.resumed_line():
        out.append(f"  {resumed}")
    from ddpkit.train import places

    for f in rep.failures:
        if f.rank is not None:
            who = places.name(f.rank, f.node_number, f.node)
        else:
            who = f"on {f.node}" if f.node else ""
        state = "recovered" if f.recovered else "not recovered (yet)"
        out.append(
            f"  failure: {f.kind} {who} in attempt {f.attempt}, {f.lost_s:.0f} s lost, {state}"
        )
    if (bad := rep.failing_nodes()) and rep.launches > 1:
        out.append(
            f"  excluded from the next attempt (SLURM): {', '.join(bad)} "
            f"(failed {NODE_FAILURES_TO_EXCLUDE} times or more)"
        )
    elif bad:  # one launch (local, or no requeue yet): nothing was left out
        out.append(
            f"  failed {NODE_FAILURES_TO_EXCLUDE} times or more: {', '.join(bad)} (a SLURM requeue "
            "leaves such a node out)"
        )
    return out

"""Goodput: how much of a run's wall time was training that was kept, and where the rest went.

Every party to a run appends small records to <run dir>/goodput/ (one JSON file each, written
to a temporary name and renamed into place, so a reader never sees half a record and a
restart, a requeue or another node never overwrites one):

    attempt  the node launcher, when a torchrun attempt starts its workers (per node)
    end      the node launcher, when one of its workers ends with a nonzero status
    ready    the trainer's rank 0 (or a user's script), once resumed: `load_s` the load took;
             `fresh` on the first start of a run that starts over (`--resume never`)
    save     the same, after a checkpoint save: `blocking_s` the training waited for it
    stop     the node launcher, when the attempt saved on a stop signal (a requeue)
    done     the trainer's rank 0, when the run finished its last step
    inject   `ddpkit chaos`, when it injected a failure (its true start, for detection times)

`report(run_dir)` reads them all, whoever wrote them and on whichever attempt (from the last
fresh start on: a run dir reused with `--resume never` is a new run), and splits the
wall time: productive (from `ready` to the last save an attempt kept, less the time saves
blocked), checkpoint time that blocked training, start-up, and per failure: detection (the
failure to the moment its group was down), restart (down to the next attempt's `ready`, a
requeue's time in the queue included, less its load), checkpoint load, and the work
recomputed (the last kept save to the failure). A finished run's wall time ends at its last
`done`: what its processes took to exit after it is `teardown_s`, beside it. A user's script that notes no `ready`/`save`
gets the failures and the wall time, and no goodput figure.

torch-free, and never fails a run: a record that cannot be written is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddpkit.train import contract, failure
from ddpkit.train.contract import LAUNCH_ID_ENV, RDZV_ROUND_ENV, RUN_DIR_ENV, RUN_ID_ENV

GOODPUT_DIR = "goodput"  # <run dir>/goodput/<time>-<node>-<uid>-<kind>.json
REPORT_FILE = "goodput.json"  # the last report, written by the launcher of node 0 at its exit
NODE_FAILURES_TO_EXCLUDE = 2  # a node that failed this often is left out of the next attempt
KINDS = ("attempt", "end", "ready", "save", "stop", "done", "inject", "finished")


def node_name() -> str:
    """The node a record comes from, as its scheduler names it (contract.node_name)."""
    return contract.node_name()


def attempt_number(env: Mapping[str, str] | None = None) -> int:
    """The in-place attempt a worker runs in (0 outside torchrun): the rendezvous round its
    group formed in, which the node launcher hands every worker and which is the same on every
    node, else torchrun's restart count. That count is per node: a node whose agent restarted
    for another node's failure (a membership change) keeps it, so its records of the new
    attempt looked like the old attempt's and the failure went uncounted (seen with two node
    launchers, one rank killed: `0 failures`)."""
    env = os.environ if env is None else env
    try:
        return int(env.get(RDZV_ROUND_ENV) or env.get("TORCHELASTIC_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def first_start() -> bool:
    """This is the first attempt of the job: no in-place restart (the round: torchrun's count
    stays 0 on a node restarted for another node's failure), no
    requeue (SLURM's count) and no recreated pod (Kubernetes: ddpkit.k8s.attempt's count)
    before it. A run that starts over starts over here only."""
    return attempt_number() == 0 and contract.scheduler_attempt() == 0


def record(run_dir: str | Path | None, kind: str, **fields: Any) -> Path | None:
    """Append one record of `kind` to <run_dir>/goodput/ (atomically); None when it cannot."""
    if run_dir is None or kind not in KINDS:
        return None
    now = float(fields.pop("time", None) or time.time())
    body = {
        "kind": kind,
        "time": now,
        "launch": os.environ.get(LAUNCH_ID_ENV),
        "run": os.environ.get(RUN_ID_ENV),
        "attempt": attempt_number(),
        "node": node_name(),
        **fields,
    }
    folder = Path(run_dir) / GOODPUT_DIR
    name = f"{int(now * 1e6):017d}-{body['node']}-{uuid.uuid4().hex[:8]}-{kind}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{name}.tmp"
        tmp.write_text(json.dumps(body) + "\n")
        os.replace(tmp, folder / name)
    except (OSError, TypeError, ValueError):
        return None  # accounting must never end a run (a full disk says so elsewhere)
    return folder / name


def note(kind: str, **fields: Any) -> Path | None:
    """A record from a worker: into the launch's run dir (DDPKIT_RUN_DIR). The public API for
    a user's script: note("ready", step=s, load_s=t) once resumed, note("save", step=s,
    blocking_s=t) after each checkpoint; call it on one rank only."""
    return record(os.environ.get(RUN_DIR_ENV), kind, **fields)


def read(run_dir: str | Path, run: str | None = None) -> list[dict[str, Any]]:
    """Every well-formed record of one run, oldest first (torn or foreign files skipped): of
    run `run` (contract.RUN_ID_ENV), by default the newest run in the run dir, from its last
    fresh start on (current_run). A run dir holds every run of its job (a local smoke test,
    then the cluster, then a rerun): each is reported alone, and the time between them is
    nobody's. Records of a kit before run ids carry none: they are one run."""
    return current_run(of_run(read_all(run_dir), run))


def runs(recs: list[dict[str, Any]]) -> list[str]:
    """The run ids in `recs`, oldest first."""
    return list(dict.fromkeys(r["run"] for r in recs if r.get("run")))


def of_run(recs: list[dict[str, Any]], run: str | None = None) -> list[dict[str, Any]]:
    """The records of run `run` (default: the newest), and the drill's injections in its time
    (`ddpkit chaos` names the run it hit when it could read it). Without run ids (an older
    kit's records): all of them."""
    known = runs(recs)
    if not known:
        return recs
    want = run if run is not None else known[-1]
    mine = [r for r in recs if r.get("run") == want]
    if not mine:
        return []
    start = mine[0]["time"]
    return [
        r
        for r in recs
        if r.get("run") == want
        or (r["kind"] == "inject" and not r.get("run") and r["time"] >= start)
    ]


def current_run(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records from the start of the attempt whose `ready` is the last fresh one: an
    earlier run in the same run dir (one that `--resume never` started over) is not this
    run's. That attempt began at its first record (its launcher's `attempt`)."""
    fresh = [r for r in recs if r["kind"] == "ready" and r.get("fresh")]
    if not fresh:
        return recs
    key = (fresh[-1].get("launch"), int(fresh[-1].get("attempt") or 0))
    start = min(r["time"] for r in recs if (r.get("launch"), int(r.get("attempt") or 0)) == key)
    return [r for r in recs if r["time"] >= start]


def read_all(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every well-formed record in the run dir, of every run it held, oldest first."""
    folder = Path(run_dir) / GOODPUT_DIR
    out = []
    with contextlib.suppress(OSError):
        for p in folder.iterdir():
            if p.name.startswith(".") or p.suffix != ".json":
                continue
            try:
                body = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if (
                isinstance(body, dict)
                and body.get("kind") in KINDS
                and isinstance(body.get("time"), (int, float))
            ):
                out.append(body)
    return sorted(out, key=lambda r: r["time"])


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


# --- the node launcher's side (train/node.py) -------------------------------------------------


def launcher_attempt(attempt: int, local_rank: int, env: dict[str, str] | None = None) -> None:
    """A torchrun attempt starts its workers on this node (noted once, by local rank 0),
    with the node's number and its ranks (from local rank 0's environment), so the report
    places a rank that never said anything itself."""
    if local_rank != 0:
        return
    from ddpkit.train import places

    where: dict[str, Any] = {}
    with contextlib.suppress(KeyError, ValueError, TypeError):
        first = int((env or {})["RANK"])
        where = {
            "node_number": places.node_number(int((env or {})["GROUP_RANK"])),
            "ranks": [first, first + int((env or {})["LOCAL_WORLD_SIZE"])],
        }
    record(os.environ.get(RUN_DIR_ENV), "attempt", attempt=attempt, **where)


_LEFT_NOTED: set[int] = set()  # the attempts whose first worker to leave is noted


def launcher_end(
    rank: int,
    code: int | None,
    when: float,
    attempt: int,
    error_file: str,
    returned: float | None = None,
    stopped: bool = False,
) -> None:
    """A worker of this node ended; nonzero ends are noted with what its error file says
    (the kit's diagnosis of a failed collective: the ranks it waited for, or stuck). Of the
    workers that left of their own accord (exit 0), only the node's first per attempt: the
    one that may have left its peers waiting, at one record per node, not per rank.
    stopped: its end was torchrun's stop of the attempt (its SIGTERM, or the SIGKILL past
    the shutdown budget), not a failure of its own."""
    if code is None and returned is None:
        return  # torchrun reaped it first: its code is torchrun's to tell
    if code in (0, None):  # its code returned: it left of its own accord
        code = 0
        if attempt in _LEFT_NOTED:
            return
        _LEFT_NOTED.add(attempt)
    facts: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError, AttributeError):
        data = json.loads(Path(error_file).read_text()).get("ddpkit") or {}
        facts = {k: data[k] for k in ("missing", "stuck", "phase", "cause") if k in data}
    if returned is not None:
        facts["returned"] = returned
    if stopped:
        facts["stopped"] = True
    record(
        os.environ.get(RUN_DIR_ENV),
        "end",
        time=when,
        rank=rank,
        code=code,
        attempt=attempt,
        **facts,
    )


def launcher_exit(
    run_dir: str | Path,
    requeue: bool,
    node_rank: int,
    attempt: int | None = None,
    finished: bool = False,
    cancel: str | None = None,
) -> str | None:
    """At the launcher's exit: note the stop of a requeue; node 0 notes a job that finished
    (exit 0: a user's script notes no `done` of its own, and an attached drill waits for one
    of the two), writes the report and returns its one line when a failure was recovered or
    a requeue follows: after restarts the line says what they cost. None elsewhere, without
    records, and for a launch of one attempt: its end is said by the trainer's done line, or
    by the one error line a failure or bad input gets (which must stay the only line: no
    goodput beside it). cancel: the stop signal of a cancel (a plain scancel's SIGTERM, a
    `ddpkit cancel`, Ctrl-C), noted so that the report says "cancelled", not a failure."""
    where = {} if attempt is None else {"attempt": attempt}  # the launcher's own env has none
    if requeue:  # in the attempt the workers last ran in
        record(run_dir, "stop", **where)
    elif cancel:
        record(run_dir, "stop", cancel=cancel, **where)
    if node_rank != 0:
        return None
    if finished:
        record(run_dir, "finished", **where)
    rep = write_report(run_dir)
    if rep is None or (rep.attempts < 2 and not requeue):
        return None
    return f"ddpkit: {rep.line()}"


def note_done(run_dir: str | Path, step: int) -> Report | None:
    """The trainer's rank 0 at the end of its last step: note it, and the report so far."""
    record(run_dir, "done", step=step)
    return report(run_dir)


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

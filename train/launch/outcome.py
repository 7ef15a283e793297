"""What the node launcher makes of its workers' ends: which rank is to blame, and the one exit
status a scheduler sees (the rules in ddpkit.train.launch.node's docstring). The blame rule
itself is ddpkit.train.failure's (`culprit`), shared with the goodput report."""

from __future__ import annotations

import signal
from dataclasses import dataclass

from ddpkit.train import places
from ddpkit.train.contract import (
    EXIT_BAD_INPUT,
    EXIT_DIVERGED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REQUEUE,
)
from ddpkit.train.failure import COLLATERAL, Failure, culprit
from ddpkit.train.failure import how as _how

PREFIX = "ddpkit node"


@dataclass(frozen=True)
class WorkerEnd:
    """How and when one worker ended, seen by the launcher as it happened (train/node.py):
    `code` as torchrun's (-N: signal N; None when torchrun reaped it first), `when` in
    seconds since the epoch, `attempt` torchrun's restart count, `returned` when a user's
    script or module returned normally (run_entry notes it), if it did."""

    rank: int
    code: int | None
    when: float
    attempt: int = 0
    returned: float | None = None


def last_attempt_exits_0(ends: dict[int, WorkerEnd]) -> dict[int, float]:
    """{rank: when it left} of the workers of the last attempt that ended of their own
    accord: their code returned (even if torchrun then stopped them in their exit), or
    they exited 0."""
    last = max((e.attempt for e in ends.values()), default=0)
    return {
        e.rank: e.returned if e.returned is not None else e.when
        for e in ends.values()
        if e.attempt == last and (e.returned is not None or e.code == 0)
    }


def left_early(
    failures: dict[int, Failure], left: dict[int, float], stopped_at: float | None = None
) -> list[int]:
    """The ranks that left of their own accord (exit 0, or their code returned: `left`, rank ->
    when) while the culprit still ran its code: before its failure, or before torchrun began
    stopping the workers (`stopped_at`). A culprit whose own code had returned too (it failed
    in its exit) waited on nobody: its failure is its own. The same on every attempt (a shorter
    data shard, a rank-dependent return): never retried."""
    if not failures:
        return []
    rank, first = culprit(failures)
    return sorted(
        r
        for r, t in left.items()
        if rank not in left
        and first.exact
        and (t < first.when or (stopped_at is not None and t <= stopped_at))
    )


def _ended_first(rank: int, than: Failure, failures: dict[int, Failure]) -> bool:
    """True when `rank` ended before `than`, by the launcher's exact times."""
    f = failures.get(rank)
    return f is not None and f.exact and than.exact and f.when < than.when


def _stalled(failures: dict[int, Failure]) -> str | None:
    """The line for ranks that took another path (their own code called a collective the
    others did not: the workers' diagnosis names them), or for a rank that never reached a
    collective another rank timed out in: the rank that waited fails first, but the one it
    waited for is the cause. None when no rank reported either, or when a missing rank
    failed of its own accord here (its own exit is the better clue: the standard line
    names it)."""
    blamed = sorted((r, f.blame) for r, f in failures.items() if f.blame)
    if blamed:
        return f"{PREFIX}: {places.placed(blamed[0][1])}"
    reports = sorted(
        ((f.when or float("inf"), r, f) for r, f in failures.items() if f.missing),
        key=lambda item: item[:2],
    )
    if not reports:
        return None
    _, reporter, report = reports[0]
    own = [
        r
        for r in report.missing
        if _ended_first(r, report, failures)  # it was gone before the reporter gave up
        or (
            r in failures
            and failures[r].code not in COLLATERAL
            and not (failures[r].missing or failures[r].stuck)  # waiting, or stuck: no own cause
        )
    ]
    if own:
        return None
    return (
        f"{PREFIX}: {places.names(report.missing)} never reached the collective {report.phase} "
        f"(stuck, crashed, or on another code path); {places.name(reporter)} failed waiting "
        "for it: see its line above"
    )


def outcome(
    failures: dict[int, Failure],
    marker_fresh: bool,
    finished: bool = False,
    left: dict[int, float] | None = None,
    stopped_at: float | None = None,
) -> tuple[int, str | None]:
    """One exit status (and at most one line to print) from the workers' ends. `finished`:
    the kit trainer's summary.json of THIS launch exists (the run completed). `left`: {rank:
    when} of the workers that ended with exit 0; one that did so before the failure, or
    before torchrun began stopping the workers (`stopped_at`), left while the others ran."""
    codes = [f.code for f in failures.values()]
    if EXIT_BAD_INPUT in codes:
        return EXIT_BAD_INPUT, None  # the worker already printed its one line
    if EXIT_DIVERGED in codes:
        return EXIT_DIVERGED, None
    if marker_fresh:
        return EXIT_REQUEUE, f"{PREFIX}: a checkpoint was saved on a stop signal; exit 75 (requeue)"
    if not codes:
        return EXIT_OK, None
    rank, failure = culprit(failures)
    how = _how(failure.code)
    stalled = _stalled(failures)
    if finished and all(c in (-signal.SIGABRT, *COLLATERAL) for c in codes):
        # The one forgiven case: the run wrote its summary (every step, the last checkpoint
        # and the metrics are on disk), then a worker aborted in interpreter teardown. The
        # known cause, gloo's exit race, is prevented by train/teardown.py; this stays for
        # a wait that ran out or another library's C++ `terminate` at exit. Reporting it
        # would make SLURM mark a finished job FAILED and a PyTorchJob restart it. A crash
        # before the summary, or any exit code, is still a failure.
        return EXIT_OK, (
            f"{PREFIX}: {places.name(rank)} ended by {how} after the run finished (summary.json of "
            "this launch is written); exit 0"
        )
    # Said before a diagnosis of a collective that rank never reached: it is why.
    early = left_early(failures, left or {}, stopped_at)
    if stalled and not early:
        return EXIT_FAILED, stalled
    if early:  # a rank that stops calling collectives leaves its peers failing in them
        return EXIT_FAILED, (
            f"{PREFIX}: {places.names(early)} left first (exit 0) while the others still ran; "
            f"{places.name(rank)} then failed ({how}): a rank that stops early (a shorter data shard, a "
            "rank-dependent return) leaves its peers' collectives waiting; see the output above"
        )
    return EXIT_FAILED, f"{PREFIX}: {places.name(rank)} failed ({how}); see its output above"

"""The failure vocabulary: every kind of failure the kit names, and its rules, in one place.

Whoever sees a failure classifies it here, and every reader takes the class from here: the
node launcher's exit status and one line (ddpkit.train.launch.outcome), the decision to
restart or give up (ddpkit.train.launch.verdicts), the goodput report (ddpkit.train.goodput),
the drills that cause each kind on purpose (`ddpkit chaos --inject`, the test injector
DDPKIT_FAULT of ddpkit.train.drills) and the docs (docs/failures.md's table). A new kind is
one entry in KINDS (its name, whether a restart may cure it, whether it counts against the
node, the drills that cause it) and, where it is recognised, one rule below.

Three parts:
  - the kinds (KINDS, `kind_of`): what the report and the status lines call a failure;
  - the code-or-machine rule (`cause_of`, `is_code_failure`): a worker whose own code failed
    fails the same way on every attempt, so it is never retried; anything else may be cured
    by a restart from the newest checkpoint;
  - the worker -> launcher error file (`tell_launcher`, `note_cause`, `Failure.of`): the
    worker's own diagnosis, where torchrun's agent reads it (TORCHELASTIC_ERROR_FILE), as
    {"message": ..., "timestamp": ..., "ddpkit": {facts}}; and the blame rule (`culprit`):
    which rank of those that failed is the cause.

torch-free: the node launcher, the SLURM batch shell and `ddpkit status` import it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddpkit.train.contract import EXIT_BAD_INPUT, EXIT_DIVERGED

# --- the kinds ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """One kind of failure as every report names it."""

    name: str  # as the report, `ddpkit status` and the drill's table say it
    retried: bool  # a restart from the newest checkpoint may cure it
    node_fault: bool  # counts toward leaving its node out of the next attempt
    drills: tuple[str, ...] = ()  # the `ddpkit chaos --inject` kinds that cause it
    injected: tuple[str, ...] = ()  # the test injector's kinds (DDPKIT_FAULT) that cause it
    what: str = ""  # one line for docs and --help


KILLED = Kind(
    "killed", True, True, ("kill-rank",), ("kill", "killupload"),
    "a worker died by SIGKILL (the OOM killer, a drill, a crashed process)",
)  # fmt: skip
CRASHED = Kind(
    "crashed", True, True, (), (),
    "a worker exited non-zero for a reason not its code's (a failed collective, a segfault)",
)  # fmt: skip
SIGNALLED = Kind(
    "signal", True, True, (), ("signal",), "a worker died by a signal other than SIGKILL",
)  # fmt: skip
HANG = Kind(
    "hang", True, True, ("stop-rank",), ("hang", "hangsave", "hangload", "hanglog"),
    "a rank stopped taking part (stuck, stopped); its peers timed out waiting for it",
)  # fmt: skip
CODE_ERROR = Kind(
    "code error", False, False, (), ("usererror", "nan"),
    "the job's own code or numbers failed (an exception, bad input, a diverged loss): the same "
    "on every attempt, never retried",
)  # fmt: skip
NODE_LOST = Kind(
    "node lost", True, True, ("kill-node",), (),
    "a node went with its launcher: nobody on it lived to say what happened",
)  # fmt: skip
LEFT_EARLY = Kind(
    "left early", False, False, (), (),
    "a rank exited 0 while its peers still trained, leaving their collectives waiting: the "
    "same on every attempt (a shorter data shard, a rank-dependent return), never retried",
)  # fmt: skip
PREEMPTED = Kind(
    "preempted", True, False, ("preempt",), (),
    "the scheduler asked the job to stop (SLURM's --signal, a pod deletion): saved, requeued",
)  # fmt: skip
STORE_LOST = Kind(
    "store lost", True, False, (), (),
    "the checkpoint store (an object store) stopped answering mid-run: the workers restart "
    "from the last complete checkpoint once it answers again (ddpkit.train.ckpt.store)",
)  # fmt: skip

KINDS: dict[str, Kind] = {
    k.name: k
    for k in (KILLED, CRASHED, SIGNALLED, HANG, CODE_ERROR, NODE_LOST, LEFT_EARLY, PREEMPTED,
              STORE_LOST)
}  # fmt: skip


def kind(name: str) -> Kind:
    """The kind a report names (`signal SIGSEGV` is SIGNALLED); an unknown name (a drill's own)
    is a retried failure of no node."""
    if name in KINDS:
        return KINDS[name]
    if name.startswith("signal"):
        return SIGNALLED
    return Kind(name, True, False)


def drill_kinds() -> tuple[str, ...]:
    """The `ddpkit chaos --inject` kinds, in the table's order."""
    return tuple(d for k in KINDS.values() for d in k.drills)


def injected_kinds() -> tuple[str, ...]:
    """The test injector's kinds (DDPKIT_FAULT)."""
    return tuple(i for k in KINDS.values() for i in k.injected)


def drilled(drill: str) -> Kind:
    """The kind a `ddpkit chaos --inject` kind causes."""
    return next(k for k in KINDS.values() if drill in k.drills)


def counts_against_node(name: str) -> bool:
    """A failure of this kind is its node's (two of them leave the node out): not a
    preemption, not a rank that left early, not the user's code."""
    return kind(name).node_fault


# The rules that recognise a kind in one worker's end: its exit status (-N: signal N) and what
# its error file said (`missing` ranks it waited for, `stuck` after a stop signal, its
# `cause`, its `error` line). The first that holds names the end; none: crashed. Kinds seen
# otherwise (a node lost, a rank that left early, a preemption) come from the goodput
# records, not one end.
Rule = Callable[[int, dict[str, Any]], bool]
RULES: dict[str, Rule] = {
    HANG.name: lambda code, facts: bool(facts.get("missing") or facts.get("stuck")),
    # before the code rule: a restart that waited for the store in vain exits 2
    STORE_LOST.name: lambda code, facts: facts.get("cause") == STORE,
    CODE_ERROR.name: lambda code, facts: is_code_failure(code, str(facts.get("cause") or "")),
    KILLED.name: lambda code, facts: code == -signal.SIGKILL,
    SIGNALLED.name: lambda code, facts: code < 0,
}


def register(new: Kind, rule: Rule | None = None, before: str | None = None) -> None:
    """A new kind (a plugin's, a test's): its entry in KINDS and, when one end can show it,
    its rule, checked before the rule of kind `before` (default: after every other)."""
    KINDS[new.name] = new
    if rule is None:
        return
    items = [(n, r) for n, r in RULES.items() if n != new.name]
    at = next((i for i, (n, _) in enumerate(items) if n == before), len(items))
    items.insert(at, (new.name, rule))
    RULES.clear()
    RULES.update(items)


def kind_of(code: int, facts: dict[str, Any]) -> str:
    """The kind of one worker's end (RULES, first match); none holds: crashed."""
    for name, rule in RULES.items():
        if rule(code, facts):
            if name == SIGNALLED.name and -code in signal.valid_signals():
                return f"signal {signal.Signals(-code).name}"
            return name
    return CRASHED.name


# --- the code-or-machine rule -------------------------------------------------------------------

CODE = "code"
INFRA = "infra"
STORE = "store"  # the checkpoint store stopped answering (ckpt.store.StoreLost): retried
# Text of an exception that comes from the machine or the network, not the user's code:
# collective and transport errors (a peer died), CUDA/ECC faults, timeouts.
_INFRA_WORDS = (
    "timed out", "timeout", "gloo", "nccl", "connection", "peer", "broken pipe",
    "cuda error", "ecc", "cudnn_status_execution_failed", "rendezvous", "tcpstore", "store",
)  # fmt: skip
_INFRA_TYPES = (
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "ConnectionError",
    "TimeoutError",
)


def cause_of(e: BaseException) -> str:
    """CODE for an exception of the user's code, INFRA for one a restart may cure. A nonzero
    SystemExit is the code's own decision (`sys.exit(1)`), the same on every attempt."""
    if isinstance(e, SystemExit):
        return CODE
    names = {t.__name__ for t in type(e).__mro__}
    if "StoreLost" in names:  # by name: the vocabulary imports no checkpoint code
        return STORE
    text = f"{type(e).__name__} {e}".lower()
    if names & set(_INFRA_TYPES) or any(w in text for w in _INFRA_WORDS):
        return INFRA
    return CODE


def is_code_failure(code: int, cause: str) -> bool:
    """A worker end no restart can fix: its own code raised, bad input, or a diverged loss."""
    return code in (EXIT_BAD_INPUT, EXIT_DIVERGED) or (code > 0 and cause == CODE)


# --- the worker -> launcher error file ----------------------------------------------------------

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def tell_launcher(message: str, **facts: object) -> None:
    """Leave this worker's diagnosis where torchrun's agent reads it (its error file): the
    node launcher then blames the rank that never reached a collective, not the one that
    timed out waiting for it. The first diagnosis is kept. Best effort; a no-op elsewhere."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path or os.path.exists(path):
        return
    body = {"message": message, "timestamp": int(time.time()), "ddpkit": facts}
    try:
        with open(path, "w") as f:
            json.dump(body, f)
    except OSError:
        pass


def note_cause(e: BaseException) -> None:
    """Leave the cause of this worker's exception where the launcher reads it (best effort;
    a diagnosis written already, e.g. a failed collective's, is kept)."""
    if isinstance(e, SystemExit):
        error = f"sys.exit({e.code!r})"
    else:
        error = f"{type(e).__name__}: {e}".splitlines()[0][:300] if str(e) else type(e).__name__
    tell_launcher(error, cause=cause_of(e), error=error)


def read_facts(data: Any) -> dict[str, Any]:
    """The kit's facts from an error file's parsed body (torchrun's `error_file_data`, or the
    file read by hand); {} for anything else."""
    facts = data.get("ddpkit") if isinstance(data, dict) else None
    return facts if isinstance(facts, dict) else {}


def read_error_file(path: str) -> dict[str, Any]:
    """The kit's facts in the error file at `path`; {} when there are none."""
    try:
        with open(path) as f:
            return read_facts(json.load(f))
    except (OSError, ValueError):
        return {}


# --- one worker's failure, and which rank is to blame --------------------------------------------

# A rank the agent stopped because another one failed dies by SIGTERM (SIGKILL after the
# shutdown budget): it is collateral, never the cause, when another rank failed otherwise.
COLLATERAL = (-signal.SIGTERM, -signal.SIGKILL)


@dataclass(frozen=True)
class Failure:
    """One worker's failure: its exit code (-N: killed by signal N) and when it ended
    (seconds since the epoch; 0 when unknown), with what the worker's error file said:
    `missing` and `phase` (the ranks that never reached a collective, and which collective),
    `stuck` (its step never finished after a stop signal), `blame` (the ranks whose own code
    called a collective the others did not), `cause` and `error` (its exception)."""

    code: int
    when: float = 0.0
    missing: tuple[int, ...] = ()
    phase: str = ""
    stuck: bool = False
    blame: str = ""
    exact: bool = False  # `when` is the moment it ended (the launcher's), not torchrun's poll
    cause: str = ""  # CODE, INFRA, or "" unknown
    error: str = ""

    @classmethod
    def of(cls, f: Any, when: float | None = None) -> Failure:
        """From torchrun's ProcessFailure, timed by the launcher (`when`) when it saw the end."""
        facts = read_facts(getattr(f, "error_file_data", None))
        return cls.from_facts(
            int(f.exitcode),
            when if when is not None else float(getattr(f, "timestamp", 0) or 0),
            facts,
            exact=when is not None,
        )

    @classmethod
    def from_facts(cls, code: int, when: float, facts: dict[str, Any], exact: bool) -> Failure:
        missing = facts.get("missing")
        ok = isinstance(missing, list) and all(isinstance(r, int) for r in missing)
        return cls(
            code,
            when,
            tuple(missing) if ok else (),
            str(facts.get("phase") or ""),
            facts.get("stuck") is True,
            str(facts.get("blame") or ""),
            exact=exact,
            cause=str(facts.get("cause") or ""),
            error=str(facts.get("error") or ""),
        )

    @property
    def kind(self) -> str:
        facts = {"missing": self.missing, "stuck": self.stuck, "cause": self.cause}
        return kind_of(self.code, {**facts, "error": self.error} if self.error else facts)


def culprit(failures: dict[int, Failure]) -> tuple[int, Failure]:
    """The rank to blame: the first to fail for a reason of its own, not one the agent
    stopped afterwards (torchrun SIGTERMs the rest as soon as one rank fails; a rank whose
    step did not finish after that signal leaves through the trainer's watchdog: stuck).

    When every end was timed as it happened (exact), the first to end is the one: whatever
    stopped the others came after it, so a rank SIGKILLed by the OOM killer is named even
    though its peers failed too (a closed connection, torchrun's SIGTERM). Without exact
    times (whole seconds, read when the agent polls), SIGTERM and SIGKILL count as the
    agent's doing and the others are preferred."""
    if all(f.exact for f in failures.values()):
        own = {r: f for r, f in failures.items() if not f.stuck} or failures
    else:
        own = {
            r: f for r, f in failures.items() if f.code not in COLLATERAL and not f.stuck
        } or failures
    return min(own.items(), key=lambda item: (item[1].when or float("inf"), item[0]))


def waited_for(failures: dict[int, Failure]) -> int | None:
    """The rank the first failure waited for: a rank that timed out in a collective names the
    ranks that never reached it (its `missing`); the first of those is the cause, not the rank
    that noticed. None when the first failure waited for nobody."""
    if not failures:
        return None
    _, first = culprit(failures)
    return first.missing[0] if first.missing else None


def signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def how(code: int) -> str:
    """`exit code 1` or `signal SIGKILL`."""
    return f"exit code {code}" if code >= 0 else f"signal {signame(-code)}"

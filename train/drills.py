"""The test injector and step pacing: failures caused on purpose inside the kit's own workers
(tests and drills only; `ddpkit chaos` causes them from outside, in any entry point).

    DDPKIT_FAULT=kind@step[:rank[:arg]]      one failure, in the first attempt only
    DDPKIT_STEP_PACE_S=S                     every step lasts at least S seconds, asleep
    DDPKIT_STEP_PACE_UNTIL=PATH              ... until PATH exists (relative: to the worker's cwd)

The kinds, and the failure each one causes, are listed in ddpkit.train.failure (KINDS).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

import torch.distributed as dist
from ddpkit.train import failure, goodput


@dataclass(frozen=True)
class Fault:
    """DDPKIT_FAULT=kind@step[:rank[:arg]]: kill (SIGKILL itself), hang (sleep arg seconds),
    signal (send SIGNAME to the torchrun agent, or to itself without torchrun), nan (that
    rank's loss becomes NaN for that step: its gradients, all-reduced, poison every rank),
    usererror (a ConfigError on that rank only), killupload (SIGKILL itself in the upload of
    step N's checkpoint to an object store, its data files up, the marker not), hangsave
    (sleep arg seconds in its write of step N's checkpoint, its files written, before DCP
    gathers the ranks' results: its peers wait in the save's collective), hangload (the same
    in its read of step N's checkpoint on resume), hanglog (sleep arg seconds at step N's
    logging, its gradients all-reduced: its peers wait in the loss all-reduce, a collective
    of the loop that is not the step's). `step` "end": after the last step, before
    the end-of-run collectives (the stop check, final save, evaluation, summary, barrier).
    Fires once per job: only in the first torchrun attempt (goodput.attempt_number() 0: the
    rendezvous round, as torchrun's restart count stays 0 on a node restarted for another's
    failure)."""

    kind: str
    step: int
    rank: int
    arg: str

    END = -1  # the step number of the "end" point

    @staticmethod
    def from_env() -> Fault | None:
        spec = os.environ.get("DDPKIT_FAULT", "")
        if not spec or goodput.attempt_number() != 0:
            return None
        kind, _, rest = spec.partition("@")
        if kind not in failure.injected_kinds():
            print(
                f"warning: DDPKIT_FAULT={spec!r}: no such kind (one of "
                f"{', '.join(failure.injected_kinds())}); nothing injected",
                file=sys.stderr,
            )
            return None
        parts = rest.split(":")
        return Fault(
            kind,
            Fault.END if parts[0] == "end" else int(parts[0]),
            int(parts[1]) if len(parts) > 1 else 0,
            parts[2] if len(parts) > 2 else "",
        )

    def poisons(self, step: int, rank: int) -> bool:
        return self.kind == "nan" and step == self.step and rank == self.rank

    def maybe_fire(self, step: int, rank: int) -> None:
        if step != self.step or rank != self.rank or self.kind == "nan":
            return
        where = "the end of the run" if step == Fault.END else f"step {step}"
        print(
            f"[fault injection] {self.kind} on rank {rank} at {where}",
            file=sys.stderr,
            flush=True,
        )
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "hang":
            time.sleep(float(self.arg or 3600))
        elif self.kind == "usererror":  # a user error that only this rank sees
            from ddpkit.train.config import ConfigError

            raise ConfigError(f"injected user error on rank {rank} at step {step}")
        elif self.kind == "signal":
            target = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else os.getpid()
            os.kill(target, getattr(signal, self.arg or "SIGTERM"))

    def at_logging(self, step: int, rank: int) -> None:
        """The hanglog fault's point: step `step`'s logging, before its collectives."""
        if self.kind == "hanglog" and (step, rank) == (self.step, self.rank):
            print(f"[fault injection] hanglog on rank {rank} at step {step}", file=sys.stderr,
                  flush=True)  # fmt: skip
            time.sleep(float(self.arg or 3600))


def step_pace_s() -> float:
    """DDPKIT_STEP_PACE_S (tests and drills only): every training step lasts at least this many
    seconds, the rest of it asleep; 0 (unset) for none. A fault drill needs the job to be still
    training while a group or rank restarts; paced, a run lasts a minute in a few hundred steps
    that leave the cores idle, instead of thousands of tiny CPU-bound ones (as real steps on
    a GPU are few and long)."""
    raw = os.environ.get("DDPKIT_STEP_PACE_S", "")
    try:
        return max(0.0, float(raw)) if raw else 0.0
    except ValueError:
        return 0.0


def pace(started: float, pace_s: float) -> None:
    """Sleep out the rest of a step that began at `started` (time.perf_counter) and must last
    `pace_s` (step_pace_s); not once the file DDPKIT_STEP_PACE_UNTIL names exists. A drill's
    window (a survivor still training while a killed group comes back) must be long enough for
    the slowest restart it may meet, but need not last once what it waits for happened: the
    drill writes that file (its run dir is seen by every engine's workers), and the steps left
    run at their own speed."""
    until = os.environ.get("DDPKIT_STEP_PACE_UNTIL")
    if until and os.path.exists(until):
        return
    left = pace_s - (time.perf_counter() - started)
    if left > 0:
        time.sleep(left)


def kill_in_upload(step: int, rank: int) -> None:
    """The killupload fault's point: an upload cut off half way (see Fault)."""
    fault = Fault.from_env()
    if (
        fault is not None
        and fault.kind == "killupload"
        and (fault.step, fault.rank) == (step, rank)
    ):
        print(
            f"[fault injection] killupload on rank {rank} at step {step}",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGKILL)


def hang_in(kind: str, step_dir: str) -> None:
    """The hangsave and hangload faults' points: a rank stalled inside a checkpoint's save
    or load of `step_dir` (see Fault)."""
    fault = Fault.from_env()
    if fault is None or fault.kind != kind:
        return
    from ddpkit.train.ckpt.store import step_number

    step = step_number(os.path.basename(os.path.normpath(step_dir))) or -1
    rank = dist.get_rank() if dist.is_initialized() else 0
    if (fault.step, fault.rank) == (step, rank):
        print(
            f"[fault injection] {kind} on rank {rank} at step {step}",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(float(fault.arg or 3600))

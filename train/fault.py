"""Fault tolerance: preemption signals, hang diagnosis, and the test-only fault injector."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from ddpkit.train import contract, goodput, places

# SIGTERM: SLURM preemption and time limits, Kubernetes pod deletion, docker stop, torchrun's
# shutdown. SIGUSR1/SIGUSR2: what sites configure with `#SBATCH --signal` (submitit uses USR2).
# SIGINT: Ctrl-C (torchrun forwards it): saved too, but a stop, not a requeue.
STOP_SIGNALS = tuple(getattr(signal, name) for name in contract.STOP_SIGNALS)


class StopRequest:
    """Records a stop signal; ranks agree on it at a step boundary through a collective."""

    def __init__(self, boundary_timeout_s: float) -> None:
        self.signum = 0
        self.received_at = 0.0
        self.acknowledged = threading.Event()
        self.boundary_timeout_s = boundary_timeout_s
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._work: dist.Work | None = None
        for s in STOP_SIGNALS:
            signal.signal(s, self._handle)
        from ddpkit.train import startup_signals

        got = startup_signals.received()  # a signal during start-up, recorded there
        if got is not None and not self.signum:
            self._handle(got[0], None)
            self.received_at = got[1]

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum:  # the first one counts; torchrun may forward a second
            return
        self.signum, self.received_at = signum, time.time()
        # A rank stuck in a step (a hang, a dead peer) never reaches the boundary where the
        # save happens; rather than make the launcher wait for its SIGKILL, leave promptly.
        threading.Thread(target=self._watchdog, daemon=True).start()

    def _watchdog(self) -> None:
        if not self.acknowledged.wait(self.boundary_timeout_s):
            name = signal.Signals(self.signum).name
            print(
                f"error: {name} received but the current step did not finish within "
                f"{self.boundary_timeout_s:g} s (stuck in a collective?); exiting without a "
                "checkpoint",
                file=sys.stderr,
                flush=True,
            )
            tell_launcher(f"stuck when {name} came", stuck=True)
            os._exit(1)

    def agreed(self, group: dist.ProcessGroup | None = None) -> int:
        """The signal number if any rank had one at the previous step boundary, else 0.

        Collective, pipelined by one step: each boundary waits for the MAX all-reduce of the
        flags started at the boundary before, then starts the next one, so the reduction runs
        while the step computes instead of stalling it (measured: a blocking one-int
        all-reduce cost ~0.8 ms of a 6.5 ms CPU step). Every rank sees the same value at the
        same boundary, so all leave the loop after the same step and the checkpoint they
        write together is consistent. It runs on a CPU (gloo) group: no GPU synchronisation.
        """
        got = 0
        if self._work is not None:
            self._work.wait()
            got = int(self._flag.item())
        self._flag.fill_(self.signum)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=group, async_op=True)
        if got:
            if not self.signum:  # another rank got it: time the save from now
                self.signum, self.received_at = got, time.time()
            self.acknowledged.set()
        return got

    def agree_now(self, group: dist.ProcessGroup | None = None) -> int:
        """Blocking: the signal number if any rank has one now, else 0 (collective). For the
        edges of the loop: before the first step (a signal during start-up) and after the
        last (a signal in the final steps that the pipelined check has not delivered)."""
        self.drain()
        flag = torch.tensor([self.signum], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        got = int(flag.item())
        if got:
            if not self.signum:
                self.signum, self.received_at = got, time.time()
            self.acknowledged.set()
        return got

    def drain(self) -> None:
        """Wait for the all-reduce in flight (before the group's next use or teardown)."""
        if self._work is not None:
            self._work.wait()
            self._work = None


# --- hang diagnosis ---------------------------------------------------------------------------


def _store() -> dist.Store | None:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def diagnose_collective_failure(
    phase: str, step: int, timeout_s: float, err: BaseException, when: str | None = None
) -> str:
    """Build the message for a collective that failed or timed out (`when`: where in the run,
    default "at step <step>"; `step` also keys the ranks' reports, the same on every rank).

    Each rank that sees the failure records itself in the rendezvous store; after a short
    grace period the ranks that never reported are the ones that stopped participating.
    Each also records where it was: a collective the user's own code called directly
    (`if rank == 0: dist.barrier()` in a forward) names the ranks that took another path.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    reported, sites, gone = _exchange(f"ddpkit/failed/{step}", phase, err, min(5.0, timeout_s))
    missing = [r for r in range(world) if r not in reported] if reported else []
    blame = _other_path(sites, phase, when or f"at step {step}")
    first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    msg = (
        f"collective {phase} {when or f'at step {step}'} failed on rank {rank} of {world} "
        f"(--timeout-s {timeout_s:g}): {first}."
    )
    if missing:
        msg += (
            f" Ranks {missing} never reached it (stuck, crashed, or on a different code path);"
            f" ranks {reported} did."
        )
        store = _store()
        where = places.published(store, missing) if store is not None else ""
        if where:
            msg += f" Where they ran: {where}."
        if ended := _ended(gone, missing):
            msg += f" {ended}."
    if blame:
        msg += f" The ranks took different paths: {blame}."
    msg += (
        " Check those ranks' logs; rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL"
        " (and NCCL_DEBUG=INFO on GPUs) to see every rank's collective sequence."
    )
    tell_launcher(msg, phase=f"{phase} {when or f'at step {step}'}", missing=missing, blame=blame)
    return msg


AFTER_END_S = 1.0  # the wait for the reports once a silent rank is known to have ended


def _exchange(
    key: str, phase: str, err: BaseException, grace_s: float
) -> tuple[list[int], dict[int, str], dict[int, dict[str, Any]]]:
    """(ranks that reported this failure within grace_s, {rank: its user_call_site}, {rank:
    its end} for the others whose process ended): each rank that sees the failure records
    itself under `key` in the rendezvous store, and the node launchers record each worker that
    ended with a failure (publish_end); the wait is over once every rank has done one or the
    other, so a killed rank costs its peers no grace (it was 5 s on every kill). Once a rank
    that has not reported is known to have ended, the wait is AFTER_END_S at most: the dead
    rank explains the failure, and a rank still silent then is most likely blocked on it in
    its own collective until its timeout (a ring all-reduce's ranks that were not the dead
    one's neighbours: 4 ranks on 2 nodes, one killed, cost the others the whole 5 s).
    ([], {}, {}) without a store."""
    rank, world = dist.get_rank(), dist.get_world_size()
    store = _store()
    reported: list[int] = []
    sites: dict[int, str] = {}
    gone: dict[int, dict[str, Any]] = {}
    if store is None:
        return reported, sites, gone
    ends = None
    with contextlib.suppress(Exception):
        ends = attempt_store(os.environ, timeout_s=2.0)
    try:
        store.set(f"{key}/{rank}", json.dumps({"phase": phase, "site": user_call_site(err)}))
        deadline = time.time() + grace_s
        while time.time() < deadline:
            reported = [r for r in range(world) if store.check([f"{key}/{r}"])]
            if len(reported) == world:
                break
            if ends is not None:
                gone = _ends(ends, [r for r in range(world) if r not in reported])
                if len(reported) + len(gone) == world:
                    break
                if gone:
                    deadline = min(deadline, time.time() + AFTER_END_S)
                    ends = None  # known: stop asking, wait out the rest for the reports
            time.sleep(0.2)
        for r in reported:
            with contextlib.suppress(ValueError, AttributeError):
                sites[r] = str(json.loads(store.get(f"{key}/{r}")).get("site") or "")
    except Exception:
        return [], {}, {}
    return reported, sites, {r: e for r, e in gone.items() if r not in reported}


# --- the workers' ends, told to their peers ---------------------------------------------------
#
# A peer waiting for the ranks' reports of a failed collective cannot tell a rank that is
# slow to report from one that is dead; its node launcher can (it waits on the process). So
# each launcher writes every worker that ends with a failure into the attempt's store, and
# the waiting ranks stop waiting for it.

_END_KEY = "ddpkit/ended/"  # + rank: {"code": exit status, -signal}; + "count": how many


def attempt_store(env: Mapping[str, str], timeout_s: float, world_size: int | None = None):
    """The store an attempt's workers share: the torchrun agent's (TORCHELASTIC_USE_AGENT_STORE),
    under a key prefix per attempt (goodput.attempt_number: the rendezvous round). torchrun
    (2.14, c10d rendezvous) hands every attempt the same store without a prefix, so a worker
    could read the previous attempt's gloo addresses ("connectFullMesh ... Connection
    refused"). None outside that case. A new client connection, from a worker's or its node
    launcher's environment."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
    )
    return dist.PrefixStore(attempt_prefix(env), store)


def attempt_prefix(env: Mapping[str, str]) -> str:
    """The key prefix of the attempt's store (the rendezvous round: the same on every node)."""
    return f"ddpkit/attempt_{goodput.attempt_number(env)}"


def scope_rendezvous_to_attempt(env: Mapping[str, str] = os.environ) -> None:
    """A user's script (ddpkit.train.node.run_entry): `init_process_group` through env:// or
    tcp:// (its own store, no key prefix) gets the store under the attempt's prefix, as the
    kit's trainer passes it (attempt_store). Without it a restarted attempt's gloo read the
    addresses its peers had published in the attempt before: `connectFullMesh failed ...
    Connection refused`, or both ranks waited in connectFullMesh until the group's timeout
    (a drill: a user's script, one rank SIGKILLed, hung in 2 of 4 runs). Every rank of an
    attempt has the same round, so they meet under one prefix. A script that makes its own
    TCPStore is not changed."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    import importlib

    rdzv = importlib.import_module("torch.distributed.rendezvous")  # the module, not its function

    for scheme in ("env", "tcp"):
        plain = rdzv._rendezvous_handlers.get(scheme)
        if plain is None or getattr(plain, "_ddpkit", False):
            continue

        def scoped(url: str, _plain: Any = plain, **kwargs: Any) -> Any:
            for store, rank, world_size in _plain(url, **kwargs):
                yield dist.PrefixStore(attempt_prefix(env), store), rank, world_size

        scoped._ddpkit = True  # type: ignore[attr-defined]
        rdzv._rendezvous_handlers[scheme] = scoped


def publish_end(env: Mapping[str, str], rank: int, code: int) -> None:
    """The node launcher: worker `rank` (started with `env`) ended with `code` (nonzero).
    Best effort: a store that is gone (its host was the node lost) says nothing."""
    with contextlib.suppress(Exception):
        store = attempt_store(env, timeout_s=2.0)
        if store is not None:
            store.set(f"{_END_KEY}{rank}", json.dumps({"code": code}))
            store.add(f"{_END_KEY}count", 1)


def _ends(store: Any, ranks: list[int]) -> dict[int, dict[str, Any]]:
    """{rank: its end} for those of `ranks` whose launcher published one (one round trip when
    none did)."""
    if not ranks or store.add(f"{_END_KEY}count", 0) == 0:
        return {}
    out: dict[int, dict[str, Any]] = {}
    for r in ranks:
        if store.check([f"{_END_KEY}{r}"]):
            with contextlib.suppress(ValueError, AttributeError):
                out[r] = json.loads(store.get(f"{_END_KEY}{r}"))
    return out


def _ended(gone: dict[int, dict[str, Any]], missing: list[int]) -> str:
    """`Rank 1 had ended (signal SIGKILL)` for the missing ranks whose process ended."""
    said = []
    for r in missing:
        code = gone.get(r, {}).get("code")
        if isinstance(code, int) and code != 0:
            how = _signame(-code) if code < 0 else f"exit code {code}"
            said.append(f"rank {r} had ended ({how})")
    text = "; ".join(said)
    return text[:1].upper() + text[1:]


def _signame(num: int) -> str:
    try:
        return f"signal {signal.Signals(num).name}"
    except ValueError:
        return f"signal {num}"


def diagnose_script_failure(err: BaseException) -> None:
    """A user's script or module whose collective failed (run_entry): the trainer's exchange,
    so the launcher names the rank that never reached the collective (hung in its own code,
    gone) or the ranks whose code called different ones (`if rank == 0: dist.barrier()`),
    not the first rank to notice. Only the error file is written: the script's traceback,
    as Python prints it, says the rest."""
    frames = traceback.extract_tb(err.__traceback__)
    calls = [f.name for f in frames if f.filename.endswith(_C10D)]
    if not calls or not dist.is_initialized():
        return  # not a collective's failure: the rank's own exception
    rank, world = dist.get_rank(), dist.get_world_size()
    site = user_call_site(err)
    phase = site or f"{calls[-1]}()"
    key = f"ddpkit/failed/script-{goodput.attempt_number()}"
    reported, sites, _ = _exchange(key, phase, err, 5.0)
    missing = [r for r in range(world) if r not in reported] if reported else []
    odd = {r: s for r, s in sites.items() if s}
    blame = ""
    if len(set(odd.values())) > 1 and len(odd) == len(sites):  # every rank, not one place
        where = "; ".join(f"rank {r} called {s}" for r, s in sorted(odd.items()))
        blame = f"the ranks called different collectives: {where}; every rank must call the same collectives in the same order"
    elif odd and len(set(sites.values())) > 1:
        blame = _other_path(sites, "collective", "")
    first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    error = f"{type(err).__name__}: {first}"
    tell_launcher(
        f"collective {phase} failed on rank {rank} of {world}: {first}",
        phase=phase, missing=missing, blame=blame, error=error,
    )  # fmt: skip


_KIT_DIR = os.path.dirname(os.path.abspath(__file__))
_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")


def user_call_site(err: BaseException) -> str:
    """`barrier() at model.py:12 (in forward)` when the collective that failed was called
    by the user's own code directly, not by the trainer, DDP or FSDP; "" otherwise."""
    frames = traceback.extract_tb(err.__traceback__)
    for i in range(len(frames) - 1, -1, -1):
        if not frames[i].filename.endswith(_C10D):
            continue
        for caller in reversed(frames[:i]):
            path = os.path.abspath(caller.filename)
            if f"{os.sep}torch{os.sep}" in path:
                continue  # torch's own wrappers (c10d_logger)
            if path.startswith(_KIT_DIR):
                return ""
            return (
                f"{frames[i].name}() at {os.path.basename(path)}:{caller.lineno} (in {caller.name})"
            )
        return ""
    return ""


def _other_path(sites: dict[int, str], phase: str, when: str) -> str:
    """One sentence naming the ranks whose own code called a collective the others did not,
    from every rank's report; "" when all were in the same place."""
    odd = {r: s for r, s in sites.items() if s}
    if not odd or len(set(sites.values())) == 1:
        return ""
    rest = sorted(r for r in sites if r not in odd)
    where = "; ".join(f"rank {r} called {s}" for r, s in sorted(odd.items()))
    if rest:
        ranks = f"rank {rest[0]} was" if len(rest) == 1 else f"ranks {rest} were"
        where += f", while {ranks} in the {phase} {when}"
    return where + (
        ": every rank must call the same collectives in the same order (docs/troubleshooting.md)"
    )


def tell_launcher(message: str, **facts: object) -> None:
    """Leave this worker's diagnosis where torchrun's agent reads it (its error file,
    TORCHELASTIC_ERROR_FILE): the node launcher then blames the rank that never reached a
    collective, not the one that timed out waiting for it. Best effort; a no-op elsewhere."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    body = {"message": message, "timestamp": int(time.time()), "ddpkit": facts}
    try:
        with open(path, "w") as f:
            json.dump(body, f)
    except OSError:
        pass


# --- fault injection (tests and drills only) --------------------------------------------------


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
    `pace_s` (step_pace_s)."""
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


def stop_check_every(target_s: float, step_time_s: float) -> int:
    """Steps between stop-signal agreements: about every `target_s` seconds (at most 100
    steps). From the step time averaged over ranks, so every rank gets the same number."""
    if target_s <= 0 or step_time_s <= 0:
        return 1
    # The check is pipelined: a signal waits up to one interval to be sent and one more to
    # be read, so agreeing every target/2 keeps signal-to-action within the target.
    return max(1, min(100, int(target_s / 2 / step_time_s)))


def is_collective_error(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return isinstance(e, dist.DistError) or any(
        k in text for k in ("timed out", "timeout", "gloo", "nccl", "connection", "peer")
    )


# --- divergence -------------------------------------------------------------------------------


class Diverged(Exception):
    """A non-finite loss or gradient norm: the run stops (EXIT_DIVERGED) and saves nothing."""

    def __init__(self, step: int, skipped: int = 0) -> None:
        super().__init__(step)
        self.step, self.skipped = step, skipped


_NO_BAD_STEP = 2**62


class Health:
    """Non-finite loss / gradient norm detection without a host sync per step.

    A step hands over its loss (plus its gradient norm when it computed one: the sum is
    non-finite when either is), and the tensor is only kept: no kernel, no sync. Every
    WINDOW steps the kept values are folded into a device tensor holding the first bad step
    (a few kernels for the whole window). The logging step's all-reduce carries `flags()`:
    non-finite or non-zero where some rank saw a bad step; then `check()`, one MIN
    all-reduce, names the step (Diverged). `check()` also runs before every save. With
    --max-bad-steps N the step itself must know (to skip the optimizer), so `step_ok()`
    syncs and agrees every step: the opt-in cost.
    """

    WINDOW = 64  # steps kept before a fold: 64 scalar tensors

    def __init__(self, device: torch.device, max_bad_steps: int) -> None:
        self.first = torch.full((), _NO_BAD_STEP, dtype=torch.int64, device=device)
        self.bad = torch.zeros((), device=device)  # 1.0 once a fold found a bad step
        self.max_bad_steps = max_bad_steps
        self.skipped = 0
        self._kept: list[torch.Tensor] = []  # one value per step from `_start` on
        self._start = 0
        self._offsets = torch.arange(self.WINDOW, dtype=torch.int64, device=device)

    @staticmethod
    def local(gnorm: torch.Tensor) -> torch.Tensor:
        # FSDP: the local part of the norm; a non-finite global norm has a non-finite part
        # on some rank, and the all-reduces below bring it to every rank.
        return gnorm.to_local() if hasattr(gnorm, "to_local") else gnorm

    @staticmethod
    def finite(loss: torch.Tensor, gnorm: torch.Tensor | None) -> torch.Tensor:
        ok = torch.isfinite(loss)
        if gnorm is not None:
            ok = ok & torch.isfinite(Health.local(gnorm))
        return ok

    def observe(self, step: int, loss: torch.Tensor, gnorm: torch.Tensor | None) -> None:
        """Keep step `step`'s values. Steps come in order; a step seen again (a torchft
        group retries a step it could not commit) starts a new window."""
        n = len(self._kept)
        if n and (step != self._start + n or n == self.WINDOW):
            self._fold()
        if not self._kept:
            self._start = step
        self._kept.append(loss if gnorm is None else loss + Health.local(gnorm))

    def _fold(self) -> None:
        if not self._kept:
            return
        n = len(self._kept)
        bad = torch.isfinite(torch.stack(self._kept)).logical_not_()
        at = torch.where(bad, self._offsets[:n], _NO_BAD_STEP).min()  # the first bad row
        # a window with no bad row gives _NO_BAD_STEP + start: above, so `first` stays
        self.first = torch.minimum(self.first, at + self._start)
        self.bad = (self.first != _NO_BAD_STEP).float()
        self._kept.clear()

    def flags(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Local, no sync, for a SUM all-reduce that runs anyway: (the kept values' sum, the
        folds' verdict). Some rank saw a non-finite step when, summed over ranks, the first
        is not finite or the second is not 0 (`flagged`). Finite values whose sum overflows
        flag too, harmlessly: check() is exact."""
        kept = torch.stack(self._kept).sum(dtype=torch.float32) if self._kept else self.bad
        return kept, self.bad

    @staticmethod
    def flagged(kept_sum: float, bad: float) -> bool:
        return not math.isfinite(kept_sum) or bad != 0

    def check(self) -> None:
        """Raise Diverged if any rank saw a non-finite step since the start (collective)."""
        self._fold()
        t = self.first.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        if int(t) != _NO_BAD_STEP:
            raise Diverged(int(t), self.skipped)

    def step_ok(self, step: int, ok: torch.Tensor) -> bool:
        """--max-bad-steps: True to apply this step, False to skip it (agreed by all ranks);
        past the budget, Diverged (the bad step is never applied)."""
        t = ok.to(torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        if int(t):
            return True
        self.skipped += 1
        if self.skipped > self.max_bad_steps:
            raise Diverged(step, self.skipped - 1)
        return False

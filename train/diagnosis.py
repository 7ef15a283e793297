"""Hang diagnosis: when a collective fails or times out, which ranks never reached it, where
they ran, and whether their process had ended; the workers' ends told to their peers through
the attempt's store; the attempt's own rendezvous keys. What a worker concludes goes to its
node launcher through the error file (ddpkit.train.failure.tell_launcher)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import traceback
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from ddpkit.train import goodput, places
from ddpkit.train.failure import tell_launcher


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


def diagnose_script_failure(err: BaseException) -> str | None:
    """A user's script or module whose collective failed (run_entry): the trainer's exchange,
    so the launcher names the rank that never reached the collective (hung in its own code,
    gone) or the ranks whose code called different ones (`if rank == 0: dist.barrier()`),
    not the first rank to notice. The error file says it to the launcher; returned is one line
    for this rank's output when another rank explains the failure (one never came, or its
    process ended), else None (the traceback is the user's to read)."""
    frames = traceback.extract_tb(err.__traceback__)
    calls = [f.name for f in frames if f.filename.endswith(_C10D)]
    if not calls or not dist.is_initialized():
        return None  # not a collective's failure: the rank's own exception
    rank, world = dist.get_rank(), dist.get_world_size()
    site = user_call_site(err)
    phase = site or f"{calls[-1]}()"
    key = f"ddpkit/failed/script-{goodput.attempt_number()}"
    reported, sites, gone = _exchange(key, phase, err, 5.0)
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
    if not missing or blame:
        return None
    said = re.sub(r"^\[[^\]]*\]\s*", "", first).split(". ")[0]  # gloo's [file:line] prefix off
    line = (
        f"collective {phase} failed on rank {rank} of {world} ({said}): "
        f"{'rank' if len(missing) == 1 else 'ranks'} {', '.join(map(str, missing))} never "
        "reached it"
    )
    if ended := _ended(gone, missing):
        line += f" ({ended[:1].lower()}{ended[1:]})"
    return line + "; the launcher names the cause (DDPKIT_DEBUG=1: the whole traceback)"


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


def is_collective_error(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return isinstance(e, dist.DistError) or any(
        k in text for k in ("timed out", "timeout", "gloo", "nccl", "connection", "peer")
    )

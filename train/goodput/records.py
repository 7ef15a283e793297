"""Goodput records: one small JSON file per event in <run dir>/goodput/, written atomically by
whoever saw the event, read back one run at a time (the package docstring says which kinds)."""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpkit.train import contract
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

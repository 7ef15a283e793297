"""Recovery on the real 2-node SLURM cluster: every process of one node SIGKILLed (the
node lost, by `ddpkit chaos --attach`) -> the batch shell requeues the job (the attempt
count is SLURM's Restarts), it resumes from the newest complete checkpoint, ends with the
parameters of a failure-free run, and the goodput report names the lost node.
Budget: about 3 min on 2 cores (two jobs; the requeue's BeginTime hold is released early)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ddpkit.train import goodput

from tests import promcheck
from tests.engines.slurm.test_slurm_e2e import diverged, job_file, reference, submit  # noqa: F401  (reference: fixture)
from tests.slurm_fixtures import (  # noqa: F401  (slurm_cluster: fixture)
    REQUEUE_SETTLE_S,
    scontrol,
    slurm_cluster,
    started,
    until_done,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
DDPKIT = Path(sys.executable).with_name("ddpkit")


def test_a_lost_node_requeues_the_job_which_resumes_and_matches(
    reference: dict,  # noqa: F811
    tmp_path: Path,
) -> None:
    run = tmp_path / "rec-node"
    job = submit(job_file(tmp_path, "rec-node"))
    try:
        # kill-node fires once the run logged step 40 (a checkpoint is due at 100)
        drill = subprocess.run(
            [str(DDPKIT), "chaos", "--attach", str(started(run)), "--inject", "kill-node@step=120:node=1"],
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert "chaos: kill-node: SIGKILL to node rank 1" in drill.stdout, (
            drill.stdout + drill.stderr
        )
        # No release by the test: the kit's teardown starts the requeued job 15 s after its
        # requeue (slurm.requeue_delay_s), not after SLURM's hold of about 2 minutes.
        info = _wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), 400)
    finally:
        subprocess.run(["scancel", job], check=False)
    logs = "".join(p.read_text() for p in sorted((run / "slurm").glob(f"{job}_*_log.*")))
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, logs[-3000:])
    assert "(a lost node, or workers past the in-place restart budget); requeue 1 of 3" in logs
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step-100"), summary["resumed_from"]
    assert summary["param_digest"] == reference["param_digest"], diverged(run)
    lost = [f for f in summary["goodput"]["failures"] if f["kind"] == "node lost"]
    assert lost and lost[0]["node"] and lost[0]["recovered"], summary["goodput"]
    assert lost[0]["restart_s"] < 90, lost[0]  # SLURM's own hold alone is about 120 s
    print(f"lost node: detect {lost[0]['detect_s']:.1f} s, requeue to ready "
          f"{lost[0]['restart_s']:.1f} s")  # fmt: skip


HANG_TIMEOUT_S = 15  # train.timeout_s of the hang job: a collective waits this long


def test_a_stopped_rank_is_detected_named_and_restarted_in_place(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
) -> None:
    """SIGSTOP of rank 1 (on the second node) mid-run: its peer's collective times out within
    train.timeout_s, the failure is named by rank and host, and the group restarts in place
    (no requeue, not the time limit): the job completes in its first allocation."""
    cfg = job_file(tmp_path, "rec-hang")
    with cfg.open("a") as f:
        f.write(f"timeout_s = {HANG_TIMEOUT_S}\nshutdown_timeout_s = 5\n")
    run = tmp_path / "rec-hang"
    # its figures for node_exporter too (issue 55: SLURM nodes often take no inbound port)
    job = submit(cfg, "--set", f"metrics_textfile_dir={tmp_path / 'textfiles'}")
    t0 = time.monotonic()
    try:
        drill = subprocess.run(
            [str(DDPKIT), "chaos", "--attach", str(started(run)), "--inject", "stop-rank@step=120:rank=1"],
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert "chaos: stop-rank: SIGSTOP to rank 1" in drill.stdout, drill.stdout + drill.stderr
        deadline = time.monotonic() + 300
        while (info := scontrol(job))["JobState"] not in ("COMPLETED", "FAILED", "CANCELLED"):
            assert time.monotonic() < deadline, info
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job], check=False)
    logs = "".join(p.read_text() for p in sorted((run / "slurm").glob(f"{job}_*_log.*")))
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", (info, logs[-3000:])
    assert time.monotonic() - t0 < 15 * 60 / 2  # far inside the 15 min time limit
    assert "Ranks [1] never reached it" in logs, logs[-3000:]  # the waiting rank's line
    summary = json.loads((run / "summary.json").read_text())
    rep = summary["goodput"]
    (hang,) = [f for f in rep["failures"] if f["kind"] == "hang"]
    assert hang["rank"] == 1 and hang["node"] in ("node1", "node2"), hang  # the cluster's
    assert hang["recovered"] and rep["attempts"] == 2 and rep["finished"], rep
    # detected within the timeout: the peer's collective gave up after HANG_TIMEOUT_S, waited
    # up to 5 s for the other ranks' reports (fault.py) and named rank 1; its end record is
    # its process's exit, up to ~15 s later on 2 shared cores (seen: 26 s and 30 s). The
    # group being down (detect_s) takes longer: the stopped rank's agent stops it only once
    # the other node re-forms the rendezvous (seen: 62-72 s).
    recs = goodput.read(run)
    inject = next(r["time"] for r in recs if r["kind"] == "inject")
    named = next(r["time"] for r in recs if r["kind"] == "end" and 1 in (r.get("missing") or []))
    assert named - inject <= HANG_TIMEOUT_S + 5 + 15, (named - inject, hang)
    status = subprocess.run(
        [str(DDPKIT), "status", "slurm", job, "--config", str(cfg)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    where = f"rank 1 (node {hang['node_number']}, host {hang['node']})"  # the one format
    assert f"failure: hang {where} in attempt 0" in status.stdout, status.stdout
    # The Prometheus figures agree with goodput.json and summary.json: the run dir's final
    # file and the textfile rank 0's node kept for node_exporter (tests/promcheck.py)
    textfile = tmp_path / "textfiles" / "ddpkit-rec-hang.prom"
    for text in ((run / "metrics.prom").read_text(), textfile.read_text()):
        promcheck.assert_agrees(promcheck.families(text), run)


def _state(info: dict[str, str]) -> str:
    """What a failed wait needs to say (pytest cuts the whole dict to its first keys)."""
    keys = ("JobState", "Reason", "Restarts", "BatchHost", "NodeList", "ExcNodeList", "ReqNodeList")
    keys += ("StartTime", "EndTime", "RunTime", "Requeue")
    return " ".join(f"{k}={info.get(k)}" for k in keys)


def _wait_state(job: str, states: tuple[str, ...], timeout_s: float = 300) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while (info := scontrol(job))["JobState"] not in states:
        assert time.monotonic() < deadline, f"not {states} in {timeout_s} s: {_state(info)}"
        time.sleep(1)
    return info


def _release_requeued(job: str, restarts: int, *update: str) -> None:
    """Wait for the requeue (PENDING with Restarts = `restarts`), then lift its BeginTime hold
    after REQUEUE_SETTLE_S (see slurm_fixtures.until_done: an immediate start can be
    revoked), with `update` (scontrol's KEY=VALUE) applied to the pending job first."""
    deadline = time.monotonic() + 300
    seen: list[str] = []  # each state the job passed through while the test waited
    while not (
        (info := scontrol(job))["JobState"] == "PENDING" and info["Restarts"] == str(restarts)
    ):
        now = f"{info['JobState']}/{info.get('Reason')}/Restarts={info.get('Restarts')}"
        if not seen or seen[-1] != now:
            seen.append(now)
        why = f"no requeue {restarts} (PENDING) in 300 s; seen {seen}; now {_state(info)}"
        assert time.monotonic() < deadline and info["JobState"] not in ("COMPLETED", "FAILED"), why
        time.sleep(1)
    time.sleep(REQUEUE_SETTLE_S)
    if update:
        subprocess.run(["scontrol", "update", f"JobId={job}", *update], check=True)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)


def _excluded(job: str, want: set[str], timeout_s: float = 120) -> set[str]:
    """The job's ExcNodeList as node names, once it is `want` (or at the timeout): the
    teardown's update lands just after its requeue."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = scontrol(job).get("ExcNodeList", "(null)")
        names = set() if listed == "(null)" else set(subprocess.run(
            ["scontrol", "show", "hostnames", listed], capture_output=True, text=True,
        ).stdout.split())  # fmt: skip
        if names == want or time.monotonic() > deadline:
            return names
        time.sleep(1)


def _kill_node(run: Path, step: int) -> None:
    """`ddpkit chaos --attach` SIGKILLs node 0 at `step`; the test goes on once it has. An
    attached drill then waits for the job's last step before its report, and this job needs
    the test to release its requeue first: Ctrl-C (SIGINT) ends that wait, as for a user."""
    drill = subprocess.Popen(
        [str(DDPKIT), "chaos", "--attach", str(started(run)), "--inject", f"kill-node@step={step}:node=0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # as from a terminal: a suite started in the background (`cmd &` in a script) ignores
        # SIGINT, its children inherit that, and Python then raises no KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    seen: list[str] = []
    try:
        for line in drill.stdout or ():
            seen.append(line)
            if "chaos: kill-node: SIGKILL to node rank 0" in line:
                break
        else:
            raise AssertionError("".join(seen))
    finally:
        drill.send_signal(signal.SIGINT)
        drill.communicate(timeout=60)


def test_a_node_that_fails_twice_is_excluded_and_the_job_ends_on_the_other(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A 1-node job whose node loses every process twice: the first loss requeues it, the
    second requeues it with that node in ExcNodeList, and it finishes on the other node.
    The test pins the second attempt to the same node (ReqNodeList; the nodes here are
    shared, so a sleeping job could not hold the other, and an ExcNodeList pin of the other
    would leave the kit no room to exclude: slurm/room.py); the kit's teardown then adds the
    node that failed twice to the job's ExcNodeList, and the test lifts its own pin (a
    user's --exclude kept beside it: test_slurm_render.py)."""
    cfg = job_file(tmp_path, "rec-badnode")
    run = tmp_path / "rec-badnode"
    job = submit(cfg, "--nodes", "1", "--set", "slurm.requeue_delay_s=none")  # the test releases

    def job_logs() -> str:  # every attempt's, in order
        return "".join(p.read_text() for p in sorted((run / "slurm").glob(f"{job}_*_log.*")))

    try:
        bad = _wait_state(job, ("RUNNING",))["BatchHost"]
        other = "node2" if bad == "node1" else "node1"
        _kill_node(run, 120)  # first loss: requeued
        _release_requeued(job, 1, f"ReqNodeList={bad}")
        assert _wait_state(job, ("RUNNING",))["BatchHost"] == bad
        _kill_node(run, 200)  # second loss on the same node: requeued without it
        assert _excluded(job, {bad}) == {bad}
        _release_requeued(job, 2, "ReqNodeList=")  # the test's pin lifted
        info = _wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), 400)
    except AssertionError as e:  # a wait that failed: with what the job's attempts printed
        tail = job_logs()[-4000:]
        raise AssertionError(f"{e}\n--- the job's logs, last 4000 characters:\n{tail}") from e
    finally:
        subprocess.run(["scancel", job], check=False)
    logs = job_logs()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", (info, logs[-3000:])
    assert info["ExcNodeList"] == bad and info["BatchHost"] == other, info
    assert f"requeue 2 of 3, excluding {bad} (failed 2 times or more)" in logs, logs[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    rep = summary["goodput"]
    assert rep["failing_nodes"] == [bad] and rep["finished"], rep
    lost = [f["node"] for f in rep["failures"] if f["kind"] == "node lost"]
    assert lost == [bad, bad], rep["failures"]
    status = subprocess.run(
        [str(DDPKIT), "status", "slurm", job, "--config", str(cfg)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert f"excluded from the next attempt (SLURM): {bad}" in status.stdout, status.stdout

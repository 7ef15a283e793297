"""What must never hang: a lock that names no owner, a second fit() in one process, a rank
that dies or stalls before a barrier. Each ends within its bound, with one line that names
the cause.

Here the tests that start processes; the in-process ones in tests/unit/train/loop/test_hangs.py.
Helpers both use are in tests/unit/train/loop/test_hangs.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ddpkit.train.config import ConfigError
from ddpkit.train.loop.runlock import RunLock

from tests.trainrun import clean_env, train
from tests.unit.train.loop.test_hangs import _agent_store, _lock_of


@pytest.mark.timeout(30)
def test_the_launchers_check_refuses_a_live_owner_and_waits_for_one_leaving(tmp_path):
    """The node launcher's check before any worker starts (RunLock.refuse_if_live): a live
    owner on this host is refused in acquire's line; one that ends within the grace (a
    requeued job's old workers still exiting) is not; the check writes nothing."""
    for lasts, refused in ((300, True), (1, False)):
        owner = subprocess.Popen(["sleep", str(lasts)])
        threading.Thread(target=owner.wait, daemon=True).start()  # reaped when it ends
        body = json.dumps({"host": socket.gethostname(), "pid": owner.pid})
        (tmp_path / ".lock").write_text(body)
        try:
            if refused:
                with pytest.raises(
                    ConfigError, match=f"is in use by another job \\(pid {owner.pid}"
                ):
                    RunLock(tmp_path).refuse_if_live(grace_s=1.0)
            else:
                RunLock(tmp_path).refuse_if_live(grace_s=15.0)
            assert (tmp_path / ".lock").read_text() == body
        finally:
            owner.kill()


@pytest.mark.timeout(30)
def test_an_empty_lock_of_a_newcomer_is_given_time_to_name_its_owner(tmp_path):
    """Between its O_EXCL create and its write, a starting job's lock is empty: a second job
    waits for it (briefly) instead of taking it over."""
    lock = tmp_path / ".lock"
    lock.write_text("")
    # a live job on this host (this test's parent process)
    owner = {"host": socket.gethostname(), "pid": os.getppid(), "agent_pid": None}

    threading.Timer(0.5, lambda: lock.write_text(json.dumps(owner))).start()
    with pytest.raises(ConfigError, match="in use by another job"):
        RunLock(tmp_path).acquire()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("body", ["", None])
def test_the_trainer_never_spins_on_an_owner_less_lock(tmp_path, body):
    """The campaign's case: an empty, garbage or directory .lock made the trainer spin at
    100% CPU forever. Now: taken over with a warning (and trained), or one line + exit 2.
    The trainer takes a garbage lock over through the same RunLock.acquire as an empty one:
    that acquire with garbage bodies is test_a_lock_that_names_no_owner_is_taken_over_...
    ("{not json", bytes not UTF-8) and test_a_lock_of_another_shape_is_an_owner_less_one."""
    rd = tmp_path / "run"
    _lock_of(rd / "checkpoints", body)
    run = train(rd, "--steps", "2", "--no-eval", check=False, timeout=240)
    if body is None:
        assert run.rc == 2, run.out
        assert "is a directory, not a lock file" in run.out and "Traceback" not in run.out
    else:
        assert run.rc == 0, run.out
        assert "warning: taking over the stale lock" in run.out
        assert (rd / "summary.json").is_file()


# --- a rank that stalls or dies before the end-of-run collectives ------------------------------


def two_ranks(tmp_path: Path, fault: str, *train_args: str) -> subprocess.CompletedProcess[str]:
    """The kit's trainer on 2 ranks under the node launcher, --timeout-s 5, with one fault."""
    return subprocess.run(
        [sys.executable, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2",
         "--", "-m", "ddpkit.train", *train_args, "--no-eval", "--timeout-s", "5",
         "--progress", "plain", "--run-dir", "runs/t"],
        cwd=tmp_path, env=clean_env(DDPKIT_FAULT=fault), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("fault", ["hang@end:1:900", "kill@end:1"])
def test_a_rank_missing_at_the_end_of_run_collectives_is_the_one_blamed(tmp_path, fault):
    """Rank 1 stalls (or dies) after the last step: rank 0 waits in the first end-of-run
    collective. Rank 0's line names the phase and rank 1; the launcher's line blames rank 1
    (it used to blame rank 0, the first to exit, and the collective had no name at all when
    it came after the loop). Within the timeout, not the 900 s stall."""
    t0 = time.monotonic()
    r = two_ranks(tmp_path, fault, "--steps", "4")
    elapsed = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    last = r.stderr.splitlines()[-1]
    if fault.startswith("hang"):
        assert "collective stop-signal all_reduce after the last step (4) failed on rank 0" in out
        assert "Ranks [1] never reached it" in out
        # rank 0's own line places rank 1 too (each worker published its place at start)
        assert f"Where they ran: rank 1 (node 0, host {socket.gethostname()})." in out, out
        assert last.startswith(
            f"ddpkit node: rank 1 (node 0, host {socket.gethostname()}) never reached the "
            "collective stop-signal all_reduce after the last step (4)"
        ), out
    else:  # torchrun SIGTERMs rank 0 at once: its diagnosis or its watchdog, whichever is first
        assert last.startswith("ddpkit node: rank 1 "), out
    assert "Traceback" not in out, out
    assert elapsed < 240, elapsed  # start-up + the 5 s timeout + teardown, not the 900 s stall


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("ckpt_async", [False, True])
def test_a_rank_stalled_inside_a_checkpoint_save_is_named_within_the_timeout(tmp_path, ckpt_async):
    """Rank 1 stalls in its write of step 4's checkpoint (its files written, before DCP
    gathers the ranks' results): rank 0 waits in the save's collective, on the checkpoint's
    own gloo group. It fails within --timeout-s naming rank 1 (it waited out torch's 30-min
    default before: a chaos drill's SIGSTOP at a save step held its job past CI's limit), and
    no marker goes down for the half-written step."""
    t0 = time.monotonic()
    async_flag = ["--ckpt-async"] if ckpt_async else []
    r = two_ranks(tmp_path, "hangsave@4:1:900", "--steps", "8", "--ckpt-interval", "4", *async_flag)
    elapsed = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "[fault injection] hangsave on rank 1 at step 4" in out, out
    # async: the save runs on in the background while the loop goes on; its failure comes
    # out at a later step's poll or at the next save, which waits for it (step 8)
    phase = (
        r"async checkpoint save of step 4 at step [5-8]" if ckpt_async
        else r"checkpoint save at step 4"
    )  # fmt: skip
    assert re.search(rf"collective {phase} failed on rank 0 of 2 \(--timeout-s 5\)", out), out
    assert "Ranks [1] never reached it" in out, out
    assert re.match(
        rf"ddpkit node: rank 1 \(node 0, host {re.escape(socket.gethostname())}\) never "
        rf"reached the collective {phase} ",
        r.stderr.splitlines()[-1],
    ), out
    assert "Traceback" not in out, out
    assert not list(tmp_path.glob("runs/t/**/step-4/*.json")), out  # no marker
    assert elapsed < 240, elapsed  # start-up + the 5 s timeout + teardown, not the 900 s stall


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_rank_stalled_inside_the_resume_is_named_within_the_timeout(tmp_path, two_fits):
    """Rank 1 stalls in its read of step 3's checkpoint on resume: rank 0 waits in the load's
    collectives (the checkpoint's gloo group). It fails naming rank 1 and the start-up load,
    within the timeout (the load was not under the diagnosis: a bare gloo traceback). The run
    resumed is a copy of the first fit()'s of two_fits: the kit's trainer, 2 ranks, 3 steps,
    its checkpoint at the end (not a launch of its own to make one)."""
    fits_dir, fits = two_fits
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert (fits_dir / "runs/a/checkpoints/step-3/.complete").is_file()
    shutil.copytree(fits_dir / "runs" / "a", tmp_path / "runs" / "t")
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2",
         "--", "-m", "ddpkit.train", "--no-eval", "--timeout-s", "5", "--progress", "plain",
         "--run-dir", "runs/t", "--steps", "6"],
        cwd=tmp_path, env=clean_env(DDPKIT_FAULT="hangload@3:1:900"), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "[fault injection] hangload on rank 1 at step 3" in out, out
    assert "collective checkpoint load at start-up failed on rank 0 of 2 (--timeout-s 5)" in out
    assert "Ranks [1] never reached it" in out, out
    assert r.stderr.splitlines()[-1].startswith(
        f"ddpkit node: rank 1 (node 0, host {socket.gethostname()}) never reached the "
        "collective checkpoint load at start-up"
    ), out
    assert "Traceback" not in out, out
    assert elapsed < 240, elapsed


# --- fit() twice in one process ---------------------------------------------------------------

TWO_FITS = """
import sys
from ddpkit.train import fit
a = fit(steps=3, eval=False, run_dir="runs/a", argv=[])
print(f"first {a}", flush=True)
b = fit(steps=3, eval=False, run_dir="runs/b", argv=[])
print(f"second {b}", flush=True)
sys.exit(a or b)
"""


def _node(tmp_path: Path, script: str, env: dict[str, str] | None = None):
    (tmp_path / "two.py").write_text(script)
    return subprocess.run(
        [sys.executable, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2",
         "--", "two.py"],
        cwd=tmp_path, env=clean_env(**(env or {})), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def two_fits(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """TWO_FITS on 2 ranks, once: read by the second-fit test, and its runs/a (the kit's
    trainer, 3 steps, a checkpoint at the end) copied as the run the resume-stall test
    resumes (one launch of 2 ranks, each importing torch, instead of two)."""
    where = tmp_path_factory.mktemp("two_fits")
    return where, _node(where, TWO_FITS)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_second_fit_in_one_process_trains_in_the_same_group(two_fits):
    """The second fit() used to re-create the process group from the same rendezvous and
    hang in its first barrier until the 600 s timeout."""
    where, r = two_fits
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert out.count("first 0") == 2 and out.count("second 0") == 2, out
    for run in ("a", "b"):
        assert json.loads((where / "runs" / run / "summary.json").read_text())["steps"] == 3


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_fit_after_a_failed_fit_is_one_line_not_a_hang(tmp_path):
    r = _node(tmp_path, TWO_FITS, env={"DDPKIT_FAULT": "usererror@2:1"})
    out = r.stdout + r.stderr
    assert "first 2" in out, out
    assert out.count("error: fit() after a failed fit() in the same process") == 1, out
    assert "second 1" in out and "Traceback" not in out, out
    assert r.returncode == 2, out


# --- the README's own hang: a collective only one rank calls -----------------------------------

ODD_PATH = """
import torch
import torch.distributed as dist


class Odd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))

    def forward(self, x):
        if dist.get_rank() == 0:
            dist.barrier()
        return self.net(x)


def build(cfg):
    return Odd()
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_barrier_only_rank_0_calls_names_rank_0_and_the_line_of_the_call(tmp_path):
    """docs/troubleshooting.md's example. Both ranks time out and both report, so no rank is
    missing: both used to blame the DDP all_reduce and neither named the one that took the
    other path."""
    (tmp_path / "oddpath.py").write_text(ODD_PATH)
    r = subprocess.run(
        [sys.executable, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2",
         "--", "-m", "ddpkit.train", "--model", "oddpath:build", "--steps", "3", "--no-eval",
         "--timeout-s", "5", "--progress", "plain", "--run-dir", "runs/t"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    said = (
        "rank 0 called barrier() at oddpath.py:13 (in forward), while rank 1 was in the "
        "forward/backward (DDP gradient all_reduce) at step 1"
    )
    assert out.count(said) == 2, out  # each rank's error line
    here = f"(node 0, host {socket.gethostname()})"  # the launcher's line places each rank
    placed = said.replace("rank 0 ", f"rank 0 {here} ").replace("rank 1 ", f"rank 1 {here} ")
    assert r.stderr.splitlines()[-1].startswith(f"ddpkit node: {placed}"), out
    assert "Traceback" not in out, out


def test_a_launchers_word_that_its_worker_ended_reaches_the_peers_of_that_attempt_only():
    """diagnosis.publish_end (the node launcher, from its worker's environment) and _ends (a peer
    waiting for reports) meet in the attempt's store: the same round, not another's."""
    from ddpkit.train import diagnosis, goodput

    from tests.trainrun import free_port

    server, env = _agent_store(3)
    env["TORCHELASTIC_RESTART_COUNT"] = "0"  # a node restarted for another's failure keeps 0
    assert goodput.attempt_number(env) == 3 and goodput.attempt_number({}) == 0
    diagnosis.publish_end(env, 1, -signal.SIGKILL)
    here = diagnosis.attempt_store(env, timeout_s=5)
    assert diagnosis._ends(here, [0, 1]) == {1: {"code": -signal.SIGKILL}}  # rank 0 said nothing
    assert diagnosis._ends(here, [1]) == {1: {"code": -signal.SIGKILL}}
    other = diagnosis.attempt_store({**env, "DDPKIT_RDZV_ROUND": "2"}, timeout_s=5)
    assert diagnosis._ends(other, [1]) == {}  # the round before: its own keys
    assert (
        diagnosis._ended({1: {"code": -signal.SIGKILL}}, [1]) == "Rank 1 had ended (signal SIGKILL)"
    )
    assert diagnosis._ended({2: {"code": 3}}, [1, 2]) == "Rank 2 had ended (exit code 3)"
    assert diagnosis.attempt_store({}, timeout_s=1) is None  # not under torchrun's agent store
    # a launcher whose store is gone (its host was the node lost) says nothing, and returns
    diagnosis.publish_end({**env, "MASTER_PORT": str(free_port())}, 1, -signal.SIGKILL)
    del server


def test_once_a_silent_rank_is_known_dead_the_wait_for_reports_ends_soon_after(monkeypatch):
    """Four ranks: this one (0) saw the collective fail, rank 1 was killed (its launcher said
    so), ranks 2 and 3 stay silent (blocked in their own collective until their timeout). The
    wait for reports ends AFTER_END_S after the end is known, not at the grace (30 s here):
    in the SLURM drill (2 nodes x 2 ranks) every kill cost the peers the whole grace."""
    import torch.distributed as dist
    from ddpkit.train import diagnosis

    server, env = _agent_store(0)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reports = dist.TCPStore("127.0.0.1", int(env["MASTER_PORT"]), None, is_master=False)
    monkeypatch.setattr(diagnosis, "_store", lambda: reports)
    monkeypatch.setattr(dist, "get_rank", lambda *a: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 4)
    diagnosis.publish_end(env, 1, -signal.SIGKILL)
    t0 = time.monotonic()
    reported, _, gone = diagnosis._exchange("ddpkit/failed/7", "forward", RuntimeError("x"), 30.0)
    took = time.monotonic() - t0
    assert reported == [0] and gone == {1: {"code": -signal.SIGKILL}}, (reported, gone)
    assert took < 10, took  # AFTER_END_S (1 s) and a poll; the grace was 30 s
    del server


def _two_nodes(tmp_path: Path, fault: str, *flags: str, nproc: int = 1) -> tuple[Path, list[str]]:
    """Two node launchers on this machine, `nproc` ranks each (node 0 has ranks 0..nproc-1),
    the kit's trainer for 60 steps with a save every 20 and DDPKIT_FAULT=`fault`: (run dir,
    each launcher's output); both must exit 0 (the run resumed in place)."""
    from tests.trainrun import PY, free_port

    rd = tmp_path / "run"
    node = [PY, "-m", "ddpkit.train.node", "--nnodes", "2", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "--max-restarts", "1"]  # fmt: skip
    job = ["--", "-m", "ddpkit.train", "--run-dir", str(rd), "--progress", "plain",
           "--model", "mlp", "--steps", "60", "--ckpt-interval", "20", "--no-eval", *flags]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*node, "--node-rank", str(n), *job],
            cwd=tmp_path,
            env=clean_env(DDPKIT_FAULT=fault),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for n in (0, 1)
    ]
    outs = [p.communicate(timeout=360)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert json.loads((rd / "summary.json").read_text())["steps"] == 60
    return rd, outs


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_rank_killed_on_one_node_is_named_at_once_and_booked_in_its_attempt(tmp_path):
    """Rank 1 SIGKILLed at step 30: rank 0 names it from its launcher's word, without waiting
    out the reports' grace, and the run resumes in place. Node 0's agent restarts for the
    other node's failure (a membership change: torchrun's restart count stays 0 there), yet
    both nodes' records of the second attempt say attempt 1, so the report books the kill,
    once."""
    from ddpkit.train import goodput

    rd, outs = _two_nodes(tmp_path, "kill@30:1")
    assert "Ranks [1] never reached it" in outs[0], outs[0]
    assert "Rank 1 had ended (signal SIGKILL)" in outs[0], outs[0]
    rep = goodput.report(rd)
    assert rep is not None and rep.finished and rep.attempts == 2, rep
    (kill,) = rep.failures
    assert (kill.kind, kill.rank, kill.attempt, kill.recovered) == ("killed", 1, 0, True), kill
    second = [r for r in goodput.read(rd) if r["kind"] == "attempt" and r["time"] > kill.at]
    assert len(second) == 2 and {r["attempt"] for r in second} == {1}, second


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_hung_rank_is_stopped_for_the_restart_within_the_jobs_shutdown_budget(tmp_path):
    """Rank 1 hangs at step 30; rank 0 times out (8 s) and its node restarts; node 1's agent
    stops rank 1 for the restart. The kit's trainer, on that SIGTERM, waits for its step up to
    timeout_s before it gives up by itself with a line; the job's shutdown budget (2 s) is
    shorter, so torchrun must SIGKILL it first. torchrun's restart path waited its own 30 s
    instead, whatever --shutdown-timeout said: rank 1 then gave up by itself (exit 1)."""
    from ddpkit.train import goodput

    t0 = time.monotonic()
    rd, outs = _two_nodes(
        tmp_path, "hang@30:1:900", "--timeout-s", "8", "--shutdown-timeout-s", "2"
    )
    elapsed = time.monotonic() - t0
    # rank 0 waited in step 30's gradient all-reduce: the step's collective is named
    phase = "collective forward/backward (DDP gradient all_reduce) at step 30"
    assert f"{phase} failed on rank 0 of 2 (--timeout-s 8)" in outs[0], outs[0]
    assert "Ranks [1] never reached it" in outs[0], outs[0]
    assert "current step did not finish" not in outs[1], outs[1]
    # its end as its launcher saw it: SIGKILL, or none when torchrun reaped it first
    ends = [r for r in goodput.read(rd) if r["kind"] == "end" and r.get("rank") == 1]
    assert [r["code"] for r in ends if r["code"] != 0] in ([], [-signal.SIGKILL]), ends
    (hang,) = goodput.report(rd).failures
    assert (hang.kind, hang.rank, hang.recovered) == ("hang", 1, True), hang
    assert elapsed < 240, elapsed  # two start-ups + the 8 s timeout + teardown, not the stall


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_hung_rank_beside_a_failed_one_on_its_node_is_stopped_within_the_jobs_budget(tmp_path):
    """Two ranks per node. Rank 0 hangs at step 30; rank 1, on the same node, times out in the
    collective (8 s) and fails. Then torchrun's process context stops the node's other
    workers by itself, not through the agent's restart, and it too waited a fixed 30 s before
    its SIGKILL: the hung rank gave up by itself first (exit 1, "current step did not
    finish"). With the job's budget (2 s) it is SIGKILLed before that. The SLURM drill's
    stopped rank shared its node so: found 30 s after its peers ended."""
    from ddpkit.train import goodput

    rd, outs = _two_nodes(
        tmp_path, "hang@30:0:900", "--timeout-s", "8", "--shutdown-timeout-s", "2", nproc=2
    )
    assert "Ranks [0] never reached it" in outs[0], outs[0]
    assert "current step did not finish" not in outs[0], outs[0]
    recs = goodput.read(rd)
    ends = {r["rank"]: r for r in recs if r["kind"] == "end" and r["attempt"] == 0}
    assert ends[1]["code"] == 1, ends  # the rank that timed out
    if 0 in ends:  # its end as its launcher saw it, unless torchrun reaped it first
        assert ends[0]["code"] == -signal.SIGKILL, ends
        assert ends[0]["time"] - ends[1]["time"] < 2 + 4, ends  # the budget, and slack
    (hang,) = goodput.report(rd).failures
    assert (hang.kind, hang.rank, hang.recovered) == ("hang", 0, True), hang


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_rank_stalled_at_a_logging_step_is_named_in_one_line(tmp_path):
    """Rank 1 stalls at step 4's logging, after the step's gradient all-reduce: rank 0 waits
    in the loss all-reduce of the log line, a collective of the loop outside the training
    step. It is named like a step's (a SLURM drill's SIGSTOP that landed at a logging step
    printed a gloo timeout's traceback and no rank, CI of 7f15d4f)."""
    t0 = time.monotonic()
    r = two_ranks(tmp_path, "hanglog@4:1:900", "--steps", "8", "--log-interval", "4")
    elapsed = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "[fault injection] hanglog on rank 1 at step 4" in out, out
    phase = "loss all_reduce (logging) at step 4"
    assert f"collective {phase} failed on rank 0 of 2 (--timeout-s 5)" in out, out
    assert "Ranks [1] never reached it" in out, out
    assert r.stderr.splitlines()[-1].startswith(
        f"ddpkit node: rank 1 (node 0, host {socket.gethostname()}) never reached the "
        f"collective {phase}"
    ), out
    assert "Traceback" not in out, out
    assert elapsed < 240, elapsed  # start-up + the 5 s timeout + teardown, not the 900 s stall

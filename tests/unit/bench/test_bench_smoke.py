"""Benchmarks: the statistics helpers, and a tiny `python -m bench --quick` end to end.

No timing is asserted anywhere: the end-to-end test checks that every benchmark script runs
under torchrun and writes well-formed, self-consistent JSON (about 50 s on 2 cores).

Here the tests that run in this process; those that start processes in
tests/process/bench/test_bench_smoke.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import spread, window_step_time

ROOT = Path(__file__).resolve().parents[3]


def test_window_step_time_excludes_warmup_and_keeps_periodic_costs():
    # 3 warmup steps of 5 s, then steps of 1 s with every 10th step 2 s (a "logging" step),
    # and one block hit by a 30 s stall: the block median keeps the periodic cost and drops
    # the stall; the mean keeps both.
    durations = [5.0] * 3 + [2.0 if i % 10 == 9 else 1.0 for i in range(40)]
    durations[3 + 15] += 30.0
    ends, t = [], 0.0
    for d in durations:
        t += d
        ends.append(t)
    st = window_step_time(ends, warmup=3, block=10)
    assert st["steps"] == 40 and st["blocks"] == 4
    assert st["block_median"] == pytest.approx(1.1)
    assert st["mean"] == pytest.approx((40 * 1.1 + 30.0) / 40)
    assert st["step_median"] == pytest.approx(1.0)


def test_window_step_time_needs_a_full_block_after_warmup():
    with pytest.raises(ValueError, match="at least"):
        window_step_time([1.0, 2.0, 3.0], warmup=2, block=10)


def test_spread():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread([])["n"] == 0 and math.isnan(spread([])["median"])


def test_bad_flag_is_one_line_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--reps", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--reps must be >= 1" in proc.stderr


ABORT_AFTER = """\
import os, signal, sys
for r in sys.argv[1:]:
    open(f"done-{r}", "w").close()
sys.stderr.write("exitcode  : -6 (pid: 1)  (SIGABRT)\\n")
os.kill(os.getpid(), signal.SIGABRT)
"""


@pytest.mark.parametrize(("ranks_done", "redone"), [(("0", "1"), True), (("0",), False)])
def test_a_launch_is_redone_only_when_every_rank_finished_before_the_abort(
    tmp_path, ranks_done, redone
):
    """The launch bench tells torch's exit-time abort (every rank wrote its done file, then
    SIGABRT: the pair is redone and counted) from a launch that failed (the bench stops)."""
    from bench import launch_overhead as lo

    (tmp_path / "done-1").write_text("")  # a previous launch's file does not count
    argv = [sys.executable, "-c", ABORT_AFTER, *ranks_done]
    with pytest.raises(lo.BenchError) as got:
        lo.timed(argv, tmp_path)
    assert isinstance(got.value, lo.AbortedAtExit) is redone, got.value
    assert "SIGABRT" in str(got.value)


def test_torchft_goodput_figures_from_timed_lines():
    """bench.torchft_goodput's arithmetic on made-up timed lines: plain redoes the steps
    since its resume point; torchft's survivor goes on, the killed group heals later."""
    from bench.torchft_goodput import figures

    clean = {"wall_s": 30.0}
    plain = {"killed_at": 10.0, "wall_s": 50.0, "lines": [
        (9.0, "step     59/160 loss 1"), (9.9, "step     60/160 loss 1"),
        (10.5, "step     61/160 loss 1"),  # logged before the kill's effect
        (25.0, "resumed from runs/x/checkpoints/step-50 at step 50 (epoch 0, ...)"),
        (26.0, "step     51/160 loss 1"), (31.0, "step     62/160 loss 1"),
    ]}  # fmt: skip
    f = figures("plain", plain, clean)
    assert (f["kill_step"], f["steps_redone"], f["lost_s"]) == (60, 10, 20.0)
    assert f["return_s"] == 0.5 and f["stall_s"] == 0.5  # step 61 came after the kill
    assert f["longest_gap_s"] == 15.5  # 10.5 -> 26.0
    ft = {"killed_at": 10.0, "wall_s": 33.0, "lines": [
        (9.5, "[group 0] step     60/160 loss 1"), (9.6, "[group 1] step     60/160 loss 1"),
        (13.0, "[group 0] step     61/160 loss 1"), (14.0, "[group 0] step     62/160 loss 1"),
        (19.0, "[group 1] torchft: replica group 1 healed from a peer"),
    ]}  # fmt: skip
    f = figures("torchft", ft, clean)
    assert (f["kill_step"], f["steps_redone"], f["stall_s"]) == (60, 0, 3.0)
    assert (f["longest_gap_s"], f["return_s"], f["lost_s"]) == (3.0, 9.0, 3.0)


def test_the_plain_kubernetes_route_is_a_pytorchjob_whose_mark_path_stays_one_argument(tmp_path):
    """bench.submit_latency's plain Kubernetes job: a hand-written PyTorchJob (one Master,
    torchrun --standalone in the image's /workspace) whose arguments are data in JSON, so a
    mark path with a space or a quote reaches the script as one argument; its report line
    names the route it measured."""
    from bench import submit_latency as sl

    mark = tmp_path / "marks" / "a b'$(x)"
    argv = sl.K8s().argv("plain", tmp_path, "bsub-plain-1", mark)
    assert argv[:3] == ["kubectl", "apply", "-f"]
    job = json.loads(Path(argv[3]).read_text())
    assert (job["kind"], job["metadata"]["name"]) == ("PyTorchJob", "bsub-plain-1")
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]
    [container] = master["template"]["spec"]["containers"]
    assert master["replicas"] == 1 and container["name"] == "pytorch"
    assert container["command"][:5] == ["torchrun", "--standalone", "--nproc-per-node", "2",
                                        "train.py"]  # fmt: skip
    assert container["command"][-2:] == ["--mark", str(mark)]
    kit = sl.K8s().argv("kit", tmp_path, "bsub-kit-1", mark)
    assert kit[1:5] == ["submit", "k8s", "--set", "name=bsub-kit-1"] and kit[-1] == str(mark)
    one = {"median": 1.0, "p25": 0.5, "p75": 1.5}
    result = {"backend": "k8s", "pairs": [{}], "over_plain": {"first_step_s": one,
              "submit_returned_s": one}, "plain": {"first_step_s": one,
              "submit_returned_s": one}, "kit": {"first_step_s": one, "submit_returned_s": one}}  # fmt: skip
    text = sl.lines(result)
    assert "ddpkit submit k8s vs kubectl apply" in text[0] and "goal <= 2.0 s over: met" in text[1]


def test_the_torchx_submit_way_is_dist_ddp_awaited_by_job_id_and_one_line_without_torchx(
    tmp_path, monkeypatch, fake_bin
):
    """bench.submit_latency's third SLURM way: `torchx run --scheduler slurm dist.ddp` of the
    same train.py (1 node x 2 ranks, 2 CPUs, the mark as the script's argument); its end is the
    job id of the handle torchx prints gone from squeue (torchx names the job train-0, not the
    bench's name); its rows give torchx - plain and kit - torchx beside the kit's goal line;
    without torchx it is one line and plain against kit is still measured."""
    from bench import submit_latency as sl

    monkeypatch.setattr(sl, "bin_of", lambda name: f"/venv/bin/{name}")
    mark = tmp_path / "marks" / "bsub-torchx-1"
    argv = sl.Slurm().argv("torchx", tmp_path, "bsub-torchx-1", mark)
    assert argv[0] == "env" and argv[1].startswith(f"PATH={Path(sys.executable).parent}:")
    assert argv[2:6] == ["/venv/bin/torchx", "run", "--scheduler", "slurm"]
    assert argv[argv.index("dist.ddp") + 1 :] == ["-j", "1x2", "--cpu", "2", "--script",
                                                  "train.py", "--", "--mark", str(mark)]  # fmt: skip

    queue, args = tmp_path / "queue", tmp_path / "squeue.args"
    fake_bin.add("squeue", f'#!/bin/sh\necho "$@" > {args}\ncat {queue}\n')
    completing = tmp_path / "completing"
    completing.write_text("")
    fake_bin.add("sinfo", f"#!/bin/sh\ncat {completing}\n")
    queue.write_text("4242\n")
    assert not sl.Slurm().ended("bsub-torchx-1", "slurm://torchx/4242\n")
    assert args.read_text().split()[:3] == ["-h", "-j", "4242"]
    queue.write_text("")
    completing.write_text("node1\n")  # gone from the queue, its node still cleaning up
    assert not sl.Slurm().ended("bsub-torchx-1", "slurm://torchx/4242\n")
    completing.write_text("")
    assert sl.Slurm().ended("bsub-torchx-1", "slurm://torchx/4242\n")

    one = {"median": 1.0, "p25": 0.5, "p75": 1.5}
    both = {"first_step_s": one, "submit_returned_s": one}
    result = {"backend": "slurm", "pairs": [{}], "over_plain": both, "plain": both, "kit": both,
              "torchx": both, "torchx_over_plain": both, "kit_over_torchx": both}  # fmt: skip
    text = sl.lines(result)
    assert "goal <= 2.0 s over: met" in text[1]
    assert text[3].split() == ["to", "first", "step", "torchx", "1.00", "s;", "torchx", "-",
                               "plain", "+1.00", "(p25..p75", "+0.50..+1.50),", "kit", "-",
                               "torchx", "+1.00", "(p25..p75", "+0.50..+1.50)"]  # fmt: skip
    result["pairs"] = [{"torchx": {"exit_after_submit": "1, KeyError: 'job_resources'"}}]
    assert sl.lines(result)[-1] == (
        "  torchx run exited non-zero after printing its job's handle in 1 of 1 (the job ran and"
        " is measured): 1, KeyError: 'job_resources'"
    )

    monkeypatch.setitem(sys.modules, "torchx", None)  # not importable
    route = sl.Slurm()
    assert route.ways == ("plain", "kit")
    del result["torchx"]
    text = sl.lines({**result, "skipped": route.skipped})
    assert len(text) == 4 and "goal <= 2.0 s over: met" in text[1]
    assert text[-1] == "  torchx: not installed (pip install -e '.[bench]'); its way skipped"

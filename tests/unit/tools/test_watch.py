"""`ddpkit status --watch` (tools/watch.py) from the inside: a Kubernetes pod's lines read back
into figures (the trainer's progress line as train/metrics.Reporter prints it, the launcher's
goodput lines), and the block and the plain line drawn from figures. The terminal and the
pipe, with a real run, are tests/process/launch/test_observe_run.py's."""

from __future__ import annotations

from ddpkit.tools import watch
from ddpkit.tools.backends import JobState, JobStatus
from ddpkit.train.metrics import Reporter
from ddpkit.train.observe.figures import Figures


def _progress_line(tmp_path, capsys, ranks: list[float] | None) -> str:
    rep = Reporter(tmp_path, True, 200, "plain")
    rep.observers = []
    rep._since = (0.0, 0)  # an ETA is known
    rep.log({"step": 40, "loss": 1.25, "lr": 1e-3, "grad_norm": 0.5, "throughput": 2538.4,
             "throughput_unit": "samples/s", "step_time_s": 0.0126, "mem_bytes": 2**20},
            ranks)  # fmt: skip
    rep.close()
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    return line


def test_a_pods_lines_give_the_progress_the_goodput_and_the_failures(tmp_path, capsys):
    line = _progress_line(tmp_path, capsys, [0.0126, 0.031])
    assert "slowest rank 1 31.0ms" in line and " eta " in line, line
    log = "\n".join([
        "world: 4 ranks (2 nodes x 2 processes), backend gloo on cpu, DDP",
        line,
        "ddpkit: goodput 83%: 1 failure, 12 s lost",
        "ddpkit: failure: preempted on node-1 in attempt 0, 12 s lost, recovered",
    ])  # fmt: skip
    fig = watch.figures_of_log(log, "cut")
    assert (fig.step, fig.total_steps, fig.loss) == (40, 200, 1.25)
    assert fig.samples_per_s == 2538 and fig.eta_s is not None
    assert (fig.slowest_rank, fig.slowest_step_s) == (1, 0.031)
    assert fig.goodput == 0.83
    assert fig.last_failures == [{"text": "preempted on node-1 in attempt 0, 12 s lost, recovered"}]


def test_a_line_without_the_slowest_rank_and_eta_still_reads(tmp_path, capsys):
    line = _progress_line(tmp_path, capsys, None)
    fig = watch.figures_of_log(line, "one")
    assert fig.step == 40 and fig.slowest_rank is None


def test_the_block_and_the_plain_line():
    st = JobStatus("747", JobState.RUNNING, detail="run dir runs/x")
    fig = Figures(run="x", step=25, total_steps=100, eta_s=70, samples_per_s=1234.0, loss=0.5,
                  goodput=0.62, wall_s=80, step_time_s=0.0126, slowest_rank=3,
                  slowest_step_s=0.02, failures={"killed": 1}, failure_lost_s={"killed": 17.8},
                  last_failures=[{"kind": "killed", "rank": 1, "node": "n1", "lost_s": 17.8,
                                  "recovered": True, "attempt": 0}])  # fmt: skip
    block = watch.frame(st, fig, 100)
    assert block[0] == "job 747: running run dir runs/x"
    assert block[1].startswith("  [#######") and "25/100 steps  25%  ETA 1m10s" in block[1]
    assert "1,234 samples/s" in block[2] and "goodput so far 62% of 80 s" in block[2]
    assert "slowest rank 3 (20.0 ms own work)" in block[3] and "step 12.6 ms" in block[3]
    assert block[4] == "  failures: 1, 18 s lost"
    assert block[5] == "    killed rank 1 on n1 in attempt 0: 18 s lost, recovered"
    assert all(len(ln) <= 40 for ln in watch.frame(st, fig, 40))  # cut to the terminal
    line = watch.plain(st, fig)
    assert line == ("job 747: running run dir runs/x | step 25/100 | eta 1m10s | "
                    "1234 samples/s | goodput 62% | failures 1 | slowest rank 3")  # fmt: skip
    assert watch.frame(st, None, 100)[1].startswith("  (no figures")


def test_watch_goes_with_status_and_a_positive_every(tmp_path, monkeypatch):
    import pytest
    from ddpkit.tools import submit
    from ddpkit.tools.jobspec import SpecError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match=r"--watch goes with status \(ddpkit status local"):
        submit.run(["render", "local", "--watch"])
    with pytest.raises(SpecError, match="--every 0: give the seconds between looks"):
        submit.run(["status", "local", "--watch", "--every", "0"])

"""`ddpkit chaos` refuses a bad drill in one line, exit 2, before anything starts (issue 54 item
19): non-finite or negative times, negative or fractional targets, a target key of the wrong
kind, a rank or node the job does not have, an --attach to nothing or to a run that ended."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from ddpkit.tools import chaos
from ddpkit.tools.chaos import ChaosError, Injection
from ddpkit.train import goodput
from ddpkit.train.errors import run_cli


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kill-rank@time=nan", "seconds >= 0"),
        ("kill-rank@time=inf", "seconds >= 0"),
        ("kill-rank@time=1e400", "seconds >= 0"),
        ("kill-rank@time=-5", "seconds >= 0"),
        ("kill-rank@random=20-10", "A <= B"),
        ("kill-rank@random=5-nan", "seconds >= 0"),
        ("kill-rank@step=-5", "whole number >= 0"),
        ("kill-rank@step=2.5", "whole number >= 0"),
        ("kill-rank@step=40:rank=-1", "whole number >= 0"),
        ("kill-rank@step=40:node=1", "kill-rank takes :rank=N, not :node="),
        ("stop-rank@step=40:node=1", "stop-rank takes :rank=N, not :node="),
        ("kill-node@step=40:rank=0", "kill-node takes :node=N, not :rank="),
        ("preempt@step=40:rank=0", "preempt takes no target"),
    ],
)
def test_a_bad_value_is_refused_when_parsed(text, says):
    with pytest.raises(ChaosError, match=r".*") as e:
        Injection.parse(text, random.Random(0))
    assert says in str(e.value), str(e.value)


def test_a_target_the_job_does_not_have_is_refused_before_it_starts():
    Injection.parse("kill-rank@step=3:rank=3", random.Random(0)).check_against(nodes=2, world=4)
    with pytest.raises(ChaosError, match=r"rank=5: the job has 2 rank\(s\) \(rank 0\.\.1\)"):
        Injection.parse("kill-rank@step=3:rank=5", random.Random(0)).check_against(1, 2)
    with pytest.raises(ChaosError, match=r"node=2: the job has 2 node\(s\)"):
        Injection.parse("kill-node@step=3:node=2", random.Random(0)).check_against(2, 4)


def one_line(capfd, argv: list[str]) -> str:
    rc = run_cli(lambda: chaos.main(argv))
    out, err = capfd.readouterr()
    assert rc == 2 and not out, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_job_files_world_is_checked_before_the_job_starts(tmp_path, monkeypatch, capfd):
    (tmp_path / "ddpkit.toml").write_text(
        'name = "j"\nnproc_per_node = 2\naccelerator = "cpu"\nscript = "train.py"\n'
    )
    (tmp_path / "train.py").write_text("raise SystemExit('never run')\n")
    monkeypatch.chdir(tmp_path)
    line = one_line(capfd, ["--inject", "kill-rank@step=3:rank=5"])
    assert "rank=5: the job has 2 rank(s)" in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / ".ddpkit").exists()


def test_attach_to_nothing_or_to_an_ended_run_is_refused_at_once(tmp_path, capfd):
    line = one_line(capfd, ["--attach", str(tmp_path / "nope"), "--inject", "kill-rank@step=3"])
    assert "no such directory; attach once the job has started" in line
    run = tmp_path / "runs" / "done"
    goodput.record(run, "attempt", ranks=[0, 2])
    goodput.record(run, "done", step=10)
    line = one_line(capfd, ["--attach", str(run), "--inject", "kill-rank@step=3"])
    assert "its run ended at" in line and "needs a job that runs" in line
    Path(run).joinpath("x").touch()  # a run that has not ended is attached to (then waits)
    goodput.record(run, "attempt", ranks=[0, 2])
    chaos.check_attach(run)

"""The seam every backend shares (ddpkit.tools.backends): the one wait loop."""

from __future__ import annotations


def test_the_wait_loop_prints_on_a_state_change_not_every_poll(capsys):
    """WAIT=1 used to print an unchanged `job N: running` line (its run time ticking) every
    poll; now one line per state."""
    from ddpkit.tools.backends import Backend, JobState, JobStatus

    states = [JobState.PENDING, *[JobState.RUNNING] * 5, JobState.SUCCEEDED]
    polls = iter(
        JobStatus("7", s, 0 if s.terminal else None, f"RunTime=00:00:0{i}")
        for i, s in enumerate(states)
    )

    class Fake(Backend):
        name, file_ext = "fake", "txt"
        render = submit = logs = cancel = None  # type: ignore[assignment]

        def poll(self, job):
            return next(polls)

    Fake.__abstractmethods__ = frozenset()
    assert Fake().wait("7", poll_s=0) == 0
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split(":")[1].split()[0] for ln in lines] == ["pending", "running", "succeeded"]

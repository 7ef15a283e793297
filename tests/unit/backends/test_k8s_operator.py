"""The pods' launch script (k8s/launch.sh) alone, with a stand-in node launcher: what the
local cluster cannot show (a listener that comes late, a name that never resolves, the RDMA
memlock check on a machine without RDMA).

The operator emulation that ran the rendered pods as local processes with the environment
the controllers inject (tests/k8s_fakes.py) is gone: tests/engines/k8s/test_k8s_real.py trains
the same static PyTorchJob, TrainJob and elastic job on the real controllers.

Here the tests that run in this process; those that start processes in
tests/process/backends/test_k8s_operator.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.k8s import backend as k8s
from ddpkit.tools.jobspec import load_spec


def launch_script(tmp_path: Path, env: dict[str, str], wait_s: int = 30) -> tuple[int, str, list]:
    spec = load_spec(None, ["name=emu", "accelerator=cpu"], nodes=2)
    cmd, args = k8s.command(spec)
    args[1] = str(wait_s)
    fake = tmp_path / "bin" / "python"  # records the node launcher's command line
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    fake.chmod(0o755)
    out = tmp_path / "args.txt"
    out.unlink(missing_ok=True)
    base = {"PATH": f"{fake.parent}:/usr/bin:/bin", "ARGS_OUT": str(out)}
    p = subprocess.run(cmd + args, env=base | env, capture_output=True, text=True, timeout=60)
    got = out.read_text().splitlines() if out.exists() else []
    if got:
        assert got[:2] == ["-m", "ddpkit.train.node"]
        assert got[got.index("--") :][:3] == ["--", "-m", "ddpkit.train"]
        got = got[2:]
    return p.returncode, p.stderr, got


def test_launch_script_refuses_rdma_without_an_unlimited_memlock(tmp_path):
    """This machine's memlock limit is finite (and a non-root process cannot raise it): an
    RDMA job stops at once with the fix instead of NCCL failing to register memory."""
    import resource

    assert resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] != resource.RLIM_INFINITY
    env = {"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "1", "PET_NODE_RANK": "0"}
    rc, err, got = launch_script(tmp_path, env | {"DDPKIT_REQUIRE_MEMLOCK": "unlimited"}, wait_s=1)
    assert rc == 1 and not got
    assert "RDMA needs an unlimited locked-memory limit" in err and "LimitMEMLOCK=infinity" in err
    assert err.count("\n") == 1
    rc, err, got = launch_script(tmp_path, env, wait_s=1)  # no RDMA: no such check
    assert rc == 0 and got, err


def test_launch_script_passes_shellcheck():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    p = subprocess.run([str(shellcheck), str(k8s.LAUNCH_SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


# --- the pod's attempt (ddpkit.k8s.attempt): the budget on the claim, the operator's exit codes --


def test_a_pod_attempt_is_counted_on_the_claim_and_its_exit_read_by_exitcode(tmp_path):
    from ddpkit.k8s import attempt
    from ddpkit.train import goodput

    run = tmp_path / "run"
    assert attempt.run_dir_of(["--run-dir", str(run), "--max-restarts=3", "--", "x.py"]) == str(run)
    # One attempt number for the job: a pod whose replica is in the newest attempt already
    # (a recreated pod: a new uid) opens the next one, the others join it.
    assert [attempt.join_attempt(run, r, u) for r, u in (("node0", "a"), ("node1", "c"))] == [0, 0]
    assert attempt.join_attempt(run, "node1", "d") == 1  # node1's pod lost and recreated alone
    assert attempt.join_attempt(run, "node1", "d") == 1  # the same pod's container again
    assert attempt.newest_attempt(run) == 1 and not attempt.started_in(run, 1, "node0")
    assert attempt.join_attempt(run, "node0", "b") == 1  # node0's pod recreated: it joins
    assert attempt.join_attempt(run, "node0", "e") == 2 == attempt.newest_attempt(run)
    ok, restart = attempt.EXIT_OK, attempt.EXIT_RESTART_POD
    assert attempt.verdict(str(run), "k8s-0", 0, 0, 3) == (ok, "")
    assert attempt.verdict(str(run), "k8s-0", 2, 0, 3)[0] == 2  # bad input: the job fails
    assert attempt.verdict(str(run), "k8s-0", 75, 0, 3)[0] == restart >= 128  # saved on SIGTERM
    assert attempt.verdict(str(run), "k8s-0", 75, 3, 3)[0] == 1  # the budget is spent
    # a pod's SIGTERM without a save (its ranks between attempts) is no cancel on Kubernetes
    assert attempt.verdict(str(run), "k8s-0", 143, 0, 3) == (
        restart,
        "stopped by SIGTERM without a save: pod restart 1 of 3",
    )
    assert attempt.verdict(str(run), "k8s-0", 143, 3, 3)[0] == 1
    assert attempt.verdict(str(run), "k8s-0", 1, 0, 3)[0] == restart  # a killed worker
    code, line = attempt.verdict(str(run), "k8s-0", 1, 1, 1)
    assert code == 1 and "the pod restart limit (1) is reached: not restarted" in line
    with pytest.MonkeyPatch.context() as mp:  # the user's code raised in this attempt
        mp.setenv("DDPKIT_LAUNCH_ID", "k8s-0")
        goodput.record(run, "end", rank=1, code=1, cause="code")
    code, line = attempt.verdict(str(run), "k8s-0", 1, 0, 3)
    assert code == 1 and line == "rank 1 failed in its own code: not restarted"
    attempt.forget_attempts(run)
    assert attempt.join_attempt(run, "node0", "f") == 0  # the next job starts afresh

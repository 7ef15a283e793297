"""ddpkit.tools.doctor: the rules over fake machines, the CLI's fatal findings (bogus
NCCL_SOCKET_IFNAME, unreachable rendezvous port), and (slow) per-rank reports under torchrun
and under an srun-style launch.

Here the tests that start processes; the in-process ones in tests/unit/tools/test_doctor.py.
Helpers both use are in tests/unit/tools/test_doctor.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.tools.test_doctor import clean_env, doctor, free_port

ROOT = Path(__file__).resolve().parents[3]


def test_bogus_ifname_and_unreachable_port_are_both_fatal(tmp_path):
    port = free_port()
    env = clean_env(NCCL_SOCKET_IFNAME="bogus0")
    args = ["--rdzv-endpoint", f"127.0.0.1:{port}", "--connect-timeout", "1"]
    r = doctor(*args, "--ckpt-dir", str(tmp_path), env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert "FAIL  nccl-ifname" in out and "NCCL_SOCKET_IFNAME=bogus0" in out
    assert "FAIL  rdzv-connect" in out and f"127.0.0.1:{port}" in out
    assert out.count("fix:") >= 2
    r = doctor(*args, "--ckpt-dir", str(tmp_path), "--json", env=env)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    fails = {f["check"]: f for f in doc["ranks"][0]["findings"] if f["level"] == "fail"}
    assert set(fails) == {"nccl-ifname", "rdzv-connect"}
    assert all(f["fix"] for f in fails.values()) and doc["exit"] == 1


@pytest.mark.slow
def test_torchrun_two_ranks_one_report(tmp_path):
    torchrun = str(Path(sys.executable).parent / "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "ddpkit.tools.doctor"]
    r = subprocess.run(
        [*cmd, "--json", "--ckpt-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env(GLOO_SOCKET_IFNAME="no-such-if0"),
    )
    doc = json.loads(r.stdout)  # only rank 0 prints
    assert doc["launcher"] == "torchrun"
    assert sorted(rep["rank"] for rep in doc["ranks"]) == [0, 1]
    for rep in doc["ranks"]:  # each rank checked its own environment and reached rank 0
        checks = {f["check"]: f["level"] for f in rep["findings"]}
        assert checks["gloo-ifname"] == "fail" and checks["rdzv-connect"] == "ok"
    assert [c["check"] for c in doc["cross_node"]] == ["clock"]
    assert doc["exit"] == 1 and r.returncode != 0


@pytest.mark.slow
def test_srun_style_launch_rank0_listens(tmp_path):
    """Two tasks with SLURM's variables and no torchrun: rank 0 opens the endpoint's port,
    rank 1 connects to it, and rank 0 prints both ranks."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = clean_env(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank))
        env.update(SLURM_NNODES="1", SLURM_NTASKS_PER_NODE="2")
        cmd = [sys.executable, "-m", "ddpkit.tools.doctor", "--json", "--ckpt-dir", str(tmp_path)]
        cmd += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--connect-timeout", "30"]
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=180) for p in procs]
    doc = json.loads(outs[0][0])
    assert outs[1][0] == ""  # rank 1 stays quiet
    assert doc["launcher"] == "srun"
    assert sorted(rep["rank"] for rep in doc["ranks"]) == [0, 1]
    rank1 = next(rep for rep in doc["ranks"] if rep["rank"] == 1)
    assert {f["check"]: f["level"] for f in rank1["findings"]}["rdzv-connect"] == "ok"
    fails = [f for rep in doc["ranks"] for f in rep["findings"] if f["level"] == "fail"]
    assert doc["exit"] == (1 if fails else 0) == procs[0].returncode == procs[1].returncode

"""ddpkit.tools.doctor: the rules over fake machines, the CLI's fatal findings (bogus
NCCL_SOCKET_IFNAME, unreachable rendezvous port), and (slow) per-rank reports under torchrun
and under an srun-style launch.

Here the tests that run in this process; those that start processes in
tests/process/tools/test_doctor.py."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from ddpkit.tools.doctor.checks import (
    GiB,
    MiB,
    disk_finding,
    gpu_finding,
    limits_findings,
    shm_finding,
    skew_finding,
)
from ddpkit.tools.doctor.net import (
    ib_findings,
    ifname_findings,
    nccl_ifname_matches,
    parse_endpoint,
    rendezvous_findings,
)

from tests.trainrun import run_module

IFACES = {"lo": "unknown", "eth0": "up", "eth1": "down", "ib0": "up", "docker0": "up"}
NAMES = sorted(IFACES)


def levels(findings, check=None):
    return [f.level for f in findings if check is None or f.check == check]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_SOCKET_IFNAME")}
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    return {**env, **extra}


def test_nccl_ifname_syntax():
    assert nccl_ifname_matches("eth", NAMES) == ["eth0", "eth1"]
    assert nccl_ifname_matches("=eth", NAMES) == []  # '=' means exact names
    assert nccl_ifname_matches("=eth0,ib0", NAMES) == ["eth0", "ib0"]
    assert nccl_ifname_matches("^lo,docker", NAMES) == ["eth0", "eth1", "ib0"]
    assert nccl_ifname_matches("^=eth0", NAMES) == ["docker0", "eth1", "ib0", "lo"]


def test_ifname_findings():
    bogus = ifname_findings({"NCCL_SOCKET_IFNAME": "bogus0"}, IFACES, False)
    assert levels(bogus, "nccl-ifname") == ["fail"]
    assert "eth0 (up)" in bogus[0].message and "NCCL_SOCKET_IFNAME" in bogus[0].fix
    assert levels(ifname_findings({"NCCL_SOCKET_IFNAME": "eth"}, IFACES, True), "nccl-ifname") == [
        "ok"
    ]
    assert levels(ifname_findings({"NCCL_SOCKET_IFNAME": "=eth1"}, IFACES, False)) == ["fail"]
    assert levels(ifname_findings({"NCCL_SOCKET_IFNAME": "lo"}, IFACES, True)) == ["fail"]
    assert levels(ifname_findings({"NCCL_SOCKET_IFNAME": "lo"}, IFACES, False)) == ["ok"]
    gloo = ifname_findings({"GLOO_SOCKET_IFNAME": "eth0,wlan7"}, IFACES, False)
    assert levels(gloo) == ["fail"] and "wlan7" in gloo[0].message
    env = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}
    assert "warn" in levels(ifname_findings(env, IFACES, True), "nccl-env")


def test_shm_limits_disk_gpu_rules():
    assert shm_finding(64 * MiB, gpus=8).level == "fail"  # the container default
    assert shm_finding(64 * MiB, gpus=0).level == "warn"
    assert shm_finding(16 * GiB, gpus=8).level == "ok"
    assert shm_finding(None, gpus=0).level == "fail"
    assert "--ipc=host" in shm_finding(64 * MiB, gpus=8).fix
    unlimited = __import__("resource").RLIM_INFINITY
    assert levels(limits_findings(64 * 1024, 65536, ib=True, gpus=8), "memlock") == ["fail"]
    assert levels(limits_findings(unlimited, 65536, ib=True, gpus=8)) == ["ok", "ok"]
    assert levels(limits_findings(unlimited, 1024, ib=False, gpus=0), "nofile") == ["warn"]
    assert disk_finding(Path("/x"), 50 * GiB, True, need=80 * GiB).level == "fail"
    assert disk_finding(Path("/x"), 50 * GiB, False, need=None).level == "fail"
    assert disk_finding(Path("/x"), 5 * GiB, True, need=None).level == "warn"
    assert disk_finding(Path("/x"), 50 * GiB, True, need=None).level == "ok"
    over = gpu_finding(4, "0,1,2,3", local_rank=5, local_world=8)
    assert levels(over) == ["ok", "fail"] and over[1].scope == "rank"
    assert "--nproc-per-node 4" in over[1].fix
    assert levels(gpu_finding(2, "0,1,2,3", 0, 2)) == ["ok", "warn"]
    assert levels(gpu_finding(0, None, 0, 1)) == ["info"]


def test_infiniband_from_a_fake_sysfs(tmp_path):
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    assert levels(ib_findings(tmp_path, None, False)) == ["ok"]
    assert levels(ib_findings(tmp_path, "mlx5", False)) == ["ok"]
    assert levels(ib_findings(tmp_path, "mlx9_0", False)) == ["ok", "fail"]
    assert levels(ib_findings(tmp_path, None, True)) == ["ok", "warn"]
    (port / "state").write_text("1: DOWN\n")
    assert levels(ib_findings(tmp_path, None, False)) == ["warn"]
    assert levels(ib_findings(tmp_path / "none", "mlx5_0", False)) == ["fail"]
    assert levels(ib_findings(tmp_path / "none", None, False)) == ["info"]


def test_parse_endpoint():
    assert parse_endpoint("node1:29500") == ("node1", 29500)
    assert parse_endpoint("[::1]:29501") == ("::1", 29501)
    assert parse_endpoint("::1", 7) == ("::1", 7)
    assert parse_endpoint("head", 29400) == ("head", 29400)
    for bad in ("a:b:c", "host:port", ":29500"):
        with pytest.raises(ValueError):
            parse_endpoint(bad)


def test_rendezvous_connect_and_refuse():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        ok = rendezvous_findings("127.0.0.1", srv.getsockname()[1], 2.0, False)
    assert levels(ok) == ["ok", "ok"]
    refused = rendezvous_findings("127.0.0.1", free_port(), 0.5, False)
    assert levels(refused) == ["ok", "fail"] and "refused" in refused[1].message
    assert levels(rendezvous_findings("127.0.0.1", free_port(), 0.5, True)) == [
        "ok",
        "fail",
        "fail",
    ]
    unresolved = rendezvous_findings("no-such-host.invalid", 29500, 0.5, False)
    assert levels(unresolved) == ["fail"] and unresolved[0].check == "rdzv-resolve"


def test_clock_skew():
    assert skew_finding({"a": 100.0}).level == "info"
    assert skew_finding({"a": 100.0, "b": 100.004}).level == "ok"
    far = skew_finding({"a": 100.0, "b": 103.0})
    assert far.level == "warn" and "b" in far.message and far.fix


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("ddpkit.tools.doctor", *args, env=env or clean_env())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rdzv-endpoint", "a:b:c"], "HOST:PORT"),
        (["--config", "no/such.toml"], "no such file"),
        (["--connect-timeout", "0"], "--connect-timeout"),
    ],
)
def test_bad_input_one_line_exit_2(args, needle):
    r = doctor(*args)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""

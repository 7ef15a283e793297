"""The torch-free parts of torchft replica groups: the environment contract and each group's
node launcher command (train/ft_env.py, train/launch/replica_groups.py)."""

from __future__ import annotations

import json
import threading
import time

import ddpkit.train.launch.replica_groups as rg
import pytest
from ddpkit.train.ft_env import ReplicaGroup
from ddpkit.train.launch.replica_groups import Supervisor, build_parser, group_argv

NODE = ["py", "-m", "ddpkit.train.node", "--run-dir", "runs/x", "--standalone", "--"]


def test_the_environment_round_trips_and_is_absent_without_a_lighthouse():
    g = ReplicaGroup(1, 3, "http://head:29510")
    assert ReplicaGroup.from_env(g.env()) == g
    assert ReplicaGroup.from_env({"REPLICA_GROUP_ID": "1"}) is None


@pytest.mark.parametrize("gid, n", [("2", "2"), ("-1", "2"), ("x", "2"), ("0", "")])
def test_a_group_id_outside_the_groups_is_named(gid, n):
    env = {"TORCHFT_LIGHTHOUSE": "http://h:1", "REPLICA_GROUP_ID": gid, "NUM_REPLICA_GROUPS": n}
    with pytest.raises(ValueError, match="REPLICA_GROUP_ID"):
        ReplicaGroup.from_env(env)


def _launcher_run_dir(argv: list[str]) -> str:
    """The run dir the node launcher itself takes from its flags (its own parser)."""
    from ddpkit.train.launch.flags import parse_flags, split_argv

    flags, entry = split_argv(argv[argv.index("ddpkit.train.node") + 1 :])
    return parse_flags(flags, entry)[0].run_dir


@pytest.mark.parametrize("job_flag", [["--run-dir", "runs/x"], ["--run-dir=runs/x"], []])
def test_the_kits_trainer_gets_the_groups_own_run_and_checkpoint_dirs(job_flag):
    node = ["py", "-m", "ddpkit.train.node", *job_flag, "--standalone", "--"]
    argv = group_argv([*node, "-m", "ddpkit.train", "--run-dir", "runs/x"], 1, "runs/x", "ck")
    # the launcher's own run dir is the group's: the job's went (a later --run-dir wins in
    # argparse, and every group's launcher wrote its goodput into the job's dir)
    assert _launcher_run_dir(argv) == "runs/x/group-1"
    assert argv[argv.index("ddpkit.train.node") + 1 : argv.index("--")] == [
        "--run-dir", "runs/x/group-1", "--standalone"
    ]  # fmt: skip
    assert argv[-4:] == ["--run-dir", "runs/x/group-1", "--ckpt-dir", "ck/group-1"]


def test_a_users_script_gets_only_the_node_launchers_run_dir():
    argv = group_argv([*NODE, "train.py", "--steps", "5"], 0, "runs/x", None)
    assert _launcher_run_dir(argv) == "runs/x/group-0"
    assert argv[-3:] == ["train.py", "--steps", "5"]


def _supervisor(run_dir, monkeypatch, launch: str | None, node_rank: int = 0):
    if launch is None:
        monkeypatch.delenv("DDPKIT_LAUNCH_ID", raising=False)
    else:
        monkeypatch.setenv("DDPKIT_LAUNCH_ID", launch)
    args = build_parser().parse_args(["--groups", "2", "--nodes", "2", "--run-dir", str(run_dir)])
    return Supervisor(args, [*NODE, "train.py"], node_rank)


def _peer_status(run_dir, launch: str | None, running: bool, stamp: float | None = None):
    body = {
        "launch_id": launch, "time": time.time() if stamp is None else stamp, "node": 1,
        "finished": False, "groups": [{"group": 1, "running": running}],
    }  # fmt: skip
    (run_dir / "replica_groups.node-1.json").write_text(json.dumps(body))


def test_a_node_reads_only_this_launchs_status_of_the_other_nodes(tmp_path, monkeypatch):
    sup = _supervisor(tmp_path, monkeypatch, "ddpkit-7-1")
    assert sup.peers() == []  # no file: nothing known
    _peer_status(tmp_path, "ddpkit-7-0", running=True)  # the attempt before the requeue
    assert sup.peers() == []
    _peer_status(tmp_path, "ddpkit-7-1", running=True)
    assert [p["node"] for p in sup.peers()] == [1]
    # without a launch id (a Kubernetes pod): written since this supervisor started
    sup = _supervisor(tmp_path, monkeypatch, None)
    _peer_status(tmp_path, None, running=True, stamp=sup.since - 5)
    assert sup.peers() == []
    _peer_status(tmp_path, None, running=True)
    assert len(sup.peers()) == 1


def test_a_finished_node_stays_until_the_other_nodes_groups_ended(tmp_path, monkeypatch):
    monkeypatch.setattr(rg, "PEER_POLL_S", 0.05)
    sup = _supervisor(tmp_path, monkeypatch, "ddpkit-7-0")
    _peer_status(tmp_path, "ddpkit-7-0", running=True)
    ended = threading.Timer(0.5, _peer_status, (tmp_path, "ddpkit-7-0", False))
    ended.start()
    t0 = time.monotonic()
    sup.await_peers()
    assert time.monotonic() - t0 >= 0.5  # left once node 1's group had ended, not before
    ended.join()
    # a node that never says so is waited for PEER_END_WAIT_S, then left (srun's --wait next)
    monkeypatch.setattr(rg, "PEER_END_WAIT_S", 0.3)
    _peer_status(tmp_path, "ddpkit-7-0", running=True)
    t0 = time.monotonic()
    sup.await_peers()
    assert 0.3 <= time.monotonic() - t0 < 5

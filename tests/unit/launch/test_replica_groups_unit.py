"""The torch-free parts of torchft replica groups: the environment contract and the
supervisor's view of the other nodes (train/ft_env.py, train/launch/replica_groups.py); each
group's dirs: test_group_dirs.py.

The tests of this file that start processes or take longer:
tests/process/launch/test_replica_groups_unit.py."""

from __future__ import annotations

import json
import time

import pytest
from ddpkit.train.ft_env import ReplicaGroup
from ddpkit.train.launch.replica_groups import Supervisor, build_parser

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

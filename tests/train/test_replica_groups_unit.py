"""The torch-free parts of torchft replica groups: the environment contract and each group's
node launcher command (train/ft_env.py, train/replica_groups.py)."""

from __future__ import annotations

import pytest
from ddpkit.train.ft_env import ReplicaGroup
from ddpkit.train.replica_groups import group_argv

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


def test_the_kits_trainer_gets_the_groups_own_run_and_checkpoint_dirs():
    argv = group_argv([*NODE, "-m", "ddpkit.train", "--run-dir", "runs/x"], 1, "runs/x", "ck")
    # the node launcher's flag right after its module (a later --run-dir wins in argparse)
    assert argv[3:5] == ["--run-dir", "runs/x/group-1"]
    assert argv[-4:] == ["--run-dir", "runs/x/group-1", "--ckpt-dir", "ck/group-1"]


def test_a_users_script_gets_only_the_node_launchers_run_dir():
    argv = group_argv([*NODE, "train.py", "--steps", "5"], 0, "runs/x", None)
    assert argv[3:5] == ["--run-dir", "runs/x/group-0"]
    assert argv[-3:] == ["train.py", "--steps", "5"]

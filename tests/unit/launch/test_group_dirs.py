"""A torchft replica group's own dirs travel in the environment, not in its command line:
the supervisor starts every group with the one command it was given, as given, and names the
group's run and checkpoint dirs in the contract's DDPKIT_RUN_DIR / DDPKIT_CKPT_DIR, which the
node launcher and the trainer take over the job's --run-dir / --ckpt-dir
(train/ft_env.py group_dirs, train/launch/replica_groups.py, train/config.py)."""

from __future__ import annotations

import subprocess

import ddpkit.train.launch.replica_groups as rg
import pytest
from ddpkit.train.config import parse_config
from ddpkit.train.ft_env import ReplicaGroup, group_dirs

NODE = ["py", "-m", "ddpkit.train.node", "--run-dir", "runs/x", "--standalone", "--"]
TRAINER = [*NODE, "-m", "ddpkit.train", "--run-dir", "runs/x", "--ckpt-dir", "s3://b/ck"]


class _Proc:
    pid, stdout = 4242, None

    def poll(self):
        return None


class _Thread:  # the group's output relay: no output here
    def __init__(self, **_kw):
        pass

    def start(self):
        pass


def _started(monkeypatch, tmp_path, sup_flags: list[str], node_argv: list[str], group: int):
    """(argv, env) the supervisor starts group `group` with (no process is started)."""
    seen = {}

    def popen(argv, env, **_kw):
        seen.update(argv=argv, env=env)
        return _Proc()

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(rg.threading, "Thread", _Thread)
    args = rg.build_parser().parse_args(["--groups", "2", "--run-dir", str(tmp_path), *sup_flags])
    sup = rg.Supervisor(args, node_argv)
    sup.address = "http://h:1"
    sup.start(group)
    return seen["argv"], seen["env"]


def test_a_group_runs_the_command_it_was_given_with_its_dirs_in_the_environment(
    monkeypatch, tmp_path
):
    argv, env = _started(monkeypatch, tmp_path, ["--ckpt-dir", "s3://b/ck"], TRAINER, 1)
    assert argv == TRAINER  # as given: no flag dropped, none added
    assert env["DDPKIT_RUN_DIR"] == f"{tmp_path}/group-1"
    assert env["DDPKIT_CKPT_DIR"] == "s3://b/ck/group-1"  # a store's URL stays one
    assert ReplicaGroup.from_env(env) == ReplicaGroup(1, 2, "http://h:1")
    assert group_dirs(env) == (f"{tmp_path}/group-1", "s3://b/ck/group-1")


def test_without_a_checkpoint_dir_a_groups_is_below_its_run_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("DDPKIT_CKPT_DIR", "ck-of-the-job")  # the job's, inherited: not the group's
    _, env = _started(monkeypatch, tmp_path, [], [*NODE, "train.py"], 0)
    assert env["DDPKIT_CKPT_DIR"] == f"{tmp_path}/group-0/checkpoints"


def test_outside_a_replica_group_there_are_no_group_dirs():
    assert group_dirs({"DDPKIT_RUN_DIR": "runs/x"}) is None  # a plain launch
    assert group_dirs({"TORCHFT_LIGHTHOUSE": "http://h:1", "DDPKIT_RUN_DIR": "r"}) is None
    env = {"TORCHFT_LIGHTHOUSE": "http://h:1", "REPLICA_GROUP_ID": "0", "DDPKIT_RUN_DIR": "r/g"}
    assert group_dirs(env) == ("r/g", "r/g/checkpoints")


def test_the_trainer_in_a_group_takes_its_groups_dirs_over_the_jobs_flags(monkeypatch):
    flags = ["--run-dir", "runs/x", "--ckpt-dir", "s3://b/ck", "--steps", "3"]
    cfg, _ = parse_config(flags, world=(1, 1), installed=False)
    assert (cfg.run_dir, cfg.ckpt_dir) == ("runs/x", "s3://b/ck")  # no group: the flags
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://h:1")
    monkeypatch.setenv("REPLICA_GROUP_ID", "1")
    monkeypatch.setenv("NUM_REPLICA_GROUPS", "2")
    monkeypatch.setenv("DDPKIT_RUN_DIR", "runs/x/group-1")
    monkeypatch.setenv("DDPKIT_CKPT_DIR", "s3://b/ck/group-1")
    cfg, _ = parse_config(flags, world=(1, 1), installed=False)
    assert (cfg.run_dir, cfg.ckpt_dir) == ("runs/x/group-1", "s3://b/ck/group-1")


@pytest.mark.parametrize("flags, env, rank", [
    ([], {"DDPKIT_NODE_NUMBER": "1"}, 1),  # the contract's name, which every engine binds
    (["--node-rank-env", "MY_RANK"], {"MY_RANK": "1", "DDPKIT_NODE_NUMBER": "0"}, 1),
])  # fmt: skip
def test_a_nodes_rank_is_the_contracts_node_number_unless_named(monkeypatch, flags, env, rank):
    monkeypatch.delenv("SLURM_NODEID", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ranks = []
    monkeypatch.setattr(rg.Supervisor, "run", lambda self: ranks.append(self.node_rank) or 0)
    argv = ["--groups", "2", "--nodes", "2", "--run-dir", "runs/x", *flags, "--", *NODE]
    assert rg.main(argv) == 0 and ranks == [rank]

"""The torch-free parts of torchft replica groups: the environment contract and the
supervisor's view of the other nodes (train/ft_env.py, train/launch/replica_groups.py); each
group's dirs: test_group_dirs.py.

Here the tests that start processes or take longer; the in-process ones in
tests/unit/launch/test_replica_groups_unit.py."""

from __future__ import annotations

import threading
import time

import ddpkit.train.launch.replica_groups as rg

from tests.unit.launch.test_replica_groups_unit import _peer_status, _supervisor


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

"""Replica groups' identity in the environment: the torch-free contract between the launcher
(train/replica_groups.py, which starts the lighthouse and the groups) and what runs in a
group (the kit's trainer through train/ft.py, or a user's script using torchft directly).

    TORCHFT_LIGHTHOUSE   the lighthouse's address, http://HOST:PORT (torchft's own name: its
                         Manager reads it when no address is passed)
    REPLICA_GROUP_ID     this group's number, 0 .. NUM_REPLICA_GROUPS-1
    NUM_REPLICA_GROUPS   how many groups the job has (the data is split for all of them)
    DDPKIT_RUN_DIR       the group's own run dir, <the job's>/group-<g>, and
    DDPKIT_CKPT_DIR      its checkpoint dir, <the job's>/group-<g> (group_dirs)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ddpkit.train.contract import CKPT_DIR_ENV, RUN_DIR_ENV, ckpt_join, default_ckpt_dir

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
GROUP_ID_ENV = "REPLICA_GROUP_ID"
NUM_GROUPS_ENV = "NUM_REPLICA_GROUPS"
# Seconds a survivor waits for a quorum (torchft's Manager reads this name itself).
QUORUM_TIMEOUT_ENV = "TORCHFT_QUORUM_TIMEOUT_SEC"


@dataclass(frozen=True)
class ReplicaGroup:
    group: int
    groups: int
    lighthouse: str

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ReplicaGroup | None:
        """This process's group, or None when it runs without torchft (no lighthouse set)."""
        env = os.environ if env is None else env
        lighthouse = env.get(LIGHTHOUSE_ENV)
        if not lighthouse:
            return None
        try:
            group, groups = int(env.get(GROUP_ID_ENV, "")), int(env.get(NUM_GROUPS_ENV, ""))
        except ValueError:
            group = groups = -1
        if not 0 <= group < groups:
            raise ValueError(
                f"{LIGHTHOUSE_ENV} is set, so {GROUP_ID_ENV} and {NUM_GROUPS_ENV} must be whole "
                f"numbers with 0 <= {GROUP_ID_ENV} < {NUM_GROUPS_ENV}; got "
                f"{env.get(GROUP_ID_ENV)!r} and {env.get(NUM_GROUPS_ENV)!r}"
            )
        return cls(group, groups, lighthouse)

    def env(self) -> dict[str, str]:
        return {
            LIGHTHOUSE_ENV: self.lighthouse,
            GROUP_ID_ENV: str(self.group),
            NUM_GROUPS_ENV: str(self.groups),
        }


def group_dir(base: str, group: int) -> str:
    """A group's dir below the job's: <base>/group-<g> (a store's URL stays one, not s3:/)."""
    return ckpt_join(base, f"group-{group}")


def group_dirs(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """A replica group's own (run dir, checkpoint dir), as its supervisor names them in the
    contract's DDPKIT_RUN_DIR and DDPKIT_CKPT_DIR; None outside a group. In a group they win
    over --run-dir / --ckpt-dir: one command line (the job's, with the job's dirs) starts every
    group, so the environment, where the group's identity travels too, is the one place that
    differs per group, and the node launcher and the trainer both read it here."""
    env = os.environ if env is None else env
    if not (env.get(LIGHTHOUSE_ENV) and env.get(GROUP_ID_ENV) and env.get(RUN_DIR_ENV)):
        return None
    run_dir = env[RUN_DIR_ENV]
    return run_dir, env.get(CKPT_DIR_ENV) or default_ckpt_dir(run_dir)

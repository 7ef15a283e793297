"""The command every node runs, built once for every engine from the job spec.

    node_command(spec, rendezvous, python=..., ...)  ->
        python -m ddpkit.train.node --run-dir R --shutdown-timeout S [RENDEZVOUS]
            --max-restarts=N -- ENTRY                                  (the node launcher)
        python -m ddpkit.train.replica_groups --groups G [--nodes N ...] --run-dir R
            [--ckpt-dir C] -- python -m ddpkit.train.node ... --standalone ... -- ENTRY
                                               (fault_tolerance = torchft: the supervisor)

An engine passes only what it decides (its rendezvous, its interpreter, its knobs: a restart
budget of its own, where a node finds its rank, whether the lighthouse runs elsewhere);
everything else is the job's. The result is final: no engine edits it. A torchft group's dirs
are not in it: the supervisor hands each group its own in the environment (train/ft_env.py
group_dirs), so every group runs this one command line as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from ddpkit.tools.jobspec.schema import JobSpec
from ddpkit.train.dataclass_fields import flag_args

# The module names rendered scripts start (kept as starters in train/, so a job queued before
# an upgrade still starts).
NODE_LAUNCHER = "ddpkit.train.node"
SUPERVISOR = "ddpkit.train.replica_groups"


def standalone(nproc: int) -> list[str]:
    """torchrun's rendezvous of one node on its own: a local job, a torchft replica group."""
    return ["--standalone", f"--nproc-per-node={nproc}"]


def node_command(
    spec: JobSpec,
    rendezvous: Sequence[str] = (),
    *,
    python: str = "python",
    bare: bool = False,
    nproc: int | None = None,
    max_restarts: int | None = None,
    nodes: int | None = None,
    node_rank_env: str | None = None,
    lighthouse: bool = True,
) -> list[str]:
    """The node launcher's command line, or with fault_tolerance = torchft the replica-group
    supervisor's around one group's node launcher.

    rendezvous     torchrun's rendezvous flags across the job's nodes ([] where the engine
                   sets torchrun's PET_* variables); a torchft group rendezvous on its own
                   (standalone), so there it is not used
    python         the nodes' interpreter
    bare           the arguments alone, without `python -m MODULE`: the engine's own script
                   names the program (k8s/launch.sh, the image's entrypoint)
    nproc          processes per node (a torchft group's); default: the job's
    max_restarts   torchrun's in-place budget; default: the job's (restart_budget)
    nodes          torchft: one supervisor per node, each runs its share of the groups
    node_rank_env  torchft across nodes: the variable that holds this node's rank (default:
                   the supervisor's, the contract's DDPKIT_NODE_NUMBER)
    lighthouse     torchft: False where the lighthouse runs elsewhere (Kubernetes: its pod)
    """
    budget = spec.restart_budget if max_restarts is None else max_restarts
    if spec.fault_tolerance != "torchft":
        return _program(python, NODE_LAUNCHER, bare) + _launcher_args(spec, rendezvous, budget)
    group = standalone(spec.nproc_per_node if nproc is None else nproc)
    ckpt = spec.explicit_ckpt_dir
    return [
        *_program(python, SUPERVISOR, bare),
        "--groups", str(spec.groups),
        *(["--nodes", str(nodes)] if nodes is not None else []),
        *(["--node-rank-env", node_rank_env] if node_rank_env else []),
        *([] if lighthouse else ["--no-lighthouse"]),
        "--run-dir", spec.run_dir,
        *(["--ckpt-dir", ckpt] if ckpt else []),
        "--", python, "-m", NODE_LAUNCHER, *_launcher_args(spec, group, budget),
    ]  # fmt: skip


def _program(python: str, module: str, bare: bool) -> list[str]:
    return [] if bare else [python, "-m", module]


def _launcher_args(spec: JobSpec, rendezvous: Sequence[str], max_restarts: int) -> list[str]:
    """The node launcher's flags (train/launch/flags.py) and the entry point after `--`."""
    return [
        *flag_args("--run-dir", spec.run_dir),
        "--shutdown-timeout", str(spec.shutdown_budget_s),
        *spec.collective_timeout_flag(),
        *rendezvous,
        f"--max-restarts={max_restarts}",
        "--", *spec.entry_argv(),
    ]  # fmt: skip

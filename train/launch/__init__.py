"""The node launcher: one process per node, torchrun inside it, one exit status out.

    node.py            `python -m ddpkit.train.node`: flags -> torchrun -> the outcome
    flags.py           its command line (its own flags, then torchrun's)
    hooks.py           every patch of torchrun's private API (what a torch upgrade re-checks)
    outcome.py         the workers' ends -> one exit status and one line
    verdicts.py        past a launch: requeue or stop, and which nodes to leave out
    entry.py           the workers' side of a user's script or module
    replica_groups.py  torchft: one torchrun per replica group, restarted as it dies
    lighthouse.py      torchft's lighthouse, without importing torch

The failure vocabulary all of them speak is ddpkit.train.failure; the names every party of a
launch shares (exit codes, files, environment) are ddpkit.train.contract. The commands keep
their names from before this package (ddpkit.train.node, .replica_groups, .failclass,
.lighthouse: small modules in train/ that start these), as rendered scripts name them.
"""

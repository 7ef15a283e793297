"""The doctor: can this node (or, under torchrun/srun, every node) run a distributed job.
One command, `ddpkit doctor` (under torchrun on every rank: `torchrun ... -m ddpkit.tools.doctor`).

Each module imports only those listed before it:

    checks   the node's checks (versions, GPUs, /dev/shm, limits, disk, clock skew): Findings
    net      the network checks (socket interfaces, InfiniBand, hostname, rendezvous)
    cli      the command: each rank's findings gathered into one report, and its exit status
"""

"""ddpkit: one PyTorch data-parallel job, run the same way here, in a container, on SLURM
and on Kubernetes. The `ddpkit` command is ddpkit.cli; the trainer is ddpkit.train (also a
library: `from ddpkit.train import fit`); the launcher and tools are ddpkit.tools."""

__version__ = "0.1.0"

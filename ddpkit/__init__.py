"""ddpkit: one PyTorch data-parallel job, run the same way here, in a container, on SLURM
and on Kubernetes. The `ddpkit` command is ddpkit.cli; the trainer is ddpkit.train (also a
library: `from ddpkit.train import fit`); the launcher and tools are ddpkit.tools.

Where each package lives in the checkout (pyproject's package-dir; ddpkit.X.y is X/y):

    ddpkit          ddpkit/    the command (cli.py)
    ddpkit.train    train/     the trainer, the node launcher, the launch contract
    ddpkit.tools    tools/     the launcher (spec/, backends/, launch.py) and the tools:
                               planner/ (ddpkit memory), doctor/, ckpt, commbench, plot
    ddpkit.slurm    slurm/     the SLURM engine: backend, options, render, templates
    ddpkit.k8s      k8s/       the Kubernetes engine: backend, options, manifests, pod script
    ddpkit.docker   docker/    the Docker engine: backend, options, Dockerfile, entrypoint
    ddpkit.configs  configs/   the example job files
"""

__version__ = "0.1.0"

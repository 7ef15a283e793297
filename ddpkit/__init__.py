"""ddpkit: one PyTorch data-parallel job, run the same way here, in a container, on SLURM
and on Kubernetes. The `ddpkit` command is ddpkit.cli; the trainer is ddpkit.train (also a
library: `from ddpkit.train import fit`); the launcher and tools are ddpkit.tools.

Where each package lives (pyproject.toml's package-dir maps a folder to its dotted name, so
`ddpkit.X.y` is the file X/y.py of the checkout, its folders as they are):

    ddpkit                  ddpkit/     the `ddpkit` command (cli.py)
    ddpkit.train            train/      the trainer, the contract (contract.py), the failure
                                        vocabulary (failure.py), goodput (goodput/), and:
    ddpkit.train.launch     train/launch/    the node launcher every engine runs (node.py)
    ddpkit.tools            tools/      the tools (planner/: ddpkit memory and steptime;
                                        doctor/; ckpt, commbench, plot, ...) and:
    ddpkit.tools.jobspec    tools/jobspec/   the job file: JobSpec, loading, --set, validation
    ddpkit.tools.submit     tools/submit.py  render / submit / status / logs / cancel / list
    ddpkit.tools.backends   tools/backends/  what every engine shares: the Backend interface
                                             and wait loop, registry.py (the engines by name),
                                             job records, the local backend, container rules
                                             and code shipping (containers.py, user_image.py)
    ddpkit.slurm            slurm/      the SLURM engine: backend, options ([slurm]), render,
                                        cluster (sbatch, submitit), the sbatch templates (*.j2)
    ddpkit.k8s              k8s/        the Kubernetes engine: backend, options ([k8s]), render,
                                        checks, crds, api (the client), launch.sh (the pods')
    ddpkit.docker           docker/     the Docker engine: backend, options ([docker]), render,
                                        image, run; the Dockerfile, its entrypoint and nproc.py
    ddpkit.configs          configs/    the example job files

An engine is one package: `backend.py` (its Backend), `options.py` (its job-file table, its
defaults and rules), `render.py` (pure: spec -> what `render` prints), the side effects in
modules of their own, beside its templates or scripts; plus one line in
tools/backends/registry.py. slurm/local/ and k8s/local/ start the real engines for the tests.
"""

__version__ = "0.1.0"

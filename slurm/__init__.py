"""ddpkit.slurm: the SLURM engine: backend.py (SlurmBackend), options.py ([slurm]), render.py
(pure: the sbatch script and parameters), cluster.py (sbatch, submitit, sinfo, scontrol), the
sbatch templates (*.j2) they fill, and local/, the scripts of the local test cluster."""

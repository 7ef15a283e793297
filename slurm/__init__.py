"""ddpkit.slurm: the SLURM engine: backend.py (SlurmBackend), options.py ([slurm]), render.py
(pure: the sbatch script and parameters), cluster.py (sbatch, submitit, sinfo, scontrol), step.py
(where an srun task is, for `srun ddpkit doctor`), the sbatch templates (*.j2) they fill, and
local/, the scripts of the local test cluster."""

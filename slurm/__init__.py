"""ddpkit.slurm: the sbatch templates (*.j2) and the scripts of the local test cluster."""

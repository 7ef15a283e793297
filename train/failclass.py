"""`python -m ddpkit.train.failclass RUN_DIR LAUNCH_ID RC RESTARTS LIMIT`: the SLURM batch shell's
question after a job step (requeue, or stop), under the name its rendered script uses (kept for
jobs already queued); the verdict is ddpkit.train.launch.verdicts'."""

import sys

if __name__ == "__main__":
    from ddpkit.train.launch.verdicts import main

    sys.exit(main(sys.argv[1:]))

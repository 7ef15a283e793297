"""`python -m ddpkit.train.replica_groups`: the torchft replica-group supervisor's command, under the
name the engines render (kept for jobs already queued); the supervisor is
ddpkit.train.launch.replica_groups."""

import sys

if __name__ == "__main__":
    from ddpkit.train.launch.replica_groups import main

    sys.exit(main())

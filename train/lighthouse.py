"""`python -m ddpkit.train.lighthouse`: torchft's lighthouse without torch, under the name the
Kubernetes lighthouse pod renders (kept for jobs already queued); ddpkit.train.launch.lighthouse."""

import sys

if __name__ == "__main__":
    from ddpkit.train.launch.lighthouse import main

    sys.exit(main())

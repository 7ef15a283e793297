"""`python -m ddpkit.train.node`: the node launcher's command, under the name every engine renders
into its scripts and manifests. The name stays, so a job queued before an upgrade of the kit still
starts (its rendered script is already in the queue); the launcher is ddpkit.train.launch.node."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--run-entry"]:  # the worker command of earlier releases
        from ddpkit.train.launch.entry import run_entry

        sys.exit(run_entry(sys.argv[2:]))
    from ddpkit.train.errors import run_cli
    from ddpkit.train.launch.node import main

    sys.exit(run_cli(main))

"""The node agent's entry point (up.sh starts it): the code is the nodeagent package beside
this file (see nodeagent/__init__.py).

usage: python k8s/local/node_agent.py --kubeconfig K [--nodes 2] [--gpus 8] [--state DIR]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nodeagent.cli import main  # noqa: E402  (after the path it is found on)

if __name__ == "__main__":
    main()

"""The planner as a module (`-m ddpkit.tools.planner`): the same as `ddpkit memory`."""

import sys

from ddpkit.tools.planner.cli import main

sys.exit(main())

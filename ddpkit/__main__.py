"""`python -m ddpkit ...` is the `ddpkit` command (for environments without its script)."""

import sys

from ddpkit.cli import main

sys.exit(main())

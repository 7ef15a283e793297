"""`python -m ddpkit.tools.doctor` (also under torchrun): the same as `ddpkit doctor`."""

import sys

from ddpkit.tools.doctor.cli import main

sys.exit(main())

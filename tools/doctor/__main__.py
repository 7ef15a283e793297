"""The doctor as a module (`torchrun ... -m ddpkit.tools.doctor` on every rank): the same as
`ddpkit doctor`."""

import sys

from ddpkit.tools.doctor.cli import main

sys.exit(main())

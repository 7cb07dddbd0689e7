"""`python -m transport.sim ...`: the simulator's command line (transport.sim.cli)."""

import sys

from transport.sim.cli import main

sys.exit(main())

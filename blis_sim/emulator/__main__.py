import sys

from blis_sim.emulator.cli import main

sys.exit(main())

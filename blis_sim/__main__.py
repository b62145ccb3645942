import sys

from blis_sim.cli import main

sys.exit(main())

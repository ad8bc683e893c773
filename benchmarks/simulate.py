"""Cluster-scale evaluation: days of DLRM jobs under each policy, on one trace (``sim.cli``).

    python benchmarks/simulate.py --jobs 1000 --days 7 --seed 1 --policies user,dlrover,ours,oracle --out DIR
"""

import sys

from sim.cli import main

if __name__ == "__main__":
    sys.exit(main())

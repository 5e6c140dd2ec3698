"""Spot-cost simulator: the budget policy vs naive spot (with and without the warning) vs Uniform Progress.

    python benchmarks/spot_cost.py [TRACE_DIR] [--jobs 200] [--tune-jobs 300] [--seed 0 | --seeds A-B]
                                   [--inputs measured|dag] [--scenario NAME]
    python benchmarks/spot_cost.py --quick      # every scenario, 8 jobs per size: a check that it runs

The simulator is the package ``benchmarks/spotsim`` (its docstring says what it simulates and how); this
script runs it, and ``import spot_cost`` (with benchmarks/ on ``sys.path``) gives its names as before.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spotsim import *  # noqa: E402, F403 - the simulator's names, as spot_cost's
from spotsim import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())

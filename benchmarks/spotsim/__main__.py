"""``python -m spotsim`` from benchmarks/: the same as ``python benchmarks/spot_cost.py``."""

from spotsim import main

raise SystemExit(main())

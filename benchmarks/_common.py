"""What the benchmark scripts share: the repository on ``sys.path``, and helpers of more than one script.

Not a script (``make bench-smoke`` runs the scripts that use it). A script puts its own folder on
``sys.path`` (Python does when it runs it) and imports this before the provider's or the trainer's modules.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

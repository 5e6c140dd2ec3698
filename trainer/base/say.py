"""Lines to stderr, each in one write.

A node's ranks and its agent share one log. ``print(..., file=sys.stderr)`` writes the text and its newline
in two writes, so a line of one rank could land in the middle of another's (``... gloo[trainer] rank 0/2
...``). ``say`` writes the line and its newline at once: a write of a few KiB to a pipe or an appended
file is not split. Stdlib only.
"""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """Write ``message`` and a newline to stderr in one write, and flush."""
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()

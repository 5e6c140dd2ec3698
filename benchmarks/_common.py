"""What the benchmark scripts share: the repository on ``sys.path``, and helpers of more than one script.

A trainer run's events are read as data, never scraped from its stdout: ``events_env`` gives the run an
events directory of its own (``$DTRAIN_EVENTS_DIR``, where rank 0 appends one JSON line per event), and
``trainer.events`` (``read_events``, ``EventCursor``) reads it.

Not a script (``make bench-smoke`` runs the scripts that use it). A script puts its own folder on
``sys.path`` (Python does when it runs it) and imports this before the provider's or the trainer's modules.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from trainer.events import EVENTS_DIR_ENV  # noqa: E402 - the repository is on sys.path from here on


def launch_command(nproc: int, *args: str) -> list[str]:
    """``python -m trainer.launch --standalone --nproc-per-node N ARGS...``: torchrun with the trainer's
    exit codes, on this machine (the launcher a local-backend node runs)."""
    return [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", str(nproc), *args]


def trainer_command(nproc: int, *args: str) -> list[str]:
    """The trainer (``-m trainer ARGS...``) on ``nproc`` local ranks, under ``launch_command``."""
    return launch_command(nproc, "-m", "trainer", *args)


def events_env(env: dict, directory: str | os.PathLike) -> dict:
    """``env`` for a trainer run whose events go to ``directory`` (its own: ``trainer.events.read_events``
    reads every event of it, ``EventCursor`` the new ones while it runs)."""
    return {**env, EVENTS_DIR_ENV: str(directory)}

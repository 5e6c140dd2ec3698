"""The seam a test injects faults through (a checkpoint's writes and commit, a step); production injects none.

A ``Checkpointer`` takes ``faults=``: an object with the two hooks of ``Faults``. Without one it asks
``DTRAIN_FAULTS`` (``module:callable``, called with no arguments), the one generic way in for a test that
runs the trainer as torchrun subprocesses; unset, ``Faults()`` does nothing. The faults themselves (a commit
held back, a disk that fills up) live with the tests: trainer/testing/faults.py.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Mapping

FAULTS_ENV = "DTRAIN_FAULTS"


class Faults:
    """No faults: every hook leaves the save as it is."""

    def storage_writer(self, write_dir: str, step: int, rank: int, thread_count: int) -> Any | None:
        """A DCP storage writer for this rank's files of ``step`` instead of the real one (None: none)."""
        return None

    def before_manifest(self, step: int, rank: int) -> None:
        """Called on every rank once its files of ``step`` are written (and uploaded), before the manifest."""

    def after_step(self, step: int) -> None:
        """Called by the training loop once ``step`` is queued (trainer.train.train's ``step_hook``)."""


def faults_from_env(environ: Mapping[str, str] | None = None) -> Faults:
    """The faults ``DTRAIN_FAULTS`` names (``module:callable``), or none when it is unset."""
    spec = (os.environ if environ is None else environ).get(FAULTS_ENV, "")
    if not spec:
        return Faults()
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{FAULTS_ENV}: expected module:callable, got {spec!r}")
    return getattr(importlib.import_module(module), name)()

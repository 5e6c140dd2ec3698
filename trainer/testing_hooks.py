"""Test-only hooks for the bundled trainer, kept out of the training code: ``python -m trainer`` asks this
module for them and passes them to trainer.train.train's seams. Nothing here runs unless a test's
environment names it.

``DTRAIN_TEST_STEP_SLEEP=SECONDS``: every step also sleeps SECONDS (as a slower machine's step would take),
so that the tests' long-running and time-capped groups leave the CPU to the tests running beside them
(tests/conftest.py's slow_steps).
"""

import os
import time
from collections.abc import Callable, Mapping

STEP_SLEEP_ENV = "DTRAIN_TEST_STEP_SLEEP"


def step_hook(environ: Mapping[str, str] | None = None) -> Callable[[int], None] | None:
    """The hook called after each step that the environment asks for, or None (the production case)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(STEP_SLEEP_ENV) or ""
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{STEP_SLEEP_ENV}: expected a number of seconds, got {raw!r}") from None
    if seconds <= 0:
        return None
    return lambda step: time.sleep(seconds)

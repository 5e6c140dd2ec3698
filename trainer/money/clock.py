"""The time billing runs on: the storage's clock, not this node's.

The spend files hold times on the provider's clock: the launch, the spot prices' changes, an elastic
group's sizes. A node whose own clock is minutes off would bill minutes that never ran (ahead: and stop
early at its cap) or leave out minutes that did (behind). The job's storage keeps one clock for every
writer (a local file's modification time, an S3 object's ``LastModified``), close to the provider's, which
writes there too. So at start each process writes a probe object among the spend files, reads back the
time the storage gave it, and from then on reads the time as its own clock minus the difference, when the
difference is more than ``TOLERANCE_S`` (an S3 timestamp has whole seconds). Where the probe cannot be
written or read, the node's clock is used, and that is said once. Standard library only.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any

from trainer.base.say import say

TOLERANCE_S = 2.0
"""A difference up to this is the probe's own round trip and the storage's whole seconds: not corrected."""

PROBE_PREFIX = ".clock-"
"""The probe's name starts so: a dot, which every reader of the spend files passes over."""


class Clock:
    """``clock()``: unix time on the storage's clock, this node's minus its measured ``skew_s``."""

    def __init__(self, skew_s: float = 0.0) -> None:
        self.skew_s = skew_s

    def __call__(self) -> float:
        return time.time() - self.skew_s

    def __repr__(self) -> str:
        return f"Clock(skew_s={self.skew_s:+.1f})"


def storage_skew(storage: Any, directory: str) -> float:
    """This node's clock minus the storage's, measured with one probe object written and removed in
    ``directory`` of ``storage`` (a ``trainer.base.storage.Storage``); the storage's time is the probe's
    modification time, taken against the midpoint of the write on this node's clock."""
    name = f"{PROBE_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    probe = f"{directory.rstrip('/')}/{name}"
    if not storage.remote:
        os.makedirs(directory, exist_ok=True)
    before = time.time()
    storage.write_text(probe, "clock probe\n", durable=False)
    after = time.time()
    try:
        return (before + after) / 2 - storage.modified_at(probe)
    finally:
        storage.remove_file(probe)


def measured(storage: Any | None, directory: str | None = None) -> Clock:
    """The clock billing runs on for a job whose spend files are in ``directory`` of ``storage`` (default:
    its root; None: no spend files, this node's clock)."""
    if storage is None:
        return Clock()
    try:
        skew = storage_skew(storage, directory or storage.root)
    except (OSError, ValueError, KeyError) as err:
        say(
            f"[trainer] could not compare this node's clock with the storage's ({err}): billing runs on "
            "this node's clock"
        )
        return Clock()
    if abs(skew) <= TOLERANCE_S:
        return Clock()
    say(
        f"[trainer] this node's clock is {skew:+.0f} s off the storage's ({storage.uri}): billing and the "
        "budget run on the storage's clock"
    )
    return Clock(skew)

"""The writer lease files of a checkpoint directory: ``lease/<token>.json``, the highest token the one writer.

A training group takes a lease at start, created exclusively with token = 1 + the highest one there
(``acquire_lease``). A group whose token is no longer the highest has been fenced off by a newer one and
must not commit (trainer/checkpoint/lease.py). ``LeaseFiles`` is a part of ``CheckpointDir``.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, NamedTuple

LEASES = "lease"
"""Writer leases, one file per token: ``lease/<token:010d>.json``."""
LEASES_KEPT = 4
"""Lease files kept (the newest); older ones only tell the history, and the current one is never pruned."""
LEASE_FILE = re.compile(r"^(\d{10})\.json$")


def lease_file_name(token: int) -> str:
    return f"{token:010d}.json"


class Lease(NamedTuple):
    """A writer lease: its fencing token and what its file says (who took it, when)."""

    token: int
    info: dict[str, Any]

    @property
    def group(self) -> str:
        return self.info.get("group") or f"pid {self.info.get('pid', '?')} on {self.info.get('host', '?')}"


class LeaseFiles:
    """CheckpointDir's lease files (a mixin: it uses the directory's ``storage`` and ``path``)."""

    def leases(self) -> list[int]:
        """The tokens of the lease files there, lowest first ([] before the first writer)."""
        return sorted(int(m.group(1)) for name in self.storage.listdir(self.path(LEASES))
                      if (m := LEASE_FILE.match(name)))  # fmt: skip

    def lease_path(self, token: int) -> str:
        return self.path(LEASES, lease_file_name(token))

    def lease(self, token: int) -> Lease:
        """A lease's file; its info is {} when it was pruned or is not readable."""
        try:
            return Lease(token, self.storage.read_json(self.lease_path(token)))
        except (FileNotFoundError, ValueError):
            return Lease(token, {})

    def newest_lease(self) -> Lease | None:
        tokens = self.leases()
        return self.lease(tokens[-1]) if tokens else None

    def acquire_lease(self, info: dict[str, Any], attempts: int = 100) -> Lease:
        """Become the writer: create ``lease/<token>.json`` with token = 1 + the highest one there.

        The creation is exclusive (``Storage.create_exclusive``), so two writers racing for one
        token get one each: the loser takes the next. Every earlier holder is fenced off from then on.
        """
        self.storage.makedirs()
        token = (self.leases() or [0])[-1] + 1
        for _ in range(attempts):
            body = {"token": token, **info, "acquired_at": time.time()}
            if self.storage.create_exclusive(self.lease_path(token), json.dumps(body, indent=2)):
                newest = (self.leases() or [token])[-1]
                if newest <= token:
                    self.prune_leases(token)
                    return Lease(token, body)
                # A newer lease already exists: this token was read from a stale listing (its file had
                # been pruned, or others took newer ones meanwhile). Holding it would mean being fenced at
                # once, and a reused token is not unique: give it back and take one past the newest.
                self.storage.remove_file(self.lease_path(token))
                token = newest + 1
                continue
            token = max(token + 1, (self.leases() or [0])[-1] + 1)
        raise RuntimeError(f"could not take a writer lease in {self.path(LEASES)} after {attempts} attempts")

    def prune_leases(self, current: int, keep: int = LEASES_KEPT) -> None:
        """Remove all but the ``keep`` newest lease files; never ``current`` nor any newer one."""
        tokens = self.leases()
        for token in tokens[:-keep] if keep > 0 else tokens:
            if token < current:
                self.storage.remove_file(self.lease_path(token))

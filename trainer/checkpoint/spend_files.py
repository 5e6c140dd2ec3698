"""The money a job spent, as its checkpoint directory records it: the ledger in each manifest, and one spend
file (and one spot-price file) per attempt beside the step directories. ``SpendFiles`` is a part of
``CheckpointDir``; trainer/contract.py keeps a standard-library copy of the spend file's writer for programs
of your own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trainer.money.capacity import Capacity
from trainer.checkpoint.errors import CheckpointInvalid
from trainer.money.ledger import CAPACITY_TYPES

SPEND = "spend"
"""Under a job's ledger root (its checkpoint directory, or a sweep's): ``spend/<attempt>.json``, one file
per attempt (pod group), rewritten by that attempt as it runs and finalised by the provider when it ends.
One writer per file, so attempts of a job, or members of a sweep, never race on a shared total."""
PRICES = "prices"
"""Under a job's ledger root: ``prices/<attempt>.json``, ``{"prices_in_effect": [[since,
usd_per_node_hour], ...], "zone", "instance_type", "updated_at"}``: the spot prices in effect since a spot
attempt's launch, written by the provider while the attempt runs (its one writer), read by the attempt's cap
(``trainer.money.cap``)."""


@dataclass(frozen=True)
class Ledger:
    """The spend recorded in one checkpoint manifest (all zeros before the first checkpoint)."""

    step: int = 0
    step_time_s: float | None = None
    total_dollars: float = 0.0
    by_capacity: dict[str, dict[str, float]] = field(default_factory=dict)
    """``{"spot" | "on_demand" | "local": {"node_hours", "gpu_hours", "dollars"}}``."""
    path: str | None = None
    """The checkpoint directory it was read from (None: no committed checkpoint yet)."""
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """Newer committed checkpoints whose manifest failed its checks (``CheckpointInvalid.to_dict()``)."""

    @property
    def gpu_hours(self) -> float:
        return sum(c.get("gpu_hours", 0.0) for c in self.by_capacity.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "step_time_s": self.step_time_s,
            "total_dollars": self.total_dollars,
            "gpu_hours": self.gpu_hours,
            "by_capacity": self.by_capacity,
            "path": self.path,
            "skipped": self.skipped,
        }

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], path: str, where: str) -> Ledger:
        """The ledger a manifest carries; ``ValueError`` naming ``where`` and the field when malformed."""
        cost = manifest.get("cost") or {}
        if not isinstance(cost, dict):
            raise ValueError(f"{where}: cost: expected an object, got {cost!r}")
        by_capacity = {c: {"node_hours": 0.0, "gpu_hours": 0.0, "dollars": 0.0} for c in CAPACITY_TYPES}
        for key, entry in cost.items():
            try:  # buckets of older manifests are spelled as they were ("local", "on-demand")
                bucket = Capacity(key).value
            except ValueError:
                continue
            try:
                for k in ("node_hours", "gpu_hours", "dollars"):
                    by_capacity[bucket][k] += float((entry or {}).get(k, 0.0) or 0.0)
            except (TypeError, ValueError, AttributeError):
                raise ValueError(f"{where}: cost.{key}: expected numbers, got {entry!r}") from None
        total = cost.get("total_dollars")
        try:
            total = float(total) if total is not None else sum(c["dollars"] for c in by_capacity.values())
        except (TypeError, ValueError):
            raise ValueError(f"{where}: cost.total_dollars: expected a number, got {total!r}") from None
        step_time = manifest.get("step_time_s")
        try:
            step_time = float(step_time) if step_time is not None else None
        except (TypeError, ValueError):
            raise ValueError(f"{where}: step_time_s: expected a number, got {step_time!r}") from None
        if step_time is not None and step_time <= 0:
            step_time = None  # not measured (e.g. a checkpoint before the first timed step)
        return cls(
            step=int(manifest.get("step", 0)),
            step_time_s=step_time,
            total_dollars=total,
            by_capacity=by_capacity,
            path=path,
        )


@dataclass
class Spend:
    """Every second billed to a job (or a sweep): the sum of its attempts' spend files."""

    total_dollars: float = 0.0
    by_capacity: dict[str, dict[str, float]] = field(default_factory=dict)
    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``{attempt: its spend file}``."""

    @classmethod
    def of(cls, entries: dict[str, dict[str, Any]], where: str) -> Spend:
        by_capacity = {c: {"node_hours": 0.0, "gpu_hours": 0.0, "dollars": 0.0} for c in CAPACITY_TYPES}
        for name, entry in entries.items():
            try:
                bucket = Capacity(entry.get("capacity", Capacity.ANY.value)).value
                for k in ("node_hours", "gpu_hours", "dollars"):
                    value = float(entry.get(k, 0.0) or 0.0)
                    if not value >= 0:
                        raise ValueError
                    by_capacity[bucket][k] += value
            except (TypeError, ValueError, AttributeError):
                raise ValueError(
                    f"{where}/{name}.json: expected a spend entry with numbers >= 0, got {entry!r}"
                ) from None
        total = sum(c["dollars"] for c in by_capacity.values())
        return cls(total_dollars=round(total, 9), by_capacity=by_capacity, attempts=dict(entries))


class SpendFiles:
    """CheckpointDir's ledger and spend files (a mixin: it uses the directory's ``committed``,
    ``checked_manifest``, ``path``, ``read_json`` and ``write_json``)."""

    def ledger(self, spend_root: Any = None) -> Ledger:
        """The job's ledger: step and measured step time of the latest committed checkpoint, and the
        spend of every attempt (``spend_root``'s spend files, default this directory's) -- or the
        checkpoint's own ledger where that is larger (a directory written before spend files existed).

        Raises ``ValueError`` naming the manifest or spend file and the field when one is malformed.
        """
        ledger, skipped = Ledger(), []
        for checkpoint in reversed(self.committed()):  # the newest whose manifest checks out
            try:
                manifest = self.checked_manifest(checkpoint.path)
            except CheckpointInvalid as err:
                skipped.append(err.to_dict())
                continue
            ledger = Ledger.from_manifest(manifest, checkpoint.path, self.manifest_path(checkpoint.path))
            break
        ledger = dataclasses.replace(ledger, skipped=skipped)
        spend = (spend_root or self).spend()
        if spend.total_dollars > ledger.total_dollars:
            ledger = dataclasses.replace(
                ledger, total_dollars=spend.total_dollars, by_capacity=spend.by_capacity
            )
        return ledger

    def record_spend(self, attempt: str, entry: dict[str, Any]) -> str:
        """Write one attempt's spend file (its own: no other writer); returns its path."""
        if not attempt or "/" in attempt or attempt.startswith("."):
            raise ValueError(f"attempt: not a file name: {attempt!r}")
        return self.write_json(f"{SPEND}/{attempt}.json", {"attempt": attempt, **entry}, durable=False)

    def spend_entry(self, attempt: str) -> dict[str, Any] | None:
        return self.read_json(f"{SPEND}/{attempt}.json")

    def record_prices(self, attempt: str, entry: dict[str, Any]) -> str:
        """Write the spot prices in effect since ``attempt``'s launch (``PRICES``); returns the path."""
        if not attempt or "/" in attempt or attempt.startswith("."):
            raise ValueError(f"attempt: not a file name: {attempt!r}")
        return self.write_json(f"{PRICES}/{attempt}.json", {"attempt": attempt, **entry}, durable=False)

    def prices_in_effect(self, attempt: str) -> list[tuple[float, float]]:
        """``attempt``'s prices (``PRICES``) as ``[(since, usd_per_node_hour), ...]``; [] when none were
        written. Raises ``ValueError`` naming the file when it is not such a list."""
        entry = self.read_json(f"{PRICES}/{attempt}.json") or {}
        got = entry.get("prices_in_effect") if isinstance(entry, dict) else entry
        try:
            prices = [(float(t), float(p)) for t, p in got or []]
        except (TypeError, ValueError):
            raise ValueError(
                f"{self.path(PRICES, attempt + '.json')}: prices_in_effect: expected [[since, price], "
                f"...], got {got!r}"
            ) from None
        if any(not (p >= 0) for _, p in prices):
            raise ValueError(
                f"{self.path(PRICES, attempt + '.json')}: a price below 0 or not a number: {prices!r}"
            )
        return prices

    def spend(self) -> Spend:
        """The sum of every attempt's spend file (zero when there is none)."""
        entries = {}
        for name in self.storage.listdir(self.path(SPEND)):
            if name.endswith(".json") and not name.startswith("."):
                try:
                    entries[name[:-5]] = self.read_json(f"{SPEND}/{name}", default={})
                except ValueError as err:  # a torn or hand-edited file: the budget must not guess
                    raise ValueError(f"{self.path(SPEND, name)}: not JSON ({err})") from None
        return Spend.of(entries, self.path(SPEND))

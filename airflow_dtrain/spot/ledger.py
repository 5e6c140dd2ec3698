"""The cost ledger: what a job has spent, read from its latest committed checkpoint.

The trainer writes the ledger into every checkpoint's ``manifest.json`` (the commit
point), so it survives retries, relaunches and preemptions with the training state it
describes::

    <checkpoint_uri>/step-00000500/manifest.json
    {
      "step": 500,
      "step_time_s": 1.84,                    # measured mean seconds per optimizer step
      "cost": {
        "spot":      {"node_hours": 3.2, "gpu_hours": 25.6, "dollars": 29.4},
        "on_demand": {"node_hours": 0.0, "gpu_hours": 0.0,  "dollars": 0.0},
        "local":     {"node_hours": 0.0, "gpu_hours": 0.0,  "dollars": 0.0},
        "total_dollars": 29.4
      },
      ...
    }

The latest committed checkpoint is the highest ``step-XXXXXXXX`` directory that has a
``manifest.json`` (a directory without one is an interrupted save). Local paths need
nothing more than fsspec; ``s3://`` needs s3fs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CAPACITY_TYPES = ("spot", "on_demand", "local")
_STEP_DIR = re.compile(r"^step-(\d{8})$")


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
        }


def _fs(uri: str):
    import fsspec

    try:
        return fsspec.core.url_to_fs(uri)
    except ImportError as err:
        raise ImportError(f"checkpoint_uri {uri!r}: reading it needs an fsspec backend: {err}") from None


def latest_manifest(checkpoint_uri: str) -> tuple[str, dict[str, Any]] | None:
    """(directory, manifest) of the latest committed checkpoint under ``checkpoint_uri``, or None."""
    fs, root = _fs(checkpoint_uri.rstrip("/"))
    fs.invalidate_cache(root)  # a shared s3fs instance would list the step directories it saw last time
    if not fs.exists(root):
        return None
    steps = []
    for entry in fs.ls(root, detail=False):
        match = _STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
        if match:
            steps.append((int(match.group(1)), entry.rstrip("/")))
    for _, directory in sorted(steps, reverse=True):
        manifest = f"{directory}/manifest.json"
        if fs.exists(manifest):
            with fs.open(manifest, "r") as fh:
                return directory, json.load(fh)
    return None


def read_ledger(checkpoint_uri: str) -> Ledger:
    """The ledger of the latest committed checkpoint (an empty ledger when there is none).

    Raises ``ValueError`` naming the manifest and the field when the cost entry is malformed.
    """
    found = latest_manifest(checkpoint_uri)
    if found is None:
        return Ledger()
    directory, manifest = found
    where = f"{directory}/manifest.json"
    cost = manifest.get("cost") or {}
    if not isinstance(cost, dict):
        raise ValueError(f"{where}: cost: expected an object, got {cost!r}")
    by_capacity: dict[str, dict[str, float]] = {}
    for capacity in CAPACITY_TYPES:
        entry = cost.get(capacity) or {}
        try:
            by_capacity[capacity] = {
                k: float(entry.get(k, 0.0) or 0.0) for k in ("node_hours", "gpu_hours", "dollars")
            }
        except (TypeError, ValueError, AttributeError):
            raise ValueError(f"{where}: cost.{capacity}: expected numbers, got {entry!r}") from None
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
    return Ledger(
        step=int(manifest.get("step", 0)),
        step_time_s=step_time,
        total_dollars=total,
        by_capacity=by_capacity,
        path=directory,
    )

"""The cost ledger: what a job has spent, read from its latest committed checkpoint.

The trainer writes the ledger into every checkpoint's manifest (the commit point), so it
survives retries, relaunches and preemptions with the training state it describes::

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

Which checkpoint is the latest, and how the manifest is read, is
``trainer.checkpoint_dir``'s (the one reader of a checkpoint directory); this module keeps
the provider's names for it. Local paths need nothing more; ``s3://`` needs s3fs.

A spot attempt's trainer counts its seconds at the price its group was launched at. EC2 bills a
running spot instance at the spot price in effect, to the second, and that price can change while
the group runs. When the group ends, ``at_prices_in_effect`` bills the attempt again from the
zone's price history (``airflow_dtrain.aws.prices.spot_price_history``); its spend file keeps the
larger of the two figures, so the cap never counts less than either. While a group runs, the
provider writes the prices it reads for the trainer's cap (``trainer.checkpoint_dir.PRICES``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainer.checkpoint_dir import CheckpointDir, Ledger
from trainer.cost import dollars_at_prices

__all__ = ["Ledger", "at_prices_in_effect", "dollars_at_prices", "read_ledger"]


def read_ledger(checkpoint_uri: str, ledger_uri: str | None = None) -> Ledger:
    """The job's ledger: the latest committed checkpoint's step and step time, and every attempt's
    spend (the spend files under ``ledger_uri``, default ``checkpoint_uri``: a sweep shares one).

    Raises ``ValueError`` naming the manifest or spend file and the field when one is malformed.
    """
    return CheckpointDir(checkpoint_uri).ledger(CheckpointDir(ledger_uri) if ledger_uri else None)


def at_prices_in_effect(
    entry: dict[str, Any], prices: Sequence[tuple[float, float]], *, until: float
) -> dict[str, Any]:
    """``entry`` (an attempt's spend file, billed up to ``until`` at its launch price) billed again at the spot
    prices in effect over its seconds: ``dollars`` becomes the larger of the two figures, and the entry keeps
    both (``dollars_at_launch_price``, ``dollars_at_prices_in_effect``) and the prices it used. Unchanged but
    for ``priced_at`` when ``prices`` do not cover the launch."""
    at_prices = dollars_at_prices(float(entry["launched_at"]), until, int(entry["nodes"]), prices)
    if at_prices is None:
        return {**entry, "priced_at": "launch price (the price history does not reach back to the launch)"}
    in_window = sorted((t, p) for t, p in prices if t < until)
    first = max(i for i, (t, _) in enumerate(in_window) if t <= float(entry["launched_at"]))
    at_launch = (
        int(entry["nodes"])
        * max(0.0, until - float(entry["launched_at"]))
        / 3600
        * float(entry.get("price_per_node_hour", 0.0))
    )
    return {
        **entry,
        "dollars": max(float(entry["dollars"]), round(at_prices, 9)),
        "dollars_at_launch_price": round(at_launch, 9),
        "dollars_at_prices_in_effect": round(at_prices, 9),
        "prices_in_effect": [[round(t, 3), p] for t, p in in_window[first:]],
        "priced_at": "prices in effect",
    }

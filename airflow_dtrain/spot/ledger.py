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

from trainer.checkpoint_dir import CheckpointDir, Ledger
from trainer.money.bill import at_prices_in_effect, dollars_at_prices

__all__ = ["Ledger", "at_prices_in_effect", "dollars_at_prices", "read_ledger"]


def read_ledger(checkpoint_uri: str, ledger_uri: str | None = None) -> Ledger:
    """The job's ledger: the latest committed checkpoint's step and step time, and every attempt's
    spend (the spend files under ``ledger_uri``, default ``checkpoint_uri``: a sweep shares one).

    Raises ``ValueError`` naming the manifest or spend file and the field when one is malformed.
    """
    return CheckpointDir(checkpoint_uri).ledger(CheckpointDir(ledger_uri) if ledger_uri else None)

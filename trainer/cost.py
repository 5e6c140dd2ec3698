"""The cost ledger each checkpoint manifest carries: now ``trainer.money`` (``ledger``, ``bill``,
``projection``).

Kept so that importers of the old path go on working; new code imports from ``trainer.money``.
"""

from trainer.money.bill import billed, dollars_at_prices
from trainer.money.ledger import (
    CAPACITY_TYPES,
    LAUNCHED_AT_ENV,
    CostLedger,
    empty_cost,
    launched_at,
    nodes_in_group,
)
from trainer.money.projection import stop_reserve_s

__all__ = [
    "CAPACITY_TYPES", "LAUNCHED_AT_ENV", "CostLedger", "billed", "dollars_at_prices", "empty_cost",
    "launched_at", "nodes_in_group", "stop_reserve_s",
]  # fmt: skip

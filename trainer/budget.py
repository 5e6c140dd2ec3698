"""The job's dollar cap, enforced while it trains: now ``trainer.money.cap``.

Kept so that importers of the old path go on working; new code imports from ``trainer.money.cap``.
"""

from trainer.money.cap import FIRST_SAVE_GUESS_S, BudgetGuard, attempt_name

__all__ = ["FIRST_SAVE_GUESS_S", "BudgetGuard", "attempt_name"]

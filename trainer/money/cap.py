"""The job's dollar cap: what "no budget" means, and its enforcement while the job trains.

The budget task admits a job on an estimate; this is what makes the budget a cap. Rank 0
knows what the group costs per second (nodes × the price ceiling) and what the job has
spent (every other attempt's spend file plus this attempt since its group was launched),
and after every step projects the spend to the moment the job could be stopped if it went
on: one more step (the slowest of the recent ones), a blocking save (the slowest seen so
far, or a guess before the first) and ``cost.stop_margin_s`` for the exit and the node's
release, all of it before the platform's budget deadline, which keeps back
``checkpoint.grace_period_s`` and ``cost.stop_margin_s`` more to end a hung group within the
budget (``trainer.money.projection.stop_reserve_s``). When that projection passes
``cost.budget_usd``, every rank saves the step it has reached and the job exits
``BUDGET_EXIT_CODE``, before the platform's deadline would stop it. Rank 0 also keeps this
attempt's spend file current, so the spend after the last checkpoint is on record for the
next attempt, the next run and the budget task.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from typing import Any

from typing import TYPE_CHECKING

from trainer.money.ledger import CostLedger
from trainer.money.projection import save_estimate_s, stop_reserve_s, usd_per_second
from trainer.base.say import say

if TYPE_CHECKING:
    from trainer.checkpoint.directory import CheckpointDir
    from trainer.config.sections import CostConfig


def attempt_name() -> str:
    """This attempt's name in the spend ledger: its pod group's, else this process's."""
    return os.environ.get("DTRAIN_GROUP_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class BudgetGuard:
    """Rank 0's view of the cap; ``over()`` says when to stop, ``record()`` keeps the spend file."""

    refresh_s = 15.0  # how often the other attempts' files are read again (a sweep's members spend meanwhile)
    write_s = 5.0  # how often this attempt's spend file is rewritten
    live_s = 120.0  # an attempt that wrote within this long (and has not ended) is taken to be spending still

    def __init__(
        self,
        cfg: CostConfig,
        cost: CostLedger,
        spend_dir: CheckpointDir | None,
        attempt: str,
        grace_period_s: float = 0.0,
    ):
        self.cfg, self.cost, self.dir, self.attempt = cfg, cost, spend_dir, attempt
        self.grace_period_s = grace_period_s
        self.ceiling = max(cfg.price_ceiling_per_node_hour, cfg.price_per_node_hour)
        self.recent: deque[float] = deque(maxlen=20)
        self.save_s: float | None = None
        self.startup_s: float | None = None  # from the group's launch to the end of this attempt's first step
        self._others_entries: list[dict[str, Any]] = []
        self._others_at, self._written_at = float("-inf"), float("-inf")

    @property
    def budget_usd(self) -> float | None:
        """The cap (None: no budget)."""
        return self.cfg.budget_usd

    @property
    def enabled(self) -> bool:
        return self.budget_usd is not None

    def others(self, ahead_s: float = 0.0) -> float:
        """Dollars of every other attempt sharing the ledger (a sweep's other members, earlier attempts) as of
        ``ahead_s`` seconds from now. The files are re-read every ``refresh_s``; an attempt that has not ended
        is assumed to go on spending at its own rate since it last wrote, so members running side by side
        cannot together pass the cap between two reads."""
        now = time.monotonic()
        if self.dir is not None and now - self._others_at >= self.refresh_s:
            spend = self.dir.spend()
            self._others_entries = [e for a, e in spend.attempts.items() if a != self.attempt]
            self._others_at = now
            self._read_node_changes(spend.attempts.get(self.attempt) or {})
            self._read_prices()
        wall = self.cost.clock()
        total = 0.0
        for e in self._others_entries:
            total += float(e.get("dollars", 0.0))
            last = float(e.get("updated_at") or e.get("launched_at") or wall)
            if (
                not (e.get("ended") or e.get("exited")) and wall - last < self.live_s
            ):  # still writing: spending
                rate = float(e.get("nodes", 1)) * float(e.get("price_per_node_hour", 0.0)) / 3600
                total += rate * max(0.0, wall + ahead_s - last)
        return total

    def _read_node_changes(self, mine: dict[str, Any]) -> None:
        """An elastic group's sizes since its launch, as the provider recorded them in this attempt's spend
        file (``node_changes``): this attempt is billed over them, so that a worker restarted at another size
        neither bills its new size back to the launch nor erases the record when it rewrites the file."""
        try:
            changes = [(float(t), int(n)) for t, n in mine.get("node_changes") or []]
        except (TypeError, ValueError):
            say(
                f"[trainer] node_changes of this attempt's spend file: expected [[at, nodes], ...], got "
                f"{mine.get('node_changes')!r}; billed at {self.cost.nodes} node(s)"
            )
            return
        if changes:
            self.cost.node_changes = changes

    def _read_prices(self) -> None:
        """The spot prices in effect since this attempt's launch, as the provider last wrote them (a price
        rise during the run counts from the second it took effect). A file that cannot be read leaves the last
        prices read (at first: the launch price), and says so."""
        try:
            prices = self.dir.prices_in_effect(self.attempt)
        except (OSError, ValueError) as err:
            say(
                f"[trainer] could not read the spot prices in effect ({err}): the cap counts the last "
                "prices read"
            )
            return
        if prices and prices != self.cost.prices_in_effect:
            self.cost.prices_in_effect = prices
            say(
                f"[trainer] spot price now ${self.cost.current_price():.4f}/node-h (launched at "
                f"${self.cost.price:.4f}): the cap counts every second at the price in effect"
            )

    def observe_step(self, seconds: float) -> None:
        self.recent.append(seconds)

    def observe_save(self, seconds: float) -> None:
        self.save_s = max(self.save_s or 0.0, seconds)

    def spent(self) -> float:
        return self.others() + self.cost.attempt_entry()["dollars"]

    def over(self) -> dict[str, Any] | None:
        """None while the job may take another step; else why it must stop now."""
        budget = self.budget_usd
        if budget is None:
            return None
        step_s = max(self.recent, default=0.0)
        save_s = save_estimate_s(self.save_s, step_s)
        ahead_s = step_s + stop_reserve_s(save_s, self.grace_period_s, self.cfg.stop_margin_s)
        others = self.others()  # first: it also reads the prices in effect
        rate = usd_per_second(self.cost.nodes, self.ceiling, self.cost.current_price())
        mine = self.cost.attempt_entry()["dollars"]
        spent = others + mine
        projected = self.others(ahead_s) + mine + rate * ahead_s
        if projected <= budget:
            return None
        return {
            "budget_usd": budget,
            "spent_usd": round(spent, 6),
            "projected_usd": round(projected, 6),
            "seconds_ahead": round(ahead_s, 3),
            "step_time_s": round(step_s, 6),
            "save_s": round(save_s, 3),
            "usd_per_hour": round(rate * 3600, 6),
        }

    def record(self, *, force: bool = False, **extra: Any) -> None:
        """Rewrite this attempt's spend file (at most every ``write_s`` unless ``force``)."""
        now = time.monotonic()
        if self.dir is None or (not force and now - self._written_at < self.write_s):
            return
        try:  # the first write of an attempt reads its node changes (and prices) first
            self.others()
        except (OSError, ValueError):  # the cap's own read (``over``) says what is wrong with the files
            pass
        timing = {"startup_s": round(self.startup_s, 3)} if self.startup_s is not None else {}
        if self.recent:
            timing["step_time_s"] = round(max(self.recent), 6)
        if self.save_s is not None:
            timing["save_s"] = round(self.save_s, 3)
        try:
            self.dir.record_spend(
                self.attempt, self.cost.attempt_entry(budget_usd=self.cfg.budget_usd, **timing, **extra)
            )
        except OSError as err:
            # The cap is still enforced here, from this attempt's own clock; the provider bills the attempt
            # when it ends. A full or read-only location fails the next checkpoint clearly (exit 74).
            say(f"[trainer] could not update this attempt's spend file in {self.dir.root}: {err}")
            return
        self._written_at = now

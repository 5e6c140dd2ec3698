"""The money side of a task's pod groups: their spend files, their bills, and the stop at the budget.

``GroupSession`` (``airflow_dtrain.session.group``) owns a group's life; what that life costs is here, as a
mixin it inherits (``SessionMoney``): a group's spend file is opened at its launch and billed when its end is
seen (again at the spot prices in effect while it ran, for a priced spot group), the job's spend so far is
read for the next launch's deadline, and before a relaunch the go-on decision is taken again. What a running
group's watch follows (its prices, its size, its deadline) is ``airflow_dtrain.session.follow``. The
arithmetic is ``trainer.money``'s; the spend files are ``trainer.checkpoint.directory``'s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.session.watch import node_changes
from trainer.money.capacity import Capacity
from trainer.checkpoint.directory import CheckpointDir
from trainer.config.job_config import BUDGET_EXIT_CODE
from trainer.money.bill import at_prices_in_effect, billed
from trainer.money.deadline import budget_deadline
from trainer.money.ledger import opening_entry
from trainer.money.projection import (
    FIRST_SAVE_GUESS_S,
    RelaunchNeed,
    relaunch_need,
    stop_reserve_s,
    usd_per_second,
)

log = logging.getLogger("airflow_dtrain.session.group")

STARTUP_GUESS_S = 120.0
"""Seconds from a launch to the first step, before any attempt of the job has measured it."""


class SessionMoney:
    """``GroupSession``'s spend ledger and cap: it needs ``launcher``, ``spec``, ``purpose``, ``log``,
    ``spot_prices`` and ``stopped_at_budget`` of the session it is mixed into.

    An elastic group is billed over the sizes its launcher reports (``node_changes``), while it runs and
    when it ends; its budget deadline prices the time ahead on ``num_nodes`` (``budget_deadline``: a group
    that grows back must not find its cap already spent), so the cap holds at every size change, and follows
    what it spent on fewer nodes (``follow_deadline``), so that it is not stopped with money left."""

    def _ledger_dir(self) -> CheckpointDir | None:
        """Where this job's spend files go (training groups only: an evaluation is not the job's spend)."""
        train = self.spec.train
        uri = train.cost.ledger_uri or train.checkpoint.uri
        return CheckpointDir(uri) if self.purpose == "training" and uri else None

    def spend_uri(self) -> str | None:
        """``_ledger_dir``'s location, as plain text for a ``GroupWatch`` (None: no spend files)."""
        ledger = self._ledger_dir()
        return ledger.storage.uri if ledger is not None else None

    def _spent(self) -> float:
        """Dollars the job has spent so far (every attempt's spend file; 0 without a ledger or a budget)."""
        ledger = self._ledger_dir()
        if ledger is None or self.spec.budget_usd is None:
            return 0.0
        return ledger.spend().total_dollars

    def _open_spend(self, name: str) -> None:
        """Open ``name``'s spend file at its launch; its trainer keeps it current, ``_close_spend`` ends
        it."""
        ledger = self._ledger_dir()
        if ledger is None:
            return
        ledger.record_spend(name, opening_entry(self.spec.train.cost, self.spec.num_nodes, time.time()))

    def _close_spend(self, name: str) -> None:
        """Bill ``name`` up to now, when its end was seen: the seconds after its trainer last wrote count
        too."""
        ledger = self._ledger_dir()
        entry = ledger.spend_entry(name) if ledger is not None else None
        if not entry or entry.get("ended"):
            return
        until = time.time()
        changes = node_changes(self.launcher, name)
        if len(changes) > 1:  # an elastic group that changed size: billed over its sizes, not num_nodes
            entry = {**entry, "node_changes": changes}
        entry = billed(entry, until=until)
        if self.price_watch() is not None:
            entry = self._at_prices_in_effect(name, entry, until)
        ledger.record_spend(name, {**entry, "ended": True})

    def price_watch(self) -> dict[str, Any] | None:
        """What ``GroupWatch`` needs to feed a spot group's prices to its cap (None: not a priced spot
        group)."""
        ledger = self._ledger_dir()
        if self.spot_prices is None or self.spec.capacity != Capacity.SPOT or ledger is None:
            return None
        return {"feed": self.spot_prices.to_dict(), "ledger_uri": ledger.storage.uri}

    def deadline_terms(self) -> dict[str, Any] | None:
        """The terms a ``GroupWatch`` moves a training group's budget deadline by (``follow_deadline``): its
        budget, num_nodes, grace and margin, and the job's ``max_runtime_s`` (None: no budget or ledger)."""
        if self._ledger_dir() is None or self.spec.budget_usd is None:
            return None
        terms = budget_deadline(self.spec)
        if terms is None or terms.get("budget_usd") is None:
            return None
        runtime = getattr(self.spec, "max_runtime_s", None)
        return {**terms, **({"max_runtime_s": int(runtime)} if runtime is not None else {})}

    def _at_prices_in_effect(self, name: str, entry: dict[str, Any], until: float) -> dict[str, Any]:
        """A spot group's spend at the prices in effect while it ran (the larger figure is kept); at its
        launch price, saying so, when the price history cannot be read."""
        launch_price = float(entry.get("price_per_node_hour", 0.0))
        try:
            history = self.spot_prices.history(float(entry["launched_at"]), until)
            repriced = at_prices_in_effect(entry, history, until=until)
        except Exception as err:  # ended: its spend is recorded whatever the price API says
            self.log.warning(
                "Group %s: the spot price history could not be read (%s): its $%.4f stays "
                "counted at its launch price, $%.4f/node-h",
                name,
                err,
                entry["dollars"],
                launch_price,
            )
            return {
                **entry,
                "priced_at": f"launch price (the price history could not be read: {type(err).__name__})",
            }
        if repriced.get("dollars_at_prices_in_effect") is None:
            self.log.warning(
                "Group %s: the spot price history does not reach back to its launch: its $%.4f "
                "stays counted at its launch price, $%.4f/node-h",
                name,
                entry["dollars"],
                launch_price,
            )
            return repriced
        prices = sorted({p for _, p in repriced["prices_in_effect"]})
        self.log.info(
            "Group %s billed at the spot prices in effect while it ran ($%s/node-h): $%.4f; at its launch "
            "price "
            "($%.4f/node-h) $%.4f; the ledger counts $%.4f",
            name,
            ", ".join(f"{p:.4f}" for p in prices),
            repriced["dollars_at_prices_in_effect"],
            launch_price,
            repriced["dollars_at_launch_price"],
            repriced["dollars"],
        )
        return repriced

    def _unaffordable(self, name: str) -> bool:
        """Take the go-on decision again before a relaunch, with the measured start-up, step and save
        times and the spend so far: relaunch only if the money left pays for the start-up and one
        checkpoint interval (or the rest of the job); else end here, as at the cap. True: not relaunched."""
        budget, ledger_dir = self.spec.train.cost.budget_usd, self._ledger_dir()
        if budget is None or ledger_dir is None:
            return False
        spend = ledger_dir.spend()
        ledger = CheckpointDir(self.spec.train.checkpoint.uri).ledger(ledger_dir)
        step = ledger.step
        need = self._relaunch_need(ledger, spend)
        left = budget - spend.total_dollars
        self.log.info(
            "Budget before relaunching: $%.4f of $%.2f spent, $%.4f left; from step %d, %d steps to go at "
            "%.3f s/step, start-up %.0f s, save %.1f s, $%.4f/h: the next checkpoint needs $%.4f, the rest "
            "of the job $%.4f",
            spend.total_dollars,
            budget,
            left,
            step,
            need.steps_left,
            need.step_s,
            need.startup_s,
            need.save_s,
            need.usd_per_s * 3600,
            need.needed,
            need.to_finish,
        )
        if need.needed <= left:
            return False
        self.stopped_at_budget = {
            "group": name,
            "spent_usd": spend.total_dollars,
            "budget_usd": budget,
            "needed_usd": round(need.needed, 6),
            "reason": "a relaunch cannot reach its next checkpoint within the budget",
        }
        self.log.warning(
            "Not relaunching after %s: $%.4f left cannot pay for a start-up and the next "
            "checkpoint ($%.4f); the job stops at step %d within its $%.2f budget",
            name,
            left,
            need.needed,
            step,
            budget,
        )
        return True

    def _relaunch_need(self, ledger: Any, spend: Any) -> RelaunchNeed:
        """What a relaunch from the ``ledger``'s step needs, with the times the job's attempts measured (the
        slowest of each), else guesses; the money per second at the dearer of the price and its ceiling."""
        cost, train = self.spec.train.cost, self.spec.train
        measured = list(spend.attempts.values())

        def most(key: str, default: float) -> float:
            return max((float(e[key]) for e in measured if e.get(key)), default=default)

        step_s = ledger.step_time_s or most("step_time_s", 0.0)
        save_s = most("save_s", FIRST_SAVE_GUESS_S)
        return relaunch_need(
            usd_per_s=usd_per_second(
                self.spec.num_nodes, cost.price_ceiling_per_node_hour, cost.price_per_node_hour
            ),
            steps_left=max(0, train.steps - ledger.step),
            every=train.checkpoint.every,
            step_s=step_s,
            startup_s=most("startup_s", STARTUP_GUESS_S),
            save_s=save_s,
            # as the trainer's
            reserve_s=stop_reserve_s(save_s, train.checkpoint.grace_period_s, cost.stop_margin_s),
        )

    def _ended_at_cap(self, name: str, event: dict[str, Any]) -> bool:
        """At the job's dollar cap: the trainer stopped itself (exit 77), or the platform stopped it there
        (Kubernetes: the Job's activeDeadlineSeconds, derived from the budget). Either way, not relaunched."""
        by_itself = BUDGET_EXIT_CODE in (event.get("node_exit_codes") or {}).values()
        if not (by_itself or event.get("state") == GroupState.AT_BUDGET.value):
            return False
        self.current = name
        self.stopped_at_budget = {"group": name, "reason": event.get("message")}
        self.log.warning(
            "Group %s %s at the job's dollar cap (%s): not relaunched",
            name,
            "stopped itself" if by_itself else "was stopped by the platform",
            event.get("message"),
        )
        return True

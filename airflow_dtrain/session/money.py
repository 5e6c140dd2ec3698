"""The money side of a task's pod groups: their spend files, their bills, and the stop at the budget.

``GroupSession`` (``airflow_dtrain.session.group``) owns a group's life; what that life costs is here, as a
mixin it inherits (``SessionMoney``): a group's spend file is opened at its launch and billed when its end is
seen (again at the spot prices in effect while it ran, for a priced spot group), the job's spend so far is
read for the next launch's deadline, and before a relaunch the go-on decision is taken again. While a spot
group runs, ``WatchPrices`` (mixed into ``GroupWatch``) feeds the prices in effect to its trainer's cap, and
``follow_deadline`` moves its budget deadline with what it spent: earlier when the price rises, later when an
elastic group ran on fewer nodes. The arithmetic is ``trainer.money``'s; the spend files are
``trainer.checkpoint.directory``'s.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from airflow_dtrain import metrics
from airflow_dtrain.launchers.base import GroupState
from trainer.money.capacity import Capacity
from trainer.checkpoint.directory import CheckpointDir
from trainer.config.job_config import BUDGET_EXIT_CODE
from trainer.money.bill import at_prices_in_effect, billed
from trainer.money.deadline import budget_deadline, deadline_words, repriced_deadline
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


def follow_deadline(
    launcher: Any,
    name: str,
    terms: dict[str, Any],
    ledger: CheckpointDir,
    entry: dict[str, Any],
    now: float,
    history: list | None = None,
) -> None:
    """Move the platform's budget deadline of group ``name`` to what the money left buys now
    (``repriced_deadline``; ``terms``: the deadline set at its launch). The money spent counts every other
    attempt and this group's seconds as billed: its sizes (``node_changes``) and, with a price ``history``,
    the prices in effect. The time ahead is priced on ``num_nodes`` at the dearer of the launch price and the
    price now, so that the deadline holds as the launch's did with nobody watching (a group that grows back,
    a price that rises after this look). It comes earlier when the spot price rose, later when the group
    spent less than its launch deadline assumed (an elastic group on fewer nodes). The trainer's own cap
    reads the same spend; this is the stop that holds without it (a program of your own, a hung trainer)."""
    launched = float(entry.get("price_per_node_hour") or 0.0)
    group, price = billed(entry, until=now), launched
    if history:
        history = sorted(history)
        price = max(launched, ([p for t, p in history if t <= now] or [history[-1][1]])[-1])
        group = at_prices_in_effect(group, history, until=now)
    others = sum(float(e.get("dollars", 0.0)) for n, e in ledger.spend().attempts.items() if n != name)
    deadline = repriced_deadline(terms, spent_usd=others + float(group["dollars"]), price=price,
                                 elapsed_s=now - float(entry["launched_at"]))  # fmt: skip
    before = launcher.move_deadline(name, deadline)
    if before is None:
        return
    if deadline["seconds"] > before:
        spent = float(group["dollars"])
        why = f"it has cost ${spent:.4f} so far on the nodes it ran, less than its launch deadline assumed"
    elif price > launched:
        why = f"the spot price is ${price:.4f}/node-h, launched at ${launched:.4f}"
    else:
        why = f"the job's other attempts have spent ${others:.4f}"
    log.warning("Group %s: %s: its budget deadline moves from %ds to %s", name, why, before,
                deadline_words(deadline, "deadline"))  # fmt: skip


def node_changes(launcher: Any, name: str) -> list[list]:
    """``[[at, nodes], ...]``: group ``name``'s sizes as its launcher saw them (``node_changes``: the nodes
    billed from ``at`` on, the first at the launch); [] when the launcher cannot say (an older launcher, or
    a read that failed: the group is billed at ``num_nodes`` throughout, as before elastic groups)."""
    read = getattr(launcher, "node_changes", None)
    if read is None:
        return []
    try:
        return [[float(at), int(nodes)] for at, nodes in read(name) or []]
    except Exception as err:  # the watch goes on; the bill stays at num_nodes, which is never less
        log.warning("Group %s: could not read its node changes (%s): billed at its full size", name, err)
        return []


def record_node_changes(ledger: CheckpointDir | None, name: str, changes: list[list]) -> None:
    """Write an elastic group's ``changes`` into its spend file and bill it over them up to now, when the
    file says otherwise (the trainer rewrites the file too, and carries the changes it last read: a write
    of its that crossed this one is mended at the next poll). A group that never changed size
    (one entry) is billed at ``num_nodes`` throughout, as its file already says."""
    if ledger is None or len(changes) < 2:
        return
    entry = ledger.spend_entry(name)
    if not entry or entry.get("ended") or entry.get("node_changes") == changes:
        return
    ledger.record_spend(name, billed({**entry, "node_changes": changes}, until=time.time()))


def report_node_changes(changes: list[list], seen: int, tags: dict[str, str] | None) -> int:
    """The gauge ``group.nodes`` for each of ``changes`` past the first ``seen``, and ``group.resizes`` for
    each that changed a running group's size (the group's end, 0 nodes, is no resize); how many are seen."""
    for i in range(seen, len(changes)):
        nodes = changes[i][1]
        metrics.gauge("group.nodes", nodes, tags=tags)
        if i > 0 and nodes > 0 and changes[i - 1][1] > 0 and nodes != changes[i - 1][1]:
            metrics.incr("group.resizes", tags=tags)
    return max(seen, len(changes))


def spot_price_feed(terms: dict[str, Any]) -> Any:
    """The ``SpotPriceFeed`` a watch carries as plain values (``airflow_dtrain.aws.prices`` is imported only
    when a spot group's prices are read)."""
    from airflow_dtrain.aws.prices import SpotPriceFeed

    return SpotPriceFeed(**terms)


class WatchPrices:
    """``GroupWatch``'s price feed: it needs ``launcher``, ``name``, ``prices``, ``_prices_at`` and
    ``_feeding`` of the watch it is mixed into."""

    def feed_prices(self, *, wait: bool = False) -> None:
        """Every ``feed.every_s`` while the group runs: the spot prices in effect since its launch, written
        where its trainer's cap reads them (``CheckpointDir.record_prices``), from a thread of its own so that
        a slow price API never holds up the watch (``wait``: until it is written). A failed read is logged;
        the trainer goes on with the prices written last (at first: its launch price), and the group is billed
        again when it ends."""
        busy = self._feeding is not None and self._feeding.is_alive()
        if (
            self.prices
            and not busy
            and time.monotonic() - self._prices_at >= float(self.prices["feed"]["every_s"])
        ):
            self._prices_at = time.monotonic()
            self._feeding = threading.Thread(
                target=self._feed_once, name=f"spot-prices-{self.name}", daemon=True
            )
            self._feeding.start()
        if wait and self._feeding is not None:
            self._feeding.join()

    def _feed_once(self) -> None:
        feed, ledger = spot_price_feed(self.prices["feed"]), CheckpointDir(self.prices["ledger_uri"])
        try:
            entry = ledger.spend_entry(self.name)
            if not entry:
                return
            now = time.time()
            history = feed.history(float(entry["launched_at"]), now)
            if history:
                ledger.record_prices(self.name, {"prices_in_effect": [[round(t, 3), p] for t, p in history],
                                                 "zone": feed.zone, "instance_type": feed.instance_type,
                                                 "updated_at": time.time()})  # fmt: skip
                terms = self.deadline or self.prices.get("deadline")  # a trigger of an earlier version: there
                if terms:
                    follow_deadline(self.launcher, self.name, terms, ledger, entry, now, history)
        except Exception as err:  # the group goes on; the trainer's cap keeps the prices it has
            log.warning("Group %s: could not read the spot prices in effect in %s, or act on them (%s); its "
                        "cap counts the prices read last (at first: its launch price)", self.name, feed.zone,
                        err)  # fmt: skip


class WatchNodes:
    """``GroupWatch``'s view of an elastic group's size: it needs ``launcher``, ``name``, ``tags``,
    ``prices``, ``ledger_uri``, ``deadline``, ``deadline_every_s``, ``_deadline_at`` and ``nodes_seen`` of
    the watch it is mixed into."""

    def follow_nodes(self) -> None:
        """Each change of the group's size to the metrics, the changes into its spend file (billed over
        them). A spend file that cannot be written now is written at a later poll, or when the group ends.
        Every ``deadline_every_s``, a group that changed size has its budget deadline follow its spend
        (``follow_deadline``; a spot group's price feed does it for a spot group)."""
        changes = node_changes(self.launcher, self.name)
        if not changes:
            return
        self.nodes_seen = report_node_changes(changes, self.nodes_seen, self.tags)
        uri = self.ledger_uri or (self.prices or {}).get("ledger_uri")
        ledger = CheckpointDir(uri) if uri else None
        try:
            record_node_changes(ledger, self.name, changes)
            if ledger is not None and len(changes) > 1 and self.deadline and not self.prices:
                self._follow_deadline(ledger, changes)
        except (OSError, ValueError) as err:
            log.warning("Group %s: could not write its node changes into its spend file, or move its budget "
                        "deadline (%s)", self.name, err)  # fmt: skip

    def _follow_deadline(self, ledger: CheckpointDir, changes: list[list]) -> None:
        if time.monotonic() - self._deadline_at < self.deadline_every_s:
            return
        self._deadline_at = time.monotonic()
        entry = ledger.spend_entry(self.name)
        if entry and not entry.get("ended"):
            entry = {**entry, "node_changes": changes}
            follow_deadline(self.launcher, self.name, self.deadline, ledger, entry, time.time())


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
            self.log.warning("Group %s: the spot price history could not be read (%s): its $%.4f stays "
                             "counted at its launch price, $%.4f/node-h", name, err, entry["dollars"],
                             launch_price)  # fmt: skip
            return {
                **entry,
                "priced_at": f"launch price (the price history could not be read: {type(err).__name__})",
            }
        if repriced.get("dollars_at_prices_in_effect") is None:
            self.log.warning("Group %s: the spot price history does not reach back to its launch: its $%.4f "
                             "stays counted at its launch price, $%.4f/node-h", name, entry["dollars"],
                             launch_price)  # fmt: skip
            return repriced
        prices = sorted({p for _, p in repriced["prices_in_effect"]})
        self.log.info(
            "Group %s billed at the spot prices in effect while it ran ($%s/node-h): $%.4f; at its launch "
            "price "
            "($%.4f/node-h) $%.4f; the ledger counts $%.4f", name, ", ".join(f"{p:.4f}" for p in prices),
            repriced["dollars_at_prices_in_effect"], launch_price, repriced["dollars_at_launch_price"],
            repriced["dollars"],
        )  # fmt: skip
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
            "of the job $%.4f", spend.total_dollars, budget, left, step, need.steps_left, need.step_s,
            need.startup_s, need.save_s, need.usd_per_s * 3600, need.needed, need.to_finish,
        )  # fmt: skip
        if need.needed <= left:
            return False
        self.stopped_at_budget = {"group": name, "spent_usd": spend.total_dollars, "budget_usd": budget,
                                  "needed_usd": round(need.needed, 6),
                                  "reason": "a relaunch cannot reach its next checkpoint within the "
                                  "budget"}  # fmt: skip
        self.log.warning("Not relaunching after %s: $%.4f left cannot pay for a start-up and the next "
                         "checkpoint ($%.4f); the job stops at step %d within its $%.2f budget",
                         name, left, need.needed, step, budget)  # fmt: skip
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
            steps_left=max(0, train.steps - ledger.step), every=train.checkpoint.every, step_s=step_s,
            startup_s=most("startup_s", STARTUP_GUESS_S), save_s=save_s,
            # as the trainer's
            reserve_s=stop_reserve_s(save_s, train.checkpoint.grace_period_s, cost.stop_margin_s),
        )  # fmt: skip

    def _ended_at_cap(self, name: str, event: dict[str, Any]) -> bool:
        """At the job's dollar cap: the trainer stopped itself (exit 77), or the platform stopped it there
        (Kubernetes: the Job's activeDeadlineSeconds, derived from the budget). Either way, not relaunched."""
        by_itself = BUDGET_EXIT_CODE in (event.get("node_exit_codes") or {}).values()
        if not (by_itself or event.get("state") == GroupState.AT_BUDGET.value):
            return False
        self.current = name
        self.stopped_at_budget = {"group": name, "reason": event.get("message")}
        self.log.warning("Group %s %s at the job's dollar cap (%s): not relaunched", name,
                         "stopped itself" if by_itself else "was stopped by the platform",
                         event.get("message"))  # fmt: skip
        return True

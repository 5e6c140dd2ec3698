"""One running group's watch (``GroupWatch``), a poll at a time: its state, its log lines and events, and
what it follows besides: the spot prices in effect, the group's size, and its budget deadline with both.
``GroupSession`` (``airflow_dtrain.session.group``) drives it on the synchronous path, ``FSDPTrainTrigger``
from the triggerer.

``WatchPrices`` feeds a spot group's trainer the prices in effect since its launch (its cap reads them);
``WatchNodes`` reports an elastic group's sizes, writes them into its spend file and bills it over them; and
``follow_deadline`` moves the platform's budget deadline with what the group spent: earlier when the price
rises, later when an elastic group ran on fewer nodes. Both are mixed into ``GroupWatch``. The arithmetic is
``trainer.money``'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from airflow_dtrain import metrics
from airflow_dtrain.launchers.base import GroupState, GroupStatus, PodGroupLauncher, poll_group
from airflow_dtrain.status_line import StatusLine, group_events, has_trained, log_lines, note_rank_errors
from trainer.checkpoint.directory import CheckpointDir
from trainer.money.bill import at_prices_in_effect, billed
from trainer.money.deadline import deadline_words, repriced_deadline

log = logging.getLogger("airflow_dtrain.session.group")


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
    deadline = repriced_deadline(
        terms,
        spent_usd=others + float(group["dollars"]),
        price=price,
        elapsed_s=now - float(entry["launched_at"]),
    )
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
    log.warning(
        "Group %s: %s: its budget deadline moves from %ds to %s",
        name,
        why,
        before,
        deadline_words(deadline, "deadline"),
    )


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
                ledger.record_prices(
                    self.name,
                    {
                        "prices_in_effect": [[round(t, 3), p] for t, p in history],
                        "zone": feed.zone,
                        "instance_type": feed.instance_type,
                        "updated_at": time.time(),
                    },
                )
                terms = self.deadline or self.prices.get("deadline")  # a trigger of an earlier version: there
                if terms:
                    follow_deadline(self.launcher, self.name, terms, ledger, entry, now, history)
        except Exception as err:  # the group goes on; the trainer's cap keeps the prices it has
            log.warning(
                "Group %s: could not read the spot prices in effect in %s, or act on them (%s); its "
                "cap counts the prices read last (at first: its launch price)",
                self.name,
                feed.zone,
                err,
            )


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
            log.warning(
                "Group %s: could not write its node changes into its spend file, or move its budget "
                "deadline (%s)",
                self.name,
                err,
            )

    def _follow_deadline(self, ledger: CheckpointDir, changes: list[list]) -> None:
        if time.monotonic() - self._deadline_at < self.deadline_every_s:
            return
        self._deadline_at = time.monotonic()
        entry = ledger.spend_entry(self.name)
        if entry and not entry.get("ended"):
            entry = {**entry, "node_changes": changes}
            follow_deadline(self.launcher, self.name, self.deadline, ledger, entry, time.time())


LOG_TAIL_LINES = 40

EVENT_STATUS = {GroupState.SUCCEEDED: "success", GroupState.PREEMPTED: "preempted"}
"""How a group's end state reads in a trigger event (anything else is "error")."""


def report(
    log: Any, lines: list[str], status_line: StatusLine | None, events: list[dict] | None = None
) -> None:
    """One poll's output of a group into the task log, batched, then the status line when it is due: fed
    ``events`` (the poll's events, ``GroupWatch.events``) where the backend keeps them as data."""
    log_lines(log, lines)
    if status_line is not None:
        status_line.feed(lines, events=events)
        due = status_line.due()
        if due:
            log.info("status: %s", due)


def group_event(
    status: GroupStatus, tail: list[str], cursor: Any, errors: list[str] | None = None
) -> dict[str, Any]:
    """The payload both the trigger and the synchronous path hand to ``GroupSession.on_end``."""
    return {
        "rank_errors": list(errors or []),
        "status": EVENT_STATUS.get(status.state, "error"),
        "name": status.name,
        "state": status.state.value,
        "message": status.message,
        "node_exit_codes": {str(k): v for k, v in status.node_exit_codes.items()},
        "log_tail": tail,
        "log_cursor": cursor,
    }


@dataclass
class GroupWatch(WatchPrices, WatchNodes):
    """Looks at one group, one poll at a time: its state, its new log lines, and when a
    relaunched group trains again (``group.recovery_seconds``). Plain values, so the trigger
    can carry where it left off."""

    launcher: PodGroupLauncher
    name: str
    cursor: Any = None
    recovering_since: float | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))
    rank_errors: list[str] = field(default_factory=list)  # the ranks' first complaints (note_rank_errors)
    tags: dict[str, str] | None = None  # the job's statsd tags (metrics.job_tags)
    prices: dict[str, Any] | None = None
    """A spot group's price feed (``GroupSession.price_watch``): ``{"feed": SpotPriceFeed.to_dict(),
    "ledger_uri"}``."""
    _prices_at: float = field(default=float("-inf"), repr=False)
    _feeding: threading.Thread | None = field(default=None, repr=False)
    events_cursor: Any = None
    """Where the last poll's events ended (``status_line.group_events``)."""
    events: list[dict] = field(default_factory=list, repr=False)
    """The last poll's events."""
    ledger_uri: str | None = None
    """Where the job's spend files are (``GroupSession._ledger_dir``): an elastic group's node changes are
    written into its own at every poll (None: a spot group's ``prices["ledger_uri"]``, else only when the
    group ends, ``SessionMoney._close_spend``)."""
    nodes_seen: int = 0
    """How many of the group's node changes the metrics have had (``report_node_changes``)."""
    deadline: dict[str, Any] | None = None
    """The terms its budget deadline follows its spend by (``GroupSession.deadline_terms``; None: none)."""
    deadline_every_s: float = 30.0
    """How often a group that changed size has its budget deadline follow its spend (a spot group: at each
    read of its prices)."""
    _deadline_at: float = field(default=float("-inf"), repr=False)

    def poll(self) -> tuple[GroupStatus, list[str]]:
        """One look: the state, then the lines since the last look (complete once the state is terminal)."""
        status, chunk = poll_group(self.launcher, self.name, self.cursor)
        if not self.ended(status):
            self.feed_prices()
        self.cursor = chunk.cursor
        self.tail.extend(chunk.lines)
        note_rank_errors(self.rank_errors, chunk.lines)
        self.events, self.events_cursor = group_events(
            self.launcher, self.name, chunk.lines, self.events_cursor
        )
        if self.recovering_since is not None and has_trained(self.events):
            metrics.timing("group.recovery_seconds", time.time() - self.recovering_since, tags=self.tags)
            self.recovering_since = None
        self.follow_nodes()
        return status, chunk.lines

    @staticmethod
    def ended(status: GroupStatus) -> bool:
        return status.state.terminal or status.state == GroupState.NOT_FOUND

    def event(self, status: GroupStatus) -> dict[str, Any]:
        return group_event(status, list(self.tail), self.cursor, self.rank_errors)

"""The bill: dollars for a group's billed seconds, computed in one place.

EC2 bills a running instance to the second at the price in effect. ``dollars_at_prices`` is that bill for
``nodes`` nodes over an interval and a price history; every other figure here (an attempt billed at its
launch price, billed again at the prices in effect) is that function with a price history of one price or
of many.

An elastic group (``min_nodes`` < ``num_nodes``) changes size while it runs: its spend file then carries
``node_changes``, ``[[at, nodes], ...]`` (the nodes billed from ``at`` on, as its launcher saw them; the
first at the launch), and every figure here integrates nodes x seconds x price over those intervals. A
node is billed from its start to its end, waiting for a rendezvous included; the first entry's count
reaches back to ``launched_at`` (the provider opens the spend file just before the launcher starts the
nodes), and an entry of 0 nodes ends the billing (every node gone). An entry without ``node_changes``
(an all-or-nothing group, a ledger written before them) is ``nodes`` throughout. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def node_intervals(
    start: float, end: float, nodes: int, changes: Sequence[Sequence[float]] | None = None
) -> list[tuple[float, float, int]]:
    """``[(from, to, nodes), ...]`` covering ``start`` to ``end``: ``nodes`` throughout when ``changes``
    (``[[at, nodes], ...]``, in any order) is empty, else the count of the latest change at or before each
    second (the first change's count before it: the nodes were starting)."""
    points = sorted((float(at), int(n)) for at, n in changes or [])
    if not points:
        return [(start, end, nodes)] if end > start else []
    out = []
    for i, (at, count) in enumerate(points):
        since = start if i == 0 else max(at, start)
        until = min(points[i + 1][0] if i + 1 < len(points) else end, end)
        if until > since:
            out.append((since, until, count))
    return out


def node_hours(
    start: float, end: float, nodes: int, changes: Sequence[Sequence[float]] | None = None
) -> float:
    """Node-hours from ``start`` to ``end``: ``nodes`` throughout, or over ``changes``
    (``node_intervals``)."""
    return sum(n * (b - a) for a, b, n in node_intervals(start, end, nodes, changes)) / 3600


def dollars_at_prices(
    start: float, end: float, nodes: int, prices, changes: Sequence[Sequence[float]] | None = None
) -> float | None:
    """Dollars for ``nodes`` nodes (or the counts of ``changes``, ``node_intervals``) from ``start`` to
    ``end`` (unix seconds), each second at the price in effect then; ``prices`` is ``[(since,
    usd_per_node_hour), ...]``, in any order. None when no price was in effect at ``start`` (a history that
    begins later cannot say what the first seconds cost)."""
    points = sorted((float(t), float(p)) for t, p in prices)
    if not points or points[0][0] > start:
        return None
    usd_node_seconds = 0.0
    for a, b, count in node_intervals(start, end, nodes, changes):
        for i, (since, price) in enumerate(points):
            until = points[i + 1][0] if i + 1 < len(points) else b
            usd_node_seconds += count * price * max(0.0, min(until, b) - max(since, a))
    return usd_node_seconds / 3600


def dollars_at(
    start: float, end: float, nodes: int, price: float, changes: Sequence[Sequence[float]] | None = None
) -> float:
    """Dollars for ``nodes`` nodes (or ``changes``) from ``start`` to ``end`` at one price throughout (a
    launch price)."""
    return dollars_at_prices(start, max(start, end), nodes, [(start, price)], changes) or 0.0


def billed(entry: dict, *, until: float) -> dict:
    """``entry`` (an attempt's spend file) with its node-hours and dollars as of ``until``, never less than it
    already says (the trainer's last write and the provider's view of the end agree or the larger wins) --
    except over ``node_changes``: the recorded sizes are then the bill itself, so a figure written by a
    reader that did not know them (a worker restarted at another size, a program of your own billing
    ``nodes`` throughout), or billed up to a poll past a node's end, does not stay counted."""
    launched, changes = float(entry["launched_at"]), entry.get("node_changes")
    seconds = max(0.0, until - launched)
    hours = node_hours(launched, until, entry["nodes"], changes)
    dollars = dollars_at(launched, until, entry["nodes"], entry["price_per_node_hour"], changes)

    def kept(key: str, value: float) -> float:
        return round(value, 9) if changes else max(float(entry.get(key, 0.0)), round(value, 9))

    out = dict(entry)
    out["billed_s"] = max(float(entry.get("billed_s", 0.0)), round(seconds, 3))
    out["node_hours"] = kept("node_hours", hours)
    out["gpu_hours"] = kept("gpu_hours", hours * entry.get("gpus_per_node", 0))
    out["dollars"] = kept("dollars", dollars)
    out["updated_at"] = until
    return out


def at_prices_in_effect(
    entry: dict[str, Any], prices: Sequence[tuple[float, float]], *, until: float
) -> dict[str, Any]:
    """``entry`` (an attempt's spend file, billed up to ``until`` at its launch price) billed again at the
    spot prices in effect over its seconds: ``dollars`` becomes the larger of the two figures, and the entry
    keeps both (``dollars_at_launch_price``, ``dollars_at_prices_in_effect``) and the prices it used.
    Unchanged but for ``priced_at`` when ``prices`` do not cover the launch."""
    launched, nodes, changes = float(entry["launched_at"]), int(entry["nodes"]), entry.get("node_changes")
    at_prices = dollars_at_prices(launched, until, nodes, prices, changes)
    if at_prices is None:
        return {**entry, "priced_at": "launch price (the price history does not reach back to the launch)"}
    in_window = sorted((t, p) for t, p in prices if t < until)
    first = max(i for i, (t, _) in enumerate(in_window) if t <= launched)
    at_launch = dollars_at(launched, until, nodes, float(entry.get("price_per_node_hour", 0.0)), changes)
    return {
        **entry,
        "dollars": max(float(entry["dollars"]), round(at_prices, 9)),
        "dollars_at_launch_price": round(at_launch, 9),
        "dollars_at_prices_in_effect": round(at_prices, 9),
        "prices_in_effect": [[round(t, 3), p] for t, p in in_window[first:]],
        "priced_at": "prices in effect",
    }


def resizes(entry: dict[str, Any]) -> list[dict[str, float]]:
    """Each size change of a running group in ``entry`` (an attempt's spend file with ``node_changes``):
    ``{"at", "nodes_before", "nodes", "usd"}``, ``usd`` the launch-price dollars of the interval it ends
    (from the launch or the change before). The group's start and its end (0 nodes) are no resizes."""
    launched, price = float(entry["launched_at"]), float(entry.get("price_per_node_hour", 0.0))
    points = sorted((float(at), int(n)) for at, n in entry.get("node_changes") or [])
    out, since = [], launched
    for (_, before), (at, nodes) in zip(points, points[1:]):
        if before > 0 and nodes > 0 and nodes != before:
            out.append({"at": at, "nodes_before": before, "nodes": nodes,
                        "usd": round(dollars_at(since, at, before, price), 9)})  # fmt: skip
        since = at
    return out

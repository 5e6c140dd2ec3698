"""The bill: dollars for a group's billed seconds, computed in one place.

EC2 bills a running instance to the second at the price in effect. ``dollars_at_prices`` is that bill for
``nodes`` nodes over an interval and a price history; every other figure here (an attempt billed at its
launch price, billed again at the prices in effect) is that function with a price history of one price or
of many. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def dollars_at_prices(start: float, end: float, nodes: int, prices) -> float | None:
    """Dollars for ``nodes`` nodes from ``start`` to ``end`` (unix seconds), each second at the price in
    effect then; ``prices`` is ``[(since, usd_per_node_hour), ...]``, in any order. None when no price was in
    effect at ``start`` (a history that begins later cannot say what the first seconds cost)."""
    points = sorted((float(t), float(p)) for t, p in prices)
    if not points or points[0][0] > start:
        return None
    usd_seconds = 0.0
    for i, (since, price) in enumerate(points):
        until = points[i + 1][0] if i + 1 < len(points) else end
        usd_seconds += price * max(0.0, min(until, end) - max(since, start))
    return nodes * usd_seconds / 3600


def dollars_at(start: float, end: float, nodes: int, price: float) -> float:
    """Dollars for ``nodes`` nodes from ``start`` to ``end`` at one price throughout (a launch price)."""
    return dollars_at_prices(start, max(start, end), nodes, [(start, price)]) or 0.0


def billed(entry: dict, *, until: float) -> dict:
    """``entry`` (an attempt's spend file) with its node-hours and dollars as of ``until``, never less than it
    already says (the trainer's last write and the provider's view of the end agree or the larger wins)."""
    launched = float(entry["launched_at"])
    seconds = max(0.0, until - launched)
    node_hours = entry["nodes"] * seconds / 3600
    dollars = dollars_at(launched, until, entry["nodes"], entry["price_per_node_hour"])
    out = dict(entry)
    out["billed_s"] = max(float(entry.get("billed_s", 0.0)), round(seconds, 3))
    out["node_hours"] = max(float(entry.get("node_hours", 0.0)), round(node_hours, 9))
    out["gpu_hours"] = max(
        float(entry.get("gpu_hours", 0.0)), round(node_hours * entry.get("gpus_per_node", 0), 9)
    )
    out["dollars"] = max(float(entry.get("dollars", 0.0)), round(dollars, 9))
    out["updated_at"] = until
    return out


def at_prices_in_effect(
    entry: dict[str, Any], prices: Sequence[tuple[float, float]], *, until: float
) -> dict[str, Any]:
    """``entry`` (an attempt's spend file, billed up to ``until`` at its launch price) billed again at the
    spot prices in effect over its seconds: ``dollars`` becomes the larger of the two figures, and the entry
    keeps both (``dollars_at_launch_price``, ``dollars_at_prices_in_effect``) and the prices it used.
    Unchanged but for ``priced_at`` when ``prices`` do not cover the launch."""
    launched, nodes = float(entry["launched_at"]), int(entry["nodes"])
    at_prices = dollars_at_prices(launched, until, nodes, prices)
    if at_prices is None:
        return {**entry, "priced_at": "launch price (the price history does not reach back to the launch)"}
    in_window = sorted((t, p) for t, p in prices if t < until)
    first = max(i for i, (t, _) in enumerate(in_window) if t <= launched)
    at_launch = dollars_at(launched, until, nodes, float(entry.get("price_per_node_hour", 0.0)))
    return {
        **entry,
        "dollars": max(float(entry["dollars"]), round(at_prices, 9)),
        "dollars_at_launch_price": round(at_launch, 9),
        "dollars_at_prices_in_effect": round(at_prices, 9),
        "prices_in_effect": [[round(t, 3), p] for t, p in in_window[first:]],
        "priced_at": "prices in effect",
    }

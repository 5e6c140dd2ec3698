"""The job page's charts as Vega-Lite specifications, built here from what the job's files say and drawn in
the browser by vega-embed (``static/vendor``, served by the app: no CDN).

Vega-Lite because a chart is then data: the page draws it as SVG (each marker an element with its own label,
which a browser test and a screen reader can find), it redraws a live job's chart from new JSON without a
reload, and the same specification is what the tests check; matplotlib's report.png is drawn only when a job
is evaluated, and an image cannot be updated or asked what it shows.
"""

from __future__ import annotations

from typing import Any

MARKERS = {
    "preempted": ("preemption", "#d62728"),
    "relaunch": ("relaunch", "#2ca02c"),
    "stopped_at_budget": ("stopped at the budget", "#000000"),
    "failed": ("failure", "#9467bd"),
}
"""The job's events drawn as rules (its progress file's ``events``), and how each is labelled."""
WIDTH, HEIGHT = "container", 220


DRAWN_LAST = ("preempted", "stopped_at_budget", "failed")
"""Drawn over the other markers of their step (a relaunch shares its preemption's step)."""


def _markers(events: list[dict[str, Any]], x: str) -> list[dict[str, Any]]:
    out = []
    for event in sorted(events, key=lambda e: e["kind"] in DRAWN_LAST):
        if event["kind"] in MARKERS and isinstance(event.get(x), (int, float)):
            label, _ = MARKERS[event["kind"]]
            at = event[x] if x == "step" else event[x] * 1000
            out.append({x: at, "event": label, "label": f"{label} at step {event.get('step')}"})
    return out


def _rules(x: dict[str, Any]) -> dict[str, Any]:
    return {
        "mark": {"type": "rule", "strokeDash": [4, 3]},
        "encoding": {
            "x": x,
            "color": {
                "field": "event",
                "type": "nominal",
                "title": "event",
                "scale": {
                    "domain": [m[0] for m in MARKERS.values()],
                    "range": [m[1] for m in MARKERS.values()],
                },
            },
            # a preemption and the relaunch after it share a step: the preemption is drawn wider, below
            "strokeWidth": {
                "field": "event",
                "type": "nominal",
                "legend": None,
                "scale": {"domain": [m[0] for m in MARKERS.values()], "range": [5, 2, 2, 2]},
            },
            "description": {"field": "label"},
            "tooltip": [{"field": "label", "title": "event"}],
        },
    }


def _spec(title: str, layers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": title,
        "width": WIDTH,
        "height": HEIGHT,
        "layer": layers,
        "resolve": {"scale": {"color": "independent"}},
    }


def _loss(progress: dict[str, Any], held_out: list[list[Any]]) -> dict[str, Any]:
    step = {"field": "step", "type": "quantitative", "title": "step"}
    train = [
        {"step": p[0], "loss": p[1], "curve": "train"}
        for p in progress["history"]
        if isinstance(p[1], (int, float))
    ]
    held = [{"step": s, "loss": loss, "curve": "held-out"} for s, loss in held_out]
    layers = [
        {
            "data": {"values": train + held},
            "mark": {"type": "line", "point": len(held) < 50},
            "encoding": {
                "x": step,
                "y": {"field": "loss", "type": "quantitative", "title": "loss"},
                "color": {"field": "curve", "type": "nominal", "title": "loss"},
                "description": {"field": "curve"},
            },
        },
    ]
    markers = _markers(progress["events"], "step")
    if markers:
        layers.append({"data": {"values": markers}, **_rules(step)})
    return _spec("loss", layers)


def _throughput(progress: dict[str, Any]) -> dict[str, Any]:
    points = [
        {"step": p[0], "tokens_per_s": p[4]}
        for p in progress["history"]
        if len(p) >= 5 and isinstance(p[4], (int, float))
    ]
    return _spec(
        "throughput (tokens/s, whole group)",
        [
            {
                "data": {"values": points},
                "mark": "line",
                "encoding": {
                    "x": {"field": "step", "type": "quantitative"},
                    "y": {"field": "tokens_per_s", "type": "quantitative", "title": "tokens/s"},
                },
            },
        ],
    )


def _nodes(progress: dict[str, Any], attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """Nodes over time: each attempt from its launch (its node changes), to 0 at its end."""
    points = []
    for a in attempts:
        start = float(a["launched_at"])
        changes = [c for c in a.get("node_changes") or [] if isinstance(c, list) and len(c) == 2]
        for at, nodes in changes or [[start, a.get("nodes") or 0]]:
            points.append({"time": float(at) * 1000, "nodes": nodes, "attempt": a.get("attempt")})
        if a.get("ended") and isinstance(a.get("billed_s"), (int, float)):
            points.append(
                {"time": (start + float(a["billed_s"])) * 1000, "nodes": 0, "attempt": a.get("attempt")}
            )
    time_x = {"field": "time", "type": "temporal", "title": "time"}
    layers = [
        {
            "data": {"values": sorted(points, key=lambda p: p["time"])},
            "mark": {"type": "line", "interpolate": "step-after"},
            "encoding": {"x": time_x, "y": {"field": "nodes", "type": "quantitative", "title": "nodes"}},
        }
    ]
    markers = _markers(progress["events"], "time")
    if markers:
        layers.append({"data": {"values": markers}, **_rules(time_x)})
    return _spec("nodes over time (resizes and preemptions marked)", layers)


def _spend(attempts: list[dict[str, Any]], budget: float | None) -> dict[str, Any]:
    """Cumulative spend: each attempt bills linearly while it runs, against the cap."""
    total, points = 0.0, []
    for a in attempts:
        launched, billed = float(a["launched_at"]), float(a.get("billed_s") or 0)
        points.append({"time": launched * 1000, "usd": round(total, 6)})
        total += float(a.get("dollars") or 0)
        points.append({"time": (launched + billed) * 1000, "usd": round(total, 6)})
    time_x = {"field": "time", "type": "temporal", "title": "time"}
    layers = [
        {
            "data": {"values": points},
            "mark": "line",
            "encoding": {"x": time_x, "y": {"field": "usd", "type": "quantitative", "title": "US$ spent"}},
        }
    ]
    if budget:
        layers.append(
            {
                "data": {"values": [{"usd": budget, "label": f"cap ${budget:,.2f}"}]},
                "mark": {"type": "rule", "color": "#d62728"},
                "encoding": {
                    "y": {"field": "usd", "type": "quantitative"},
                    "description": {"field": "label"},
                    "tooltip": [{"field": "label"}],
                },
            }
        )
    return _spec("spend against the cap", layers)


def curves(
    progress: dict[str, Any],
    attempts: list[dict[str, Any]],
    *,
    budget_usd: float | None,
    held_out: list[list[Any]],
) -> dict[str, dict[str, Any]]:
    """Every chart of the job page: ``{"loss", "throughput", "nodes", "spend"}`` (``progress`` checked by
    ``read``; ``held_out``: ``[[step, loss], ...]`` of the job's evaluations)."""
    progress = {"history": progress.get("history") or [], "events": progress.get("events") or []}
    return {
        "loss": _loss(progress, held_out),
        "throughput": _throughput(progress),
        "nodes": _nodes(progress, attempts),
        "spend": _spend(attempts, budget_usd),
    }

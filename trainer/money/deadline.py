"""The budget deadline: when the platform stops a group at the job's dollar cap, with nobody watching.

``budget_deadline`` derives it at the launch from the money left and the group's price; Kubernetes makes it
the Job's ``activeDeadlineSeconds``, the local backend's supervisor keeps it. ``repriced_deadline`` derives
it again while the group runs (earlier when the spot price rises, later when the group spent less than
assumed), and ``deadline_words`` says how it was derived. The result is plain data (a dict), so a launcher,
a trigger and a Job annotation all carry it. Standard library only; ``spec`` is an
``airflow_dtrain.job.spec.JobSpec`` (only its budget, price, nodes, limits and the trainer's grace period and
stop margin are read).
"""

from __future__ import annotations

import math
from typing import Any


def budget_deadline(spec: Any, spent_usd: float = 0.0) -> dict[str, Any] | None:
    """When the platform stops a group at the job's dollar cap, in seconds after its launch, and how (None: no
    budget, or no price: nothing billed). Kubernetes makes it the Job's ``activeDeadlineSeconds``; the local
    backend's supervisor keeps it. Either stops the group with SIGTERM (each rank saves its step) and, after
    the grace period, SIGKILL, even with nobody on the Airflow side watching.

    The money left, (budget - ``spent_usd``) / (price per node-hour x nodes), buys ``left_s`` seconds. The
    deadline comes the grace period and ``cost.stop_margin_s`` before them, so that even a group that ignores
    SIGTERM (a hung trainer, a program of your own) is killed, and its end seen, within the budget: the money
    is a hard limit, not a target. The bundled trainer keeps the same reserve (``projection.stop_reserve_s``)
    and stops itself, exit 77, just before this deadline; the deadline is the backstop for when it cannot. On
    Kubernetes the kubelet allows the pods 15 s more than the grace period (``termination_grace_period_s``):
    within the budget while ``cost.stop_margin_s`` is at least that (default 30).

    The job's ``max_runtime_s`` (the limits' ceiling, set even without a budget) bounds it too: the earlier of
    the two wins, and the result then says so (``"by": "max_runtime_s"``), with ``budget_usd`` None when there
    is none.

    :param spent_usd: what the job has spent before this group (its spend ledger).
    """
    grace, margin = math.ceil(spec.train.checkpoint.grace_period_s), math.ceil(spec.train.cost.stop_margin_s)
    by_budget = None
    if spec.budget_usd is not None and spec.price_per_node_hour > 0:
        by_budget = deadline_terms(budget_usd=spec.budget_usd, spent_usd=spent_usd, nodes=spec.num_nodes,
                              price=spec.price_per_node_hour, grace=grace, margin=margin)  # fmt: skip
    runtime = getattr(spec, "max_runtime_s", None)
    if runtime is None or (by_budget is not None and by_budget["seconds"] <= runtime):
        return by_budget
    return {
        **(by_budget or {"budget_usd": None, "spent_usd": round(spent_usd, 6), "nodes": spec.num_nodes,
                         "usd_per_hour": spec.price_per_node_hour * spec.num_nodes, "grace_s": grace,
                         "margin_s": margin, "save": "within"}),
        "seconds": int(runtime), "by": "max_runtime_s",
    }  # fmt: skip


def deadline_terms(
    *,
    budget_usd: float,
    spent_usd: float,
    nodes: int,
    price: float,
    grace: int,
    margin: int,
    elapsed_s: float = 0.0,
) -> dict[str, Any]:
    """``budget_deadline``'s arithmetic, ``elapsed_s`` into the group's life: the seconds after its launch."""
    usd_per_hour = price * nodes
    left_s = max(0.0, budget_usd - spent_usd) / usd_per_hour * 3600
    return {
        "seconds": max(1, math.floor(elapsed_s + left_s) - grace - margin), "budget_usd": budget_usd,
        "spent_usd": round(spent_usd, 6), "nodes": nodes, "usd_per_hour": usd_per_hour, "grace_s": grace,
        "margin_s": margin, "save": "within",
    }  # fmt: skip


def repriced_deadline(
    deadline: dict[str, Any], *, spent_usd: float, price: float, elapsed_s: float
) -> dict[str, Any]:
    """A running group's ``budget_deadline`` again, ``elapsed_s`` after its launch, from what was spent and
    the price now: ``spent_usd`` (every attempt, this group's seconds so far as billed) leaves money that buys
    the time ahead at ``price`` on the deadline's ``nodes``. Earlier than the launch's when the spot price
    rose; later when the group spent less than its launch deadline assumed (an elastic group on fewer nodes).
    Never past the job's ``max_runtime_s`` (``deadline["max_runtime_s"]``, or a deadline that ceiling set).
    The result says what it was derived from (``repriced``), for the deadline's words and the Job's
    annotation."""
    if deadline.get("budget_usd") is None:
        return deadline  # bound by max_runtime_s alone: no price moves it
    new = deadline_terms(budget_usd=deadline["budget_usd"], spent_usd=spent_usd, nodes=int(deadline["nodes"]),
                         price=price, grace=deadline["grace_s"], margin=deadline["margin_s"],
                         elapsed_s=elapsed_s)  # fmt: skip
    runtime = deadline.get("max_runtime_s")
    if deadline.get("by") == "max_runtime_s":
        runtime = deadline["seconds"]
    if runtime is not None and new["seconds"] >= runtime:
        return {**new, "seconds": int(runtime), "by": "max_runtime_s", "max_runtime_s": int(runtime)}
    if runtime is not None:
        new["max_runtime_s"] = int(runtime)
    return {**new, "repriced": {"elapsed_s": round(elapsed_s, 3)}}


def deadline_words(deadline: dict[str, Any], name: str) -> str:
    """``budget_deadline``'s result for a person: ``name=seconds`` and how the money left gave it."""
    if deadline.get("by") == "max_runtime_s":
        return (
            f"{name}={deadline['seconds']} (the job's max_runtime_s ceiling"
            + (", before its budget's" if deadline.get("budget_usd") is not None else ", no budget")
            + ")"
        )
    left = max(0.0, deadline["budget_usd"] - deadline["spent_usd"])
    save = f"less {deadline['grace_s']}s for a final save and {deadline.get('margin_s', 0)}s to exit"
    repriced = deadline.get("repriced")
    if repriced:
        return (
            f"{name}={deadline['seconds']} (set {repriced['elapsed_s']:.0f}s after the launch, when "
            f"${left:.4f} was left of the ${deadline['budget_usd']:.2f} budget at the price then in effect, "
            f"${deadline['usd_per_hour']:.4f}/h for {deadline['nodes']} node(s), {save})"
        )
    return (
        f"{name}={deadline['seconds']} (${left:.4f} left of the ${deadline['budget_usd']:.2f} budget at "
        f"${deadline['usd_per_hour']:.4f}/h, {save})"
    )

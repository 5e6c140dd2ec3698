"""The budget policy: train on spot, train on on-demand, wait for a better price, or stop.

Pure functions over plain numbers, so the policy is tested table by table and the
benchmark (``benchmarks/spot_cost.py``) runs the very code the operator runs.

Estimates::

    hours            = steps_remaining × step_time_s / 3600
    start-up         = restart_overhead_s / 3600 for a capacity the job does not run on now
                       (only when ``current`` is given; ``Choice.WAIT``: nothing runs, both pay it)
    on-demand hours  = hours + its start-up
    on-demand cost   = on-demand hours × num_nodes × on_demand_price
    spot hours       = hours × (1 + overhead) + its start-up
    overhead         = interruption_rate_per_hour × (restart_overhead_s + lost_work_s) / 3600
    spot cost        = spot hours × num_nodes × spot_price
    spot in time     = spot hours fit the deadline and, when the budget pays for on-demand and a first
                       preemption before spot is done (over its start-up and hours) is likelier than
                       ``max_late_risk``, a preemption right after the start-up still leaves time to finish
                       on on-demand (hours + lost work + start-up)

An elastic group (``min_nodes`` < ``num_nodes``) offered k spot nodes, ``min_nodes`` <= k < ``num_nodes``,
trains on k: its spot hours are ``hours`` × num_nodes / k with the overhead, plus its start-up and one resize
(``resize_overhead_s``) to grow back; a lost node costs it ``estimates.loss_s`` (two resizes, the wait for a
replacement and a node's start-up), not a relaunch, in the overhead and the deadline guard's preemption; its
spot cost is the work's node-hours (the same at any size: the global batch is fixed) and every overhead
billed on all ``num_nodes``, the most any size it may change to can bill, so the cap holds at every size. The
decision records the node count it trains on (``Decision.nodes``).

Topped up (``top_up_on_demand``): where rule 4 or 7 would take on-demand on all the nodes (or 7 could not,
that being beyond the budget), an elastic group offered k spot nodes (1 <= k < ``num_nodes``) trains on those
k and ``num_nodes`` - k on-demand ones instead, at full speed, when that is in time within budget and cheaper:
hours with the interruption overhead of the k (a lost one: ``estimates.loss_s``) plus a start-up (a resize
when the group runs already, the joining nodes' boot billed at their price), cost at k × spot +
(``num_nodes`` - k) × on-demand per hour. The decision is spot with ``Decision.on_demand_nodes`` =
``num_nodes`` - k. A group topped up already (``topped_up``) stays so while that fits (after rule 5b, which
it skips), until spot alone fits (rule 5).

Decision, first row that applies:

==  ================================================================  =========
#   condition                                                         decision
==  ================================================================  =========
1   no steps remaining                                                stop
2   no step time (none measured, no estimate) and a budget is set     stop
3   no price at all (spot nor on-demand)                              stop
4   deadline guard (``deadline_guard``, ``current`` given, not on     on_demand
    spot; topped up: above): less time to spare after the hours
    left than a spot (re)launch and one preemption (2 ×
    ``restart_overhead_s`` + ``lost_work_s``), a first preemption before spot is done
    likelier than ``GUARD_RISK`` (0.5), on-demand within budget and
    in time
5   spot offered for all ``num_nodes`` at once (an elastic group:     spot
    at least ``min_nodes``, trained on the k offered), acceptable
    risk, spot cost ≤ budget, spot in time (with ``min_finish_chance``: the chance of each is at least that)
    -- unless on-demand also fits (budget and deadline) and costs no more, start-ups included: then on-demand
    (a job on on-demand stays for a saving smaller than the switch's start-up)
5b  an elastic group on spot within budget but, on its k nodes, not  spot
    in time: on-demand begun after one more ``wait_interval_s``
    (its start-up, no progress counted) still in time within the
    budget left after that interval on spot (its time at k is an
    upper bound: it grows back when the nodes return)
6   waiting allowed, and after ``wait_interval_s`` spot at the        wait
    hoped-for price or on-demand could still finish in time within
    budget (on on-demand: spot at the hoped-for price)
7   on-demand cost ≤ budget and on-demand in time (topped up, above:  on_demand
    also where on-demand on all is beyond the budget)
8   ``allow_late``, spot or on-demand within budget (late): on-      that one
    demand only if it finishes before spot would even with no
    preemption (start-ups included), else spot
9   ``allow_late``, waiting allowed, spot at the hoped-for price      wait
    within budget (late)
10  otherwise (nothing fits the budget, or nothing in time and        stop
    ``allow_late`` off)
==  ================================================================  =========

"≤ budget" compares in whole micro-dollars, so a cost exactly at the budget is within it.
Nothing is ever launched whose estimate exceeds the remaining budget, except spot with ``min_finish_chance``
set, when its chance of finishing within the budget is at least that. The chance counts preemptions as
Poisson at the interruption rate over the spot hours, each costing ``restart_overhead_s`` + ``lost_work_s``
of the group (money at the spot price, and time: "spot in time" is then the chance that they fit before the
deadline, in place of the expected spot hours). The money stays a hard limit either way: the trainer's
budget guard and the platform's deadline stop the run at the remaining budget, having saved its step, when
the draws are unkind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from airflow_dtrain.spot.budget_facts import Facts
from airflow_dtrain.spot.estimates import GUARD_RISK, BudgetInputs, Choice, Decision, spot_overhead


class Rule(NamedTuple):
    """One row of the decision table: when ``applies``, the decision is ``decision``'s."""

    name: str
    applies: Callable[[Facts], bool]
    decision: Callable[[Facts], Decision]


# -- 1-3: nothing to estimate ----------------------------------------------------------------------
def _complete(f: Facts) -> bool:
    return f.i.steps_remaining == 0


def _stop_complete(f: Facts) -> Decision:
    return Decision(
        Choice.STOP, "no steps remaining: the job is complete", 0.0, 0.0, 0.0, 0.0, f.i.remaining_budget
    )


def _no_step_time(f: Facts) -> bool:
    return f.i.step_time_s is None and f.i.remaining_budget is not None


def _stop_no_step_time(f: Facts) -> Decision:
    return Decision(
        Choice.STOP,
        "unknown step time: no measured step_time_s in a checkpoint manifest and no estimate, "
        f"so no estimate can be shown to fit the remaining budget {f.money}",
        remaining_budget=f.i.remaining_budget,
    )


def _no_price(f: Facts) -> bool:
    return f.i.spot_price is None and f.i.on_demand_price is None


def _stop_no_price(f: Facts) -> Decision:
    return Decision(
        Choice.STOP,
        "no price known: neither a spot offer nor an on-demand price",
        remaining_budget=f.i.remaining_budget,
    )


# -- 4: Can't Be Late's safety net -----------------------------------------------------------------
def _deadline_guard(f: Facts) -> bool:
    """Where a preemption before spot is done is likelier than not, a (re)launch on spot that one preemption
    would make late is a losing bet, and on-demand that is in time within budget wins."""
    i = f.i
    return (
        i.deadline_guard and f.tracked and i.current != Choice.SPOT and i.deadline_s is not None
        and f.hours is not None and f.preempt_risk > GUARD_RISK and f.od_cost_ok and f.od_in_time
        and f.spare_h < f.guard_h
    )  # fmt: skip


def _on_demand_by_guard(f: Facts) -> Decision:
    return f.made(
        Choice.ON_DEMAND,
        f"on-demand to the deadline (deadline guard): {f.spare_h:.2f} h to spare "
        f"after {f.est} of work, less than a spot (re)launch and one preemption ({f.guard_h:.2f} h), "
        f"which is likelier than not ({f.preempt_risk:.0%}); on-demand ${f.od_cost:.2f} finishes in time "
        f"within {f.money}",
    )


# -- 4b, 7b: an elastic group topped up with on-demand, in place of on-demand on all its nodes -------------
def _guard_topped_up(f: Facts) -> bool:
    return _deadline_guard(f) and f.top_up_fits


def _top_up(f: Facts) -> Decision:
    i, (k, hours, cost) = f.i, f.top_up
    return f.made(
        Choice.SPOT,
        f"spot on {k} and on-demand on {i.num_nodes - k} of {i.num_nodes} node(s) "
        f"({f.spot_reason or 'deadline guard'}): "
        f"{hours:.2f} h × ({k} × ${i.spot_price:.4f} + {i.num_nodes - k} × ${i.on_demand_price:.4f})/h"
        f" = ${cost:.2f} within {f.money}, on-demand on all would cost ${f.od_cost:.2f}",
        top_up=True,
    )


# -- 5: spot fits, unless on-demand fits too and costs no more -------------------------------------
def _both_fit_on_demand_no_dearer(f: Facts) -> bool:
    """The cheaper of two capacities that both fit, start-ups included, is on-demand."""
    both = (
        not f.spot_why and f.od_cost_ok and f.od_in_time and f.od_cost is not None and f.spot_cost is not None
    )
    return both and f.od_cost <= f.spot_cost


def _stays_on_demand(f: Facts) -> bool:
    return _both_fit_on_demand_no_dearer(f) and f.i.current == Choice.ON_DEMAND


def _stay_on_demand(f: Facts) -> Decision:
    i = f.i
    return f.made(
        Choice.ON_DEMAND,
        f"stay on on-demand: spot would save ${f.od_cost - f.spot_cost:.2f}, no more than nothing once the "
        f"switch's start-up is paid ({i.restart_overhead_s:.0f} s × {i.num_nodes} node(s) at the spot price"
        f" is in the spot estimate ${f.spot_cost:.2f}; on-demand ${f.od_cost:.2f})",
    )


def _on_demand_no_dearer(f: Facts) -> Decision:
    return f.made(
        Choice.ON_DEMAND,
        f"on-demand ${f.od_cost:.2f} is no dearer than spot ${f.spot_cost:.2f}, start-ups included",
    )


def _spot_fits(f: Facts) -> bool:
    return not f.spot_why


def _spot(f: Facts) -> Decision:
    i, chance = f.i, f.chance
    return f.made(
        Choice.SPOT,
        f"spot: {f.est} × {i.num_nodes} node(s)"
        + (
            f" (on {i.spot_nodes} of them now: {f.hours * i.slowdown:.2f} h, then a "
            f"{i.resize_overhead_s:.0f} s resize to grow back, billed on all)"
            if i.spot_nodes != i.num_nodes
            else ""
        )
        + f" × ${i.spot_price:.4f}/h × (1 + {spot_overhead(i):.3f} interruption overhead)"
        + (f" + {f.spot_start:.2f} h start-up" if f.spot_start else "")
        + f" = ${f.spot_cost or 0:.2f}"
        + (
            f", {chance:.0%} chance of finishing within {f.money} (min_finish_chance "
            f"{i.min_finish_chance:.0%}; the trainer's budget cap stops it at the budget otherwise)"
            if chance is not None
            else f" within {f.money}"
        )
        + (f" (on-demand would cost ${f.od_cost:.2f})" if f.od_cost is not None else ""),
    )


def _elastic_keeps_spot(f: Facts) -> bool:
    """An elastic group on spot, too slow on the k nodes it has to be sure of the deadline, but within budget,
    stays while on-demand after one more interval would still be in time within budget: its time at k is an
    upper bound (it grows back when the nodes return), and on-demand is kept as the fallback."""
    i = f.i
    return (
        i.elastic and i.current == Choice.SPOT and not i.topped_up and f.spot_offered and not f.risky
        and f.spot_cost_ok and not f.spot_time_ok and f.fallback_later_ok
    )  # fmt: skip


def _keep_spot(f: Facts) -> Decision:
    i = f.i
    return f.made(
        Choice.SPOT,
        f"stay on spot on {i.spot_nodes} of {i.num_nodes} node(s) for {i.wait_interval_s:.0f} s "
        f"({f.spot_reason}): an elastic group grows back when the nodes return, and on-demand begun after "
        f"that still finishes in time within {f.money}",
    )


# -- 6-7: wait for spot, else on-demand in time ----------------------------------------------------
def _wait_pays(f: Facts) -> bool:
    return f.may_wait and f.wait_pays


def _wait(f: Facts) -> Decision:
    i = f.i
    return f.made(
        Choice.WAIT,
        f"wait {i.wait_interval_s:.0f} s for spot ({f.spot_reason}); "
        f"waited {i.waited_s:.0f} of {i.max_wait_s:.0f} s",
    )


def _on_demand_fits(f: Facts) -> bool:
    return f.i.on_demand_price is not None and f.od_cost_ok and f.od_in_time


def _on_demand(f: Facts) -> Decision:
    i = f.i
    return f.made(
        Choice.ON_DEMAND,
        f"on-demand ({f.spot_reason}): {f.est} × {i.num_nodes} node(s) × ${i.on_demand_price:.4f}/h"
        + (f" + {f.od_start:.2f} h start-up" if f.od_start else "")
        + f" = ${f.od_cost or 0:.2f} within {f.money}",
    )


# -- 8-9: late within budget, if allowed -----------------------------------------------------------
# On-demand only when it is sure to finish first (spot's hours without a preemption are longer); spot's
# expected preemptions alone do not buy on-demand at several times the price for a result late either way.
def _late_on_demand_first(f: Facts) -> bool:
    return f.i.allow_late and f.od_late and (not f.spot_late or f.od_hours < f.unpreempted_h)


def _late_on_demand(f: Facts) -> Decision:
    return f.made(
        Choice.ON_DEMAND,
        f"on-demand past the deadline ({f.spot_reason}; {f.od_why}), the first to finish within budget "
        "even if spot is never preempted; "
        f"allow_late: ${f.od_cost or 0:.2f} within {f.money}",
    )


def _late_within_budget(f: Facts) -> bool:
    return f.i.allow_late and (f.spot_late or f.od_late)


def _late_spot(f: Facts) -> Decision:
    return f.made(
        Choice.SPOT,
        f"spot past the deadline ({f.spot_reason}; {f.od_why}), within budget and no later than on-demand "
        "unless preempted; "
        "allow_late: "
        + (
            f"a {f.chance:.0%} chance within {f.money}"
            if f.chance is not None
            else f"${f.spot_cost or 0:.2f} within {f.money}"
        ),
    )


def _late_wait_pays(f: Facts) -> bool:
    return f.i.allow_late and f.may_wait and f.hours is not None and f.target_fit[0]


def _late_wait(f: Facts) -> Decision:
    i, target_chance = f.i, f.target_fit[2]
    return f.made(
        Choice.WAIT,
        f"wait {i.wait_interval_s:.0f} s for spot at ${f.target:.4f}/h, past the deadline "
        f"({f.spot_reason}; {f.od_why}); "
        "allow_late: "
        + (
            f"a {target_chance:.0%} chance within {f.money}"
            if target_chance is not None
            else f"${f.target_cost:.2f} within {f.money}"
        ),
    )


# -- 10: no estimate at all, else stop -------------------------------------------------------------
def _no_estimate(f: Facts) -> bool:
    return f.hours is None and f.i.on_demand_price is not None


def _on_demand_unestimated(f: Facts) -> Decision:
    return f.made(Choice.ON_DEMAND, f"on-demand ({f.spot_reason}): no step time to estimate, no budget")


def _always(f: Facts) -> bool:
    return True


def _stop(f: Facts) -> Decision:
    late = "" if f.i.allow_late else " (allow_late is off: finishing past the deadline is not an option)"
    return f.made(Choice.STOP, f"over budget or past the deadline: {f.spot_reason}; {f.od_why}{late}")


RULES: tuple[Rule, ...] = (
    Rule("complete", _complete, _stop_complete),
    Rule("no step time", _no_step_time, _stop_no_step_time),
    Rule("no price", _no_price, _stop_no_price),
    Rule("deadline guard, topped up", _guard_topped_up, _top_up),
    Rule("deadline guard", _deadline_guard, _on_demand_by_guard),
    Rule("stay on on-demand", _stays_on_demand, _stay_on_demand),
    Rule("on-demand no dearer", _both_fit_on_demand_no_dearer, _on_demand_no_dearer),
    Rule("spot fits", _spot_fits, _spot),
    Rule("elastic keeps spot", _elastic_keeps_spot, _keep_spot),
    Rule("stays topped up", lambda f: f.i.topped_up > 0 and f.top_up_fits, _top_up),
    Rule("wait", _wait_pays, _wait),
    Rule("topped up with on-demand", Facts.top_up_fits.fget, _top_up),
    Rule("on-demand fits", _on_demand_fits, _on_demand),
    Rule("late on-demand", _late_on_demand_first, _late_on_demand),
    Rule("late spot", _late_within_budget, _late_spot),
    Rule("late wait", _late_wait_pays, _late_wait),
    Rule("on-demand unestimated", _no_estimate, _on_demand_unestimated),
    Rule("stop", _always, _stop),
)
"""The decision table of this module's docstring, in order: the first rule that applies decides."""


def decide(inputs: BudgetInputs) -> Decision:
    """The decision for ``inputs`` and why: the first of ``RULES`` that applies (this module's docstring)."""
    facts = Facts(inputs)
    return next(rule.decision(facts) for rule in RULES if rule.applies(facts))

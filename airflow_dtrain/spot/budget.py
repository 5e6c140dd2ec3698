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

Decision, first row that applies:

==  ================================================================  =========
#   condition                                                         decision
==  ================================================================  =========
1   no steps remaining                                                stop
2   no step time (none measured, no estimate) and a budget is set     stop
3   no price at all (spot nor on-demand)                              stop
4   deadline guard (``deadline_guard``, ``current`` given, not on     on_demand
    spot): less time to spare after the hours left than a spot
    (re)launch and one preemption (2 × ``restart_overhead_s`` +
    ``lost_work_s``), a first preemption before spot is done
    likelier than ``GUARD_RISK`` (0.5), on-demand within budget and
    in time
5   spot offered for all ``num_nodes`` at once, acceptable risk,      spot
    spot cost ≤ budget, spot in time (with ``min_finish_chance``:
    the chance of each is at least that) -- unless
    on-demand also fits (budget and deadline) and costs no more,
    start-ups included:
    then on-demand (a job on on-demand stays for a saving smaller
    than the switch's start-up)
6   waiting allowed, and after ``wait_interval_s`` spot at the        wait
    hoped-for price or on-demand could still finish in time within
    budget
7   on-demand cost ≤ budget and on-demand in time                     on_demand
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

import enum
import math
from dataclasses import asdict, dataclass
from typing import Any

from trainer.capacity import Capacity


GUARD_RISK = 0.5
"""The deadline guard takes on-demand when a first preemption before spot is done is likelier than this."""


class Choice(str, enum.Enum):
    """The decision: train on a capacity (spelled as ``Capacity``), wait, or stop."""

    SPOT = Capacity.SPOT.value
    ON_DEMAND = Capacity.ON_DEMAND.value
    WAIT = "wait"
    STOP = "stop"

    @property
    def capacity(self) -> Capacity | None:
        """The capacity to train on, or None for wait / stop."""
        return Capacity(self.value) if self in (Choice.SPOT, Choice.ON_DEMAND) else None


@dataclass(frozen=True, kw_only=True)
class BudgetInputs:
    """What the policy decides on. Prices are US$ per node-hour; None means unknown."""

    steps_remaining: int
    """Optimizer steps left to train."""
    step_time_s: float | None
    """Seconds per optimizer step (measured, from the latest checkpoint manifest, or estimated)."""
    num_nodes: int = 1
    spot_price: float | None = None
    """The chosen spot offer's price; None when there is no acceptable offer now."""
    on_demand_price: float | None = None
    remaining_budget: float | None = None
    """US$ left to spend; None means no budget."""
    interruption_rate_per_hour: float = 0.05
    """Expected interruptions of the group per hour on spot (any node)."""
    max_interruption_rate_per_hour: float = math.inf
    """Above this risk, spot is not used."""
    restart_overhead_s: float = 600.0
    """Time an interruption costs besides lost work: new capacity, start-up, checkpoint load."""
    lost_work_s: float = 0.0
    """Work lost per interruption; about one step when the warning triggers a checkpoint, half
    the checkpoint interval when it does not."""
    deadline_s: float | None = None
    """Seconds left until the job must be finished; None means no deadline."""
    waited_s: float = 0.0
    """How long this job has already waited for spot."""
    max_wait_s: float = 0.0
    """How long the job may wait for a spot offer in all (0: never wait)."""
    wait_interval_s: float = 900.0
    """How long one wait lasts before the next decision."""
    wait_target_price: float | None = None
    """The spot price hoped for when waiting (default: the spot limit, else on-demand)."""
    spot_nodes_available: int | None = None
    """Spot nodes of the offer that can be had at once (a capacity count); None: as many as the job needs.
    A group needs all of its nodes at once: fewer is no spot at all."""
    current: Choice | None = None
    """What the job runs on now (a decision taken again while it trains): a switch from on-demand to spot
    must pay for its start-up (``restart_overhead_s`` of the group at the spot price) out of its saving.
    When given, every capacity the job does not run on now is charged its start-up (time and money):
    ``Choice.WAIT`` means nothing runs, so both pay it. None: start-ups are not estimated."""
    max_late_risk: float = 0.0
    """The chance of a first preemption before the spot run is done (over its start-up and its work) up to
    which spot is used without keeping time to finish on on-demand after one (0: time for the fallback is
    always kept)."""
    min_finish_chance: float | None = None
    """Spot fits the budget, and the deadline, when the chance that it finishes within it, and by it, is at
    least this (preemptions Poisson at ``interruption_rate_per_hour``, each costing ``restart_overhead_s`` +
    ``lost_work_s``; 0: any chance at all); the trainer's hard cap stops a run that is out of luck.
    None: the expected spot cost and hours must fit."""
    deadline_guard: bool = True
    """Can't Be Late's safety net (Wu et al., NSDI'24), where a preemption is likelier than not: when ``current``
    is given and is not spot, the time to spare before the deadline after the remaining hours is less than a
    spot (re)launch and one preemption (2 × ``restart_overhead_s`` + ``lost_work_s``), and a first preemption
    before spot would be done is likelier than ``GUARD_RISK``: on-demand, when it finishes in time within the
    budget, whatever ``max_late_risk`` and ``min_finish_chance`` accept. Off: only they keep time for the
    fallback."""
    allow_late: bool = True
    """Whether finishing past the deadline within the budget (spot, or a wait for spot) beats stopping.
    Off: once neither capacity can finish in time within the budget, the job stops."""

    def __post_init__(self) -> None:
        checks = {
            "steps_remaining": self.steps_remaining is not None and self.steps_remaining >= 0,
            "step_time_s": self.step_time_s is None or self.step_time_s > 0,
            "num_nodes": self.num_nodes >= 1,
            "spot_price": self.spot_price is None or self.spot_price >= 0,
            "on_demand_price": self.on_demand_price is None or self.on_demand_price >= 0,
            "interruption_rate_per_hour": self.interruption_rate_per_hour >= 0,
            "restart_overhead_s": self.restart_overhead_s >= 0,
            "lost_work_s": self.lost_work_s >= 0,
            "wait_interval_s": self.wait_interval_s > 0,
            "max_wait_s": self.max_wait_s >= 0,
            "spot_nodes_available": self.spot_nodes_available is None or self.spot_nodes_available >= 0,
            "max_late_risk": 0 <= self.max_late_risk <= 1,
            "min_finish_chance": self.min_finish_chance is None or 0 <= self.min_finish_chance <= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}: invalid value {getattr(self, name)!r}")


@dataclass(frozen=True)
class Decision:
    choice: Choice
    reason: str
    hours: float | None = None
    """Estimated node-independent training hours left (without interruptions)."""
    spot_cost: float | None = None
    on_demand_cost: float | None = None
    spot_hours: float | None = None
    remaining_budget: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "choice": self.choice.value}


def _fits(cost: float | None, budget: float | None) -> bool:
    if cost is None:
        return False
    return budget is None or round(cost * 1e6) <= round(budget * 1e6)


def _in_time(hours: float | None, deadline_s: float | None, after_s: float = 0.0) -> bool:
    if hours is None:
        return False
    return deadline_s is None or after_s + hours * 3600.0 <= deadline_s + 1e-6


def _losses_fit(inputs: BudgetInputs, hours: float, start_h: float, room_h: float) -> float:
    """The chance that the preemptions of ``hours`` on spot (Poisson at the interruption rate over the expected
    spot hours, each costing ``restart_overhead_s`` + ``lost_work_s``) fit in ``room_h`` hours of slack."""
    if room_h < -1e-9:
        return 0.0
    per_loss_h = (inputs.restart_overhead_s + inputs.lost_work_s) / 3600.0
    lam = inputs.interruption_rate_per_hour * (hours * (1 + spot_overhead(inputs)) + start_h)
    if per_loss_h <= 0 or lam <= 0:
        return 1.0
    k_max = math.floor(max(0.0, room_h) / per_loss_h + 1e-9)
    term = total = math.exp(-lam)
    for k in range(1, k_max + 1):
        term *= lam / k
        total += term
        if term < 1e-12 and k > lam:
            break
    return min(1.0, total)


def _chance_ok(chance: float, least: float) -> bool:
    """At least ``least``, and some chance at all (``least`` 0: any chance, never none)."""
    return chance > 0 and chance >= least


def budget_chance(inputs: BudgetInputs, hours: float, price: float, start_h: float) -> float:
    """The chance that ``hours`` of training on spot at ``price`` (plus ``start_h`` of start-up) costs no more
    than the remaining budget."""
    i = inputs
    if i.remaining_budget is None or price <= 0:
        return 1.0
    return _losses_fit(i, hours, start_h, i.remaining_budget / (i.num_nodes * price) - hours - start_h)


def deadline_chance(inputs: BudgetInputs, hours: float, start_h: float, after_s: float = 0.0) -> float:
    """The chance that ``hours`` of training on spot (plus ``start_h`` of start-up), begun ``after_s`` from now,
    finishes by the deadline."""
    if inputs.deadline_s is None:
        return 1.0
    return _losses_fit(inputs, hours, start_h, (inputs.deadline_s - after_s) / 3600.0 - hours - start_h)


def _spot_fits(
    inputs: BudgetInputs, hours: float, price: float | None, start_h: float, after_s: float = 0.0
) -> tuple[bool, bool, float | None, float | None]:
    """(within budget, in time, chance within budget, chance in time) of ``hours`` on spot at ``price`` (None: no
    offer) plus ``start_h`` of start-up, begun ``after_s`` from now: by the expected cost and hours, or with
    ``min_finish_chance`` by the chance of each (the chances are None when not asked for)."""
    i = inputs
    if i.min_finish_chance is None:
        spot_h = spot_hours(i, hours, start_h)
        cost = spot_h * i.num_nodes * price if price is not None else None
        return _fits(cost, i.remaining_budget), _in_time(spot_h, i.deadline_s, after_s), None, None
    chance = budget_chance(i, hours, price, start_h) if price is not None else None
    time_chance = deadline_chance(i, hours, start_h, after_s)
    within = chance is not None and _chance_ok(chance, i.min_finish_chance)
    return within, _chance_ok(time_chance, i.min_finish_chance), chance, time_chance


def spot_overhead(inputs: BudgetInputs) -> float:
    """Fraction of extra time spot costs through interruptions."""
    return inputs.interruption_rate_per_hour * (inputs.restart_overhead_s + inputs.lost_work_s) / 3600.0


def spot_hours(inputs: BudgetInputs, hours: float, start_h: float) -> float:
    """Expected hours on spot: ``hours`` of work with the interruption overhead, plus ``start_h`` of start-up."""
    return hours * (1 + spot_overhead(inputs)) + start_h


def decide(inputs: BudgetInputs) -> Decision:
    """The decision for ``inputs`` and why, following the table in this module's docstring."""
    i = inputs
    money = f"${i.remaining_budget:.2f}" if i.remaining_budget is not None else "no budget"
    if i.steps_remaining == 0:
        return Decision(
            Choice.STOP, "no steps remaining: the job is complete", 0.0, 0.0, 0.0, 0.0, i.remaining_budget
        )
    if i.step_time_s is None and i.remaining_budget is not None:
        return Decision(
            Choice.STOP,
            "unknown step time: no measured step_time_s in a checkpoint manifest and no estimate, "
            f"so no estimate can be shown to fit the remaining budget {money}",
            remaining_budget=i.remaining_budget,
        )
    if i.spot_price is None and i.on_demand_price is None:
        return Decision(
            Choice.STOP,
            "no price known: neither a spot offer nor an on-demand price",
            remaining_budget=i.remaining_budget,
        )

    hours = i.steps_remaining * i.step_time_s / 3600.0 if i.step_time_s is not None else None
    chance = time_chance = None  # of spot finishing within the budget and by the deadline (min_finish_chance)
    overhead = spot_overhead(i)
    start_h = i.restart_overhead_s / 3600.0
    tracked = i.current is not None  # start-ups are charged only when what runs now is known
    spot_start = start_h if tracked and i.current != Choice.SPOT else 0.0
    od_start = start_h if tracked and i.current != Choice.ON_DEMAND else 0.0
    spot_h = spot_hours(i, hours, spot_start) if hours is not None else None
    unpreempted_h = spot_start + hours if hours is not None else None  # spot's hours if it is never preempted
    od_hours = hours + od_start if hours is not None else None
    spot_cost = (
        spot_h * i.num_nodes * i.spot_price if spot_h is not None and i.spot_price is not None else None
    )
    od_cost = (
        od_hours * i.num_nodes * i.on_demand_price
        if od_hours is not None and i.on_demand_price is not None
        else None
    )
    preempt_risk = 0.0  # of a first preemption before spot is done
    if hours is None:  # no budget, no step time: decide on price and risk alone
        spot_cost_ok = od_cost_ok = True
        spot_time_ok = i.deadline_s is None
    else:
        od_cost_ok = _fits(od_cost, i.remaining_budget)
        spot_cost_ok, spot_time_ok, chance, time_chance = _spot_fits(i, hours, i.spot_price, spot_start)
        # the chance of a first preemption before spot is done: over its start-up and its work (the expected
        # spot hours already hold the later preemptions' time: over them the risk would be counted twice)
        preempt_risk = 1.0 - math.exp(-i.interruption_rate_per_hour * unpreempted_h)
        if spot_time_ok and i.on_demand_price is not None and od_cost_ok and preempt_risk > i.max_late_risk:
            # a preemption right after the start-up must still leave time to finish on on-demand (when the
            # budget pays for on-demand at all, and a preemption is likelier than the lateness risk accepted)
            fallback = unpreempted_h + (i.lost_work_s + i.restart_overhead_s) / 3600.0
            spot_time_ok = _in_time(fallback, i.deadline_s)

    def made(choice: Choice, reason: str) -> Decision:
        return Decision(choice, reason, hours, spot_cost, od_cost, spot_h, i.remaining_budget)

    est = f"{hours:.2f} h" if hours is not None else "unknown hours"
    risky = i.interruption_rate_per_hour > i.max_interruption_rate_per_hour
    spot_why = []
    spot_offered = i.spot_price is not None and not (
        i.spot_nodes_available is not None and i.spot_nodes_available < i.num_nodes
    )
    if i.spot_price is None:
        spot_why.append("no acceptable spot offer")
    elif not spot_offered:
        spot_why.append(
            f"only {i.spot_nodes_available} of the {i.num_nodes} spot nodes the group needs at once"
        )
    else:
        if risky:
            spot_why.append(
                f"interruption risk {i.interruption_rate_per_hour:.3f}/h above {i.max_interruption_rate_per_hour:.3f}/h"
            )
        if not spot_cost_ok and chance is not None:
            spot_why.append(
                f"spot finishes within the remaining budget {money} with a chance of {chance:.0%}, below "
                f"min_finish_chance {i.min_finish_chance:.0%}"
            )
        elif not spot_cost_ok:
            spot_why.append(f"spot estimate ${spot_cost:.2f} exceeds the remaining budget {money}")
        if (
            spot_cost_ok
            and not spot_time_ok
            and time_chance is not None
            and not _chance_ok(time_chance, i.min_finish_chance)
        ):
            spot_why.append(
                f"spot finishes by the deadline with a chance of {time_chance:.0%}, below min_finish_chance "
                f"{i.min_finish_chance:.0%}"
            )
        elif spot_cost_ok and not spot_time_ok:
            spot_why.append(
                "no step time to show that spot finishes by the deadline" if spot_h is None else
                f"spot would take {spot_h:.2f} h, or leave no time to finish on on-demand after a preemption, "
                "past the deadline"
            )  # fmt: skip
    od_in_time = od_hours is not None and _in_time(od_hours, i.deadline_s)
    # Can't Be Late's safety net, where a preemption before spot is done is likelier than not: a (re)launch on
    # spot that one preemption would make late is a losing bet, and on-demand that is in time within budget wins.
    guard_h = (
        2 * start_h + i.lost_work_s / 3600.0
    )  # a (re)launch's start-up, one preemption's restart and loss
    if (
        i.deadline_guard and tracked and i.current != Choice.SPOT and i.deadline_s is not None and hours is not None
        and preempt_risk > GUARD_RISK and od_cost_ok and od_in_time and i.deadline_s / 3600.0 - hours < guard_h
    ):  # fmt: skip
        return made(
            Choice.ON_DEMAND,
            f"on-demand to the deadline (deadline guard): {i.deadline_s / 3600.0 - hours:.2f} h to spare after "
            f"{est} of work, less than a spot (re)launch and one preemption ({guard_h:.2f} h), which is likelier "
            f"than not ({preempt_risk:.0%}); on-demand ${od_cost:.2f} finishes in time within {money}",
        )
    if not spot_why and od_cost_ok and od_in_time and od_cost is not None and spot_cost is not None:
        if od_cost <= spot_cost:  # the cheaper of two capacities that both fit, start-ups included
            if i.current == Choice.ON_DEMAND:
                return made(
                    Choice.ON_DEMAND,
                    f"stay on on-demand: spot would save ${od_cost - spot_cost:.2f}, no more than nothing once the "
                    f"switch's start-up is paid ({i.restart_overhead_s:.0f} s × {i.num_nodes} node(s) at the spot price"
                    f" is in the spot estimate ${spot_cost:.2f}; on-demand ${od_cost:.2f})",
                )
            return made(
                Choice.ON_DEMAND,
                f"on-demand ${od_cost:.2f} is no dearer than spot ${spot_cost:.2f}, start-ups included",
            )
    if not spot_why:
        return made(
            Choice.SPOT,
            f"spot: {est} × {i.num_nodes} node(s) × ${i.spot_price:.4f}/h × (1 + {overhead:.3f} interruption "
            f"overhead)"
            + (f" + {spot_start:.2f} h start-up" if spot_start else "")
            + f" = ${spot_cost or 0:.2f}"
            + (
                f", {chance:.0%} chance of finishing within {money} (min_finish_chance {i.min_finish_chance:.0%}; the "
                "trainer's budget cap stops it at the budget otherwise)"
                if chance is not None
                else f" within {money}"
            )
            + (f" (on-demand would cost ${od_cost:.2f})" if od_cost is not None else ""),
        )
    spot_reason = "; ".join(spot_why)
    od_why = (
        "no on-demand price"
        if i.on_demand_price is None
        else (
            f"on-demand estimate ${od_cost:.2f} exceeds the remaining budget {money}"
            if not od_cost_ok
            else "no step time to show that on-demand finishes by the deadline"
            if od_hours is None
            else f"on-demand would take {od_hours:.2f} h, past the deadline"
        )
    )

    # Wait when, after the wait, spot at the hoped-for price or on-demand could still finish in time within budget.
    target = i.wait_target_price if i.wait_target_price is not None else (i.spot_price or i.on_demand_price)
    later_start = start_h if tracked else 0.0
    later_spot_h = spot_hours(i, hours, later_start) if hours is not None else None
    later_od_h = hours + later_start if hours is not None else None
    target_cost = (
        later_spot_h * i.num_nodes * target if later_spot_h is not None and target is not None else None
    )
    later_od_cost = (
        later_od_h * i.num_nodes * i.on_demand_price if later_od_h is not None and i.on_demand_price else None
    )
    target_ok, target_in_time, target_chance = False, False, None
    if hours is not None and target is not None:
        target_ok, target_in_time, target_chance, _ = _spot_fits(
            i, hours, target, later_start, i.wait_interval_s
        )
    may_wait = i.max_wait_s > 0 and i.waited_s + i.wait_interval_s <= i.max_wait_s and not risky
    after = i.wait_interval_s
    wait_pays = hours is None or (
        (target_ok and target_in_time)
        or (_fits(later_od_cost, i.remaining_budget) and _in_time(later_od_h, i.deadline_s, after_s=after))
    )
    if may_wait and wait_pays:
        return made(
            Choice.WAIT,
            f"wait {i.wait_interval_s:.0f} s for spot ({spot_reason}); waited {i.waited_s:.0f} of {i.max_wait_s:.0f} s",
        )
    if i.on_demand_price is not None and od_cost_ok and od_in_time:
        return made(
            Choice.ON_DEMAND,
            f"on-demand ({spot_reason}): {est} × {i.num_nodes} node(s) × ${i.on_demand_price:.4f}/h"
            + (f" + {od_start:.2f} h start-up" if od_start else "")
            + f" = ${od_cost or 0:.2f} within {money}",
        )

    # Nothing finishes in time within budget. Late within budget, if allowed: on-demand only when it is sure
    # to finish first (spot's hours without a preemption are longer); spot's expected preemptions alone do not
    # buy on-demand at several times the price for a result that is late either way.
    spot_late = spot_offered and not risky and spot_cost_ok and hours is not None
    od_late = i.on_demand_price is not None and od_cost_ok and hours is not None
    if i.allow_late and (spot_late or od_late):
        if od_late and (not spot_late or od_hours < unpreempted_h):
            return made(
                Choice.ON_DEMAND,
                f"on-demand past the deadline ({spot_reason}; {od_why}), the first to finish within budget "
                "even if spot is never preempted; "
                f"allow_late: ${od_cost or 0:.2f} within {money}",
            )
        return made(
            Choice.SPOT,
            f"spot past the deadline ({spot_reason}; {od_why}), within budget and no later than on-demand "
            "unless preempted; "
            "allow_late: "
            + (
                f"a {chance:.0%} chance within {money}"
                if chance is not None
                else f"${spot_cost or 0:.2f} within {money}"
            ),
        )
    if i.allow_late and may_wait and hours is not None and target_ok:
        return made(
            Choice.WAIT,
            f"wait {i.wait_interval_s:.0f} s for spot at ${target:.4f}/h, past the deadline ({spot_reason}; {od_why}); "
            "allow_late: "
            + (
                f"a {target_chance:.0%} chance within {money}"
                if target_chance is not None
                else f"${target_cost:.2f} within {money}"
            ),
        )
    if hours is None and i.on_demand_price is not None:  # no estimate at all (and no budget): on-demand
        return made(Choice.ON_DEMAND, f"on-demand ({spot_reason}): no step time to estimate, no budget")
    late = "" if i.allow_late else " (allow_late is off: finishing past the deadline is not an option)"
    return made(Choice.STOP, f"over budget or past the deadline: {spot_reason}; {od_why}{late}")

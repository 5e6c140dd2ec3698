"""The facts the budget rules look at (``airflow_dtrain.spot.budget``): the inputs and the estimates derived
from them, each computed when a rule first asks, and the reasons given for spot, on-demand and waiting.

The arithmetic itself is ``airflow_dtrain.spot.estimates``'s; this module names its results so that each rule
of the table is one short predicate. Standard library only.
"""

from __future__ import annotations

import math
from functools import cached_property

from airflow_dtrain.spot.estimates import (
    BudgetInputs,
    Choice,
    Decision,
    chance_ok,
    fits,
    in_time,
    loss_s,
    spot_fits,
    spot_hours,
    spot_node_hours,
    spot_overhead,
)


class Facts:
    """What the rules look at: the inputs and the estimates derived from them, each computed when a rule first
    asks (so the rules before the estimates -- no steps, no step time, no price -- never compute them)."""

    def __init__(self, inputs: BudgetInputs):
        self.i = inputs

    @cached_property
    def money(self) -> str:
        i = self.i
        return f"${i.remaining_budget:.2f}" if i.remaining_budget is not None else "no budget"

    @cached_property
    def hours(self) -> float | None:
        i = self.i
        return i.steps_remaining * i.step_time_s / 3600.0 if i.step_time_s is not None else None

    @cached_property
    def est(self) -> str:
        return f"{self.hours:.2f} h" if self.hours is not None else "unknown hours"

    @property
    def start_h(self) -> float:
        return self.i.restart_overhead_s / 3600.0

    @property
    def tracked(self) -> bool:
        """Start-ups are charged only when what runs now is known."""
        return self.i.current is not None

    @property
    def spot_start(self) -> float:
        return self.start_h if self.tracked and self.i.current != Choice.SPOT else 0.0

    @property
    def od_start(self) -> float:
        return self.start_h if self.tracked and self.i.current != Choice.ON_DEMAND else 0.0

    @cached_property
    def spot_h(self) -> float | None:
        return spot_hours(self.i, self.hours, self.spot_start) if self.hours is not None else None

    @cached_property
    def unpreempted_h(self) -> float | None:
        """Spot's hours if it is never preempted (an elastic group's at the k nodes on offer, with its resize
        to grow back)."""
        i = self.i
        return self.spot_start + self.hours * i.slowdown + i.resize_h if self.hours is not None else None

    @property
    def spare_h(self) -> float:
        """Hours to spare before the deadline after spot's work, never preempted (at the k nodes on offer,
        with the resize to grow back)."""
        i = self.i
        return i.deadline_s / 3600.0 - self.hours * i.slowdown - i.resize_h

    @cached_property
    def od_hours(self) -> float | None:
        return self.hours + self.od_start if self.hours is not None else None

    @cached_property
    def spot_cost(self) -> float | None:
        i = self.i
        if self.hours is None or i.spot_price is None:
            return None
        return spot_node_hours(i, self.hours, self.spot_start) * i.spot_price

    @cached_property
    def od_cost(self) -> float | None:
        i, od_h = self.i, self.od_hours
        return (
            od_h * i.num_nodes * i.on_demand_price
            if od_h is not None and i.on_demand_price is not None
            else None
        )

    @cached_property
    def fit(self) -> tuple[bool, bool, bool, float | None, float | None, float]:
        """(spot within budget, spot in time, on-demand within budget, chance within budget, chance in time,
        chance of a first preemption before spot is done)."""
        i, hours = self.i, self.hours
        if hours is None:  # no budget, no step time: decide on price and risk alone
            return True, i.deadline_s is None, True, None, None, 0.0
        od_cost_ok = fits(self.od_cost, i.remaining_budget)
        spot_cost_ok, spot_time_ok, chance, time_chance = spot_fits(i, hours, i.spot_price, self.spot_start)
        # the chance of a first preemption before spot is done: over its start-up and its work (the expected
        # spot hours already hold the later preemptions' time: over them the risk would be counted twice)
        preempt_risk = 1.0 - math.exp(-i.interruption_rate_per_hour * self.unpreempted_h)
        if spot_time_ok and i.on_demand_price is not None and od_cost_ok and preempt_risk > i.max_late_risk:
            # a preemption right after the start-up must still leave time to finish on on-demand (when the
            # budget pays for on-demand at all, and a preemption is likelier than the lateness risk accepted)
            fallback = self.spot_start + hours + (i.lost_work_s + i.restart_overhead_s) / 3600.0
            spot_time_ok = in_time(fallback, i.deadline_s)
        return spot_cost_ok, spot_time_ok, od_cost_ok, chance, time_chance, preempt_risk

    spot_cost_ok = property(lambda self: self.fit[0])
    spot_time_ok = property(lambda self: self.fit[1])
    od_cost_ok = property(lambda self: self.fit[2])
    chance = property(lambda self: self.fit[3])
    time_chance = property(lambda self: self.fit[4])
    preempt_risk = property(lambda self: self.fit[5])

    @property
    def weighed_rate(self) -> float:
        """The interruption rate held to ``max_interruption_rate_per_hour``, in relaunches per hour: a lost
        node of an elastic group is not a relaunch, and counts at the share of a relaunch's cost that it costs
        (``loss_s`` over ``restart_overhead_s`` + ``lost_work_s``)."""
        i = self.i
        relaunch = i.restart_overhead_s + i.lost_work_s
        if not i.elastic or relaunch <= 0:
            return i.interruption_rate_per_hour
        return i.interruption_rate_per_hour * min(1.0, loss_s(i) / relaunch)

    @property
    def risky(self) -> bool:
        return self.weighed_rate > self.i.max_interruption_rate_per_hour

    @property
    def spot_offered(self) -> bool:
        """An offer for all of the group's nodes at once, or for an elastic group at least ``min_nodes``."""
        return self.i.spot_price is not None and self.i.spot_nodes is not None

    @cached_property
    def spot_why(self) -> list[str]:
        """Why not spot (empty: spot fits)."""
        i = self.i
        if i.spot_price is None:
            return ["no acceptable spot offer"]
        if not self.spot_offered and i.elastic:
            return [f"only {i.spot_nodes_available} of the {i.num_nodes} spot nodes: spot_nodes_available "
                    f"{i.spot_nodes_available} is below min_nodes {i.min_nodes}"]  # fmt: skip
        if not self.spot_offered:
            return [f"only {i.spot_nodes_available} of the {i.num_nodes} spot nodes the group needs at once"]
        why = []
        if self.risky:
            weighed = self.weighed_rate
            share = weighed / i.interruption_rate_per_hour if i.interruption_rate_per_hour else 1.0
            as_relaunches = (
                f" (a lost node costs {share:.2f} of a relaunch: {weighed:.3f} relaunches/h)"
                if weighed != i.interruption_rate_per_hour else ""
            )  # fmt: skip
            why.append(
                f"interruption risk {i.interruption_rate_per_hour:.3f}/h{as_relaunches} "
                f"above {i.max_interruption_rate_per_hour:.3f}/h"
            )
        why += self._spot_money_why() + self._spot_time_why()
        return why

    def _spot_money_why(self) -> list[str]:
        i = self.i
        if not self.spot_cost_ok and self.chance is not None:
            return [f"spot finishes within the remaining budget {self.money} with a chance of "
                    f"{self.chance:.0%}, below min_finish_chance {i.min_finish_chance:.0%}"]  # fmt: skip
        if not self.spot_cost_ok:
            return [f"spot estimate ${self.spot_cost:.2f} exceeds the remaining budget {self.money}"]
        return []

    def _spot_time_why(self) -> list[str]:
        i = self.i
        if not self.spot_cost_ok or self.spot_time_ok:
            return []
        if self.time_chance is not None and not chance_ok(self.time_chance, i.min_finish_chance):
            return [f"spot finishes by the deadline with a chance of {self.time_chance:.0%}, below "
                    f"min_finish_chance {i.min_finish_chance:.0%}"]  # fmt: skip
        if self.spot_h is None:
            return ["no step time to show that spot finishes by the deadline"]
        return [f"spot would take {self.spot_h:.2f} h, or leave no time to finish on on-demand after a "
                "preemption, past the deadline"]  # fmt: skip

    @property
    def spot_reason(self) -> str:
        return "; ".join(self.spot_why)

    @property
    def od_in_time(self) -> bool:
        return self.od_hours is not None and in_time(self.od_hours, self.i.deadline_s)

    @property
    def od_why(self) -> str:
        if self.i.on_demand_price is None:
            return "no on-demand price"
        if not self.od_cost_ok:
            return f"on-demand estimate ${self.od_cost:.2f} exceeds the remaining budget {self.money}"
        if self.od_hours is None:
            return "no step time to show that on-demand finishes by the deadline"
        return f"on-demand would take {self.od_hours:.2f} h, past the deadline"

    @property
    def guard_h(self) -> float:
        """A (re)launch's start-up, one preemption's restart and loss (of an elastic group: a resize, the
        survivors go on)."""
        return self.start_h + loss_s(self.i) / 3600.0

    # -- waiting: after one wait, spot at the hoped-for price, or on-demand ----------------------------------
    @property
    def target(self) -> float | None:
        i = self.i
        return i.wait_target_price if i.wait_target_price is not None else (i.spot_price or i.on_demand_price)

    @property
    def later_start(self) -> float:
        return self.start_h if self.tracked else 0.0

    @cached_property
    def target_fit(self) -> tuple[bool, bool, float | None]:
        """(spot at the hoped-for price within budget, in time, its chance within budget) after one wait."""
        if self.hours is None or self.target is None:
            return False, False, None
        ok, on_time, chance, _ = spot_fits(
            self.i, self.hours, self.target, self.later_start, self.i.wait_interval_s
        )
        return ok, on_time, chance

    @property
    def target_cost(self) -> float | None:
        if self.hours is None or self.target is None:
            return None
        return spot_node_hours(self.i, self.hours, self.later_start) * self.target

    @property
    def may_wait(self) -> bool:
        i = self.i
        return i.max_wait_s > 0 and i.waited_s + i.wait_interval_s <= i.max_wait_s and not self.risky

    @property
    def wait_pays(self) -> bool:
        """After the wait, spot at the hoped-for price or on-demand could still finish in time within
        budget. A job on on-demand waits only for spot: on-demand after the wait is what it has now, at the
        price of a second start-up."""
        i = self.i
        if self.hours is None:
            return True
        if i.current == Choice.ON_DEMAND:
            return self.target_fit[0] and self.target_fit[1]
        later_od_h = self.hours + self.later_start
        later_od_cost = later_od_h * i.num_nodes * i.on_demand_price if i.on_demand_price else None
        target_ok, target_in_time, _ = self.target_fit
        od_ok = fits(later_od_cost, i.remaining_budget) and in_time(
            later_od_h, i.deadline_s, after_s=i.wait_interval_s
        )
        return (target_ok and target_in_time) or od_ok

    @property
    def fallback_later_ok(self) -> bool:
        """On-demand begun after one more ``wait_interval_s`` (with its start-up, no progress counted) still
        finishes in time within the budget left after that interval on spot (billed on all ``num_nodes``)."""
        i = self.i
        if self.hours is None or i.on_demand_price is None or i.spot_price is None:
            return False
        later_od_h = self.hours + self.start_h
        spend = i.wait_interval_s / 3600.0 * i.num_nodes * i.spot_price
        cost = later_od_h * i.num_nodes * i.on_demand_price + spend
        return fits(cost, i.remaining_budget) and in_time(later_od_h, i.deadline_s, after_s=i.wait_interval_s)

    @property
    def spot_late(self) -> bool:
        return self.spot_offered and not self.risky and self.spot_cost_ok and self.hours is not None

    @property
    def od_late(self) -> bool:
        return self.i.on_demand_price is not None and self.od_cost_ok and self.hours is not None

    # -- an elastic group topped up with on-demand (``top_up_on_demand``) -----------------------------------
    @cached_property
    def top_up(self) -> tuple[int, float, float] | None:
        """(spot nodes k, hours, cost) of the group on the k spot nodes on offer and ``num_nodes`` - k
        on-demand ones, at full speed: the work with the interruption overhead of the k (a lost one costs a
        resize, and the next decision tops up again), plus a start-up -- the whole group's from nothing, a
        resize when it runs already, with the joining nodes' boot billed at their price. None: no top-up."""
        i, k = self.i, self.i.top_up_spot_nodes
        if k is None or self.hours is None:
            return None
        n, resize = i.num_nodes, i.resize_overhead_s / 3600.0
        running = self.tracked and i.current in (Choice.SPOT, Choice.ON_DEMAND)
        start = resize if running else (self.start_h if self.tracked else 0.0)
        if running and i.current == Choice.SPOT and i.topped_up == n - k:
            start = 0.0  # topped up so already
        hours = self.hours * (1 + spot_overhead(i)) + start
        joining = {
            Choice.SPOT: max(0, n - k - i.topped_up) * i.on_demand_price,
            Choice.ON_DEMAND: k * i.spot_price,
        }
        boot = self.start_h * joining.get(i.current, 0.0) if running else 0.0
        return k, hours, hours * (k * i.spot_price + (n - k) * i.on_demand_price) + boot

    @property
    def top_up_fits(self) -> bool:
        """The top-up is in time within budget, and cheaper than on-demand on all the nodes."""
        t = self.top_up
        return (
            t is not None and not self.risky and fits(t[2], self.i.remaining_budget)
            and in_time(t[1], self.i.deadline_s) and self.od_cost is not None and t[2] < self.od_cost
        )  # fmt: skip

    def made(self, choice: Choice, reason: str, top_up: bool = False) -> Decision:
        """A decision with the estimates and the nodes it trains on (``top_up``: the topped-up group's)."""
        nodes = {Choice.SPOT: self.i.spot_nodes, Choice.ON_DEMAND: self.i.num_nodes}.get(choice)
        spot_cost, spot_h, on_demand = self.spot_cost, self.spot_h, 0
        if top_up:
            k, spot_h, spot_cost = self.top_up
            nodes, on_demand = self.i.num_nodes, self.i.num_nodes - k
        return Decision(
            choice,
            reason,
            self.hours,
            spot_cost,
            self.od_cost,
            spot_h,
            self.i.remaining_budget,
            nodes,
            on_demand,
        )

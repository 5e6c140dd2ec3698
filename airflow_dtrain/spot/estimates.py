"""The budget policy's vocabulary and arithmetic: its inputs, its decision, and the estimates it decides on.

``airflow_dtrain.spot.budget`` holds the decision itself (a table of rules over these estimates); this module
holds what the rules look at: ``BudgetInputs``, ``Choice``, ``Decision``, and the pure functions that say
whether spot or on-demand fits the budget and the deadline (by the expected hours, or with
``min_finish_chance`` by the chance of it). Standard library only.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass
from typing import Any

from trainer.money.capacity import Capacity


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
    """Above this risk, spot is not used. An elastic group's lost node is not a relaunch: its rate counts at
    ``loss_s`` / (``restart_overhead_s`` + ``lost_work_s``), at most 1."""
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
    An all-or-nothing group needs all of its nodes at once: fewer is no spot at all; an elastic group
    (``min_nodes``) trains on k of them, ``min_nodes`` <= k < ``num_nodes``."""
    min_nodes: int | None = None
    """The fewest nodes the group trains on (an elastic group): on spot it starts on the k nodes on offer, its
    steps take ``num_nodes`` / k as long (the global batch is fixed), it grows back to ``num_nodes`` at a
    checkpoint (one resize), and a lost node costs two resizes, the survivors' wait for a replacement and one
    node's start-up, not a relaunch (``loss_s``). None: ``num_nodes`` (all or nothing)."""
    resize_overhead_s: float = 90.0
    """Time an elastic group's resize costs (the checkpoint saved at the boundary and the survivors'
    re-rendezvous), billed on all ``num_nodes`` in the worst case; in place of ``restart_overhead_s`` for a
    lost node of an elastic group."""
    replace_timeout_s: float = 30.0
    """How long an elastic group's survivors wait, at each lost node, for its replacement before they train
    on without it: billed on all of them in the loss's resize (``loss_s``). With the launchers that is
    ``REJOIN_WAIT_S``: their round closes once every survivor is back (trainer/elastic/rdzv_round.py),
    bounded by ``JobSpec.replace_timeout_s`` (torchrun's last call), what ``BudgetBranchOperator`` passes
    (``rejoin_wait_s``). A replacement that needs a new node comes later and joins with a resize of its own; a
    round that has all ``num_nodes`` does not wait."""
    top_up_on_demand: bool = False
    """An elastic group offered fewer spot nodes than ``num_nodes`` may train on all ``num_nodes`` at once:
    the k spot nodes on offer (at least one) and ``num_nodes`` - k on-demand ones, at full speed, each billed
    at its own price. Taken in place of on-demand on all the nodes (the deadline guard's or the fallback's),
    when it is cheaper and in time within budget. Off: a group is on one capacity."""
    topped_up: int = 0
    """Of a group on spot now (``current``), the on-demand nodes it is topped up with."""
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
    """Can't Be Late's safety net (Wu et al., NSDI'24), where a preemption is likelier than not: when
    ``current`` is given and is not spot, the time to spare before the deadline after the remaining hours is
    less than a spot (re)launch and one preemption (2 × ``restart_overhead_s`` + ``lost_work_s``), and a first
    preemption before spot would be done is likelier than ``GUARD_RISK``: on-demand, when it finishes in time
    within the budget, whatever ``max_late_risk`` and ``min_finish_chance`` accept. Off: only they keep time
    for the fallback."""
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
            "min_nodes": self.min_nodes is None or 1 <= self.min_nodes <= self.num_nodes,
            "resize_overhead_s": self.resize_overhead_s >= 0,
            "replace_timeout_s": self.replace_timeout_s >= 0,
            "topped_up": 0 <= self.topped_up < self.num_nodes,
            "max_late_risk": 0 <= self.max_late_risk <= 1,
            "min_finish_chance": self.min_finish_chance is None or 0 <= self.min_finish_chance <= 1,
        }
        for name, ok in checks.items():
            if not ok:
                bound = f" (num_nodes {self.num_nodes})" if name in ("min_nodes", "topped_up") else ""
                raise ValueError(f"{name}: invalid value {getattr(self, name)!r}{bound}")

    @property
    def elastic(self) -> bool:
        """The group may train on fewer than ``num_nodes`` nodes."""
        return self.min_nodes is not None and self.min_nodes < self.num_nodes

    @property
    def spot_nodes(self) -> int | None:
        """The nodes spot trains on: all ``num_nodes``, or for an elastic group the k on offer (``min_nodes``
        <= k < ``num_nodes``); None: fewer on offer than the group needs."""
        have = self.spot_nodes_available
        if have is None or have >= self.num_nodes:
            return self.num_nodes
        return have if self.elastic and have >= self.min_nodes else None

    @property
    def slowdown(self) -> float:
        """How much longer a step takes on spot's nodes than on all of them (the global batch is fixed)."""
        k = self.spot_nodes
        return self.num_nodes / k if k else 1.0

    @property
    def top_up_spot_nodes(self) -> int | None:
        """The spot nodes of a group topped up with on-demand (``top_up_on_demand``): the k on offer, 1 <= k <
        ``num_nodes``; None: no top-up (not elastic, not allowed, all nodes or none on offer, no prices)."""
        have = self.spot_nodes_available
        if not (self.top_up_on_demand and self.elastic) or have is None or not 1 <= have < self.num_nodes:
            return None
        if self.spot_price is None or self.on_demand_price is None or self.spot_price >= self.on_demand_price:
            return None
        return have

    @property
    def resize_h(self) -> float:
        """The one resize a group started below ``num_nodes`` pays to grow back."""
        k = self.spot_nodes
        return self.resize_overhead_s / 3600.0 if k and k < self.num_nodes else 0.0


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
    nodes: int | None = None
    """The nodes the choice trains on: an elastic group's k on spot, else ``num_nodes``; None: wait, stop."""
    on_demand_nodes: int = 0
    """Of ``nodes`` on spot, how many are on-demand (a group topped up: ``top_up_on_demand``)."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "choice": self.choice.value}


def fits(cost: float | None, budget: float | None) -> bool:
    """``cost`` is known and within ``budget`` (None: no budget), compared in whole micro-dollars."""
    if cost is None:
        return False
    return budget is None or round(cost * 1e6) <= round(budget * 1e6)


def in_time(hours: float | None, deadline_s: float | None, after_s: float = 0.0) -> bool:
    """``hours`` are known and, begun ``after_s`` from now, end by the deadline (None: no deadline)."""
    if hours is None:
        return False
    return deadline_s is None or after_s + hours * 3600.0 <= deadline_s + 1e-6


def losses_fit(inputs: BudgetInputs, hours: float, start_h: float, room_h: float) -> float:
    """The chance that the preemptions of ``hours`` on spot (Poisson at the interruption rate over the
    expected spot hours, each costing ``restart_overhead_s`` + ``lost_work_s``) fit in ``room_h`` hours of
    slack."""
    if room_h < -1e-9:
        return 0.0
    per_loss_h = loss_s(inputs) / 3600.0
    lam = inputs.interruption_rate_per_hour * (
        hours * inputs.slowdown * (1 + spot_overhead(inputs)) + start_h
    )
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


def chance_ok(chance: float, least: float) -> bool:
    """At least ``least``, and some chance at all (``least`` 0: any chance, never none)."""
    return chance > 0 and chance >= least


def budget_chance(inputs: BudgetInputs, hours: float, price: float, start_h: float) -> float:
    """The chance that ``hours`` of training on spot at ``price`` (plus ``start_h`` of start-up) costs no more
    than the remaining budget."""
    i = inputs
    if i.remaining_budget is None or price <= 0:
        return 1.0
    room_h = i.remaining_budget / (i.num_nodes * price) - hours - start_h - i.resize_h
    return losses_fit(i, hours, start_h, room_h)


def deadline_chance(inputs: BudgetInputs, hours: float, start_h: float, after_s: float = 0.0) -> float:
    """The chance that ``hours`` of training on spot (plus ``start_h`` of start-up), begun ``after_s`` from
    now, finishes by the deadline."""
    if inputs.deadline_s is None:
        return 1.0
    work_h = hours * inputs.slowdown + inputs.resize_h
    return losses_fit(inputs, hours, start_h, (inputs.deadline_s - after_s) / 3600.0 - work_h - start_h)


def spot_fits(
    inputs: BudgetInputs, hours: float, price: float | None, start_h: float, after_s: float = 0.0
) -> tuple[bool, bool, float | None, float | None]:
    """(within budget, in time, chance within budget, chance in time) of ``hours`` on spot at ``price`` (None:
    no offer) plus ``start_h`` of start-up, begun ``after_s`` from now: by the expected cost and hours, or
    with ``min_finish_chance`` by the chance of each (the chances are None when not asked for)."""
    i = inputs
    if i.min_finish_chance is None:
        spot_h = spot_hours(i, hours, start_h)
        cost = spot_node_hours(i, hours, start_h) * price if price is not None else None
        return fits(cost, i.remaining_budget), in_time(spot_h, i.deadline_s, after_s), None, None
    chance = budget_chance(i, hours, price, start_h) if price is not None else None
    time_chance = deadline_chance(i, hours, start_h, after_s)
    within = chance is not None and chance_ok(chance, i.min_finish_chance)
    return within, chance_ok(time_chance, i.min_finish_chance), chance, time_chance


REJOIN_WAIT_S = 2.0
"""What an elastic group's survivors wait at a lost node with the launchers: their rendezvous round closes
once every one of them is back (0.3 s of grace, polled every 0.1 s: ``trainer.elastic.rdzv_round``), or once
the replacement a local group starts at once has joined (its agent's start-up, about 2.5 s on the 2-core VM:
benchmarks/RESULTS.md, recovery). A bound, not a mean: the decision prices the wait no lower than this."""


def rejoin_wait_s(replace_timeout_s: float) -> float:
    """The wait at a lost node of a group whose last call is ``replace_timeout_s`` (``REJOIN_WAIT_S``)."""
    return min(replace_timeout_s, REJOIN_WAIT_S)


def loss_s(inputs: BudgetInputs) -> float:
    """Time one interruption costs the whole group: a relaunch and the lost work. Of an elastic group: the
    survivors' resize with their wait for a replacement (``replace_timeout_s``), the lost work, and the
    replacement the launcher starts at once: its start-up, billed on one node of ``num_nodes`` (the others
    train on meanwhile), and a second resize when it joins."""
    i = inputs
    if not i.elastic:
        return i.restart_overhead_s + i.lost_work_s
    return 2 * i.resize_overhead_s + i.replace_timeout_s + i.restart_overhead_s / i.num_nodes + i.lost_work_s


def spot_overhead(inputs: BudgetInputs) -> float:
    """Fraction of extra time spot costs through interruptions."""
    return inputs.interruption_rate_per_hour * loss_s(inputs) / 3600.0


def spot_hours(inputs: BudgetInputs, hours: float, start_h: float) -> float:
    """Expected hours on spot: ``hours`` of work (at all ``num_nodes``; on an elastic group's k nodes
    ``num_nodes`` / k as long) with the interruption overhead, plus ``start_h`` of start-up and, started below
    ``num_nodes``, one resize to grow back."""
    return hours * inputs.slowdown * (1 + spot_overhead(inputs)) + start_h + inputs.resize_h


def spot_node_hours(inputs: BudgetInputs, hours: float, start_h: float) -> float:
    """The node-hours spot bills at most: the work's (``hours`` on ``num_nodes``, whatever the size it runs
    at: the global batch is fixed), and every overhead (start-up, resizes, interruptions) on all
    ``num_nodes``: the worst case over the sizes an elastic group may change to, which the cap is held to."""
    return inputs.num_nodes * (spot_hours(inputs, hours, start_h) - hours * (inputs.slowdown - 1.0))

"""The strategies (naive spot, Uniform Progress, our policy) and the tick-by-tick simulation of one job."""

from __future__ import annotations

import math
from dataclasses import dataclass

from airflow_dtrain.spot.budget import decide
from airflow_dtrain.spot.estimates import BudgetInputs, Choice
from spot_traces import Market

from .world import INPUTS, OURS, Job, Outcome, World


@dataclass
class State:
    mode: str | None = None  # None (idle) | "spot" | "od"
    zone: int | None = None
    startup_left: float = 0.0
    done: float = 0.0
    saved: float = 0.0
    safety: bool = False  # Uniform Progress' safety net: on-demand to the end


def _cheapest(world: World, k: int, n: int, ok=lambda z: True) -> int | None:
    """The cheapest zone with ``n`` nodes at tick ``k`` (of those ``ok``); a tie goes to the first name, as in
    ``choose_offer``."""
    zones, best = world.market.zones, None
    for i, z in enumerate(zones):
        if z.capacity[k] < n or not ok(i):
            continue
        if best is None or (z.price[k], z.name) < (zones[best].price[k], zones[best].name):
            best = i
    return best


class Naive:
    def __init__(self, warning: bool) -> None:
        self.warning = warning
        self.name = "naive spot, " + ("with warning" if warning else "no warning")

    def choose(self, world: World, job: Job, k: int, elapsed: float, s: State, cost: float):
        if s.mode == "spot":
            return Choice.SPOT, s.zone
        z = _cheapest(world, k, job.nodes)
        return (Choice.SPOT, z) if z is not None else (Choice.WAIT, None)


class UniformProgress:
    """Can't Be Late's Uniform Progress with its hysteresis (2d) and safety net (remaining work + 2d)."""

    name = "Uniform Progress"
    warning = True

    def choose(self, world: World, job: Job, k: int, elapsed: float, s: State, cost: float):
        d, W, D = world.mech.startup_s, job.work_s, job.deadline_s
        if s.safety:
            return Choice.ON_DEMAND, None
        if s.mode == "spot":
            return Choice.SPOT, s.zone  # exploitation: stay until preempted
        z = _cheapest(world, k, job.nodes)
        if s.mode == "od":
            if s.done < W * min(1.0, (elapsed + 2 * d) / D):
                return Choice.ON_DEMAND, None  # hysteresis: stay until ahead of the line at t + 2d
            return (Choice.SPOT, z) if z is not None else (Choice.WAIT, None)
        if D - elapsed < (W - s.done) + 2 * d:
            s.safety = True
            return Choice.ON_DEMAND, None
        if z is not None:
            return Choice.SPOT, z  # taking risks: spot whenever it can be had
        if s.done < W * elapsed / D:
            return Choice.ON_DEMAND, None
        return Choice.WAIT, None


class Policy:
    """decide() every tick, on the offer SpotPriceSensor would give; the trainer's hard budget cap."""

    warning = True

    def __init__(
        self,
        max_price_ratio: float,
        max_risk: float,
        late_risk: float,
        chance: float | None = None,
        allow_late: bool = True,
        inputs: str = "measured",
    ) -> None:
        self.max_price_ratio, self.max_risk, self.late_risk = max_price_ratio, max_risk, late_risk
        self.chance, self.allow_late = chance, allow_late
        if inputs not in INPUTS:
            raise ValueError(f"inputs: one of {', '.join(INPUTS)}, got {inputs!r}")
        self.inputs = inputs
        self.name = OURS[allow_late]
        self.decisions: dict[str, int] = {}
        self.last = None  # the latest decision (an elastic group reads its top-up)

    def limit(self, market: Market) -> float:
        """The highest spot price accepted, $/node-hour."""
        return self.max_price_ratio * market.on_demand_price

    def offer(self, world: World, k: int, n: int, s: State) -> int | None:
        """The zone whose spot offer decide() sees at tick ``k``: while on spot, the zone the group runs in
        (while its price is at or below the limit); otherwise SpotPriceSensor's choice (``choose_offer``: the
        cheapest offer at or below the limit) among the zones that have the ``n`` nodes, which is the zone
        naive spot and Uniform Progress take when it is within the limit. When no zone has them: the
        acceptable zone with the most, so that decide() is told how many of the ``n`` it could have."""
        m = world.market
        limit = self.limit(m)
        if s.mode == "spot":
            return s.zone if m.zones[s.zone].price[k] <= limit else None
        cand = _cheapest(world, k, n, ok=lambda i: m.zones[i].price[k] <= limit)
        if cand is None:
            priced = [i for i, z in enumerate(m.zones) if z.price[k] <= limit]
            cand = max(priced, key=lambda i: m.zones[i].capacity[k]) if priced else None
        return cand

    def choose(self, world: World, job: Job, k: int, elapsed: float, s: State, cost: float):
        cand = self.offer(world, k, job.nodes, s)
        d = self.last = decide(self.budget_inputs(world, job, k, elapsed, s, cost, cand))
        self.decisions[d.choice.value] = self.decisions.get(d.choice.value, 0) + 1
        return d.choice, cand if d.choice == Choice.SPOT else None

    def budget_inputs(
        self, world: World, job: Job, k: int, elapsed: float, s: State, cost: float, cand: int | None
    ) -> BudgetInputs:
        """What decide() is told at tick ``k`` about the offer of zone ``cand`` (None: no offer)."""
        m, mech, n = world.market, world.mech, job.nodes
        measured = self.inputs == "measured"
        rate = (world.rate(n)[cand][k] if measured else world.prior_rate(n)) if cand is not None else 0.0
        remaining = job.work_s - s.done + s.startup_left
        return BudgetInputs(
            steps_remaining=max(1, math.ceil(remaining / mech.step_s)),
            step_time_s=mech.step_s,
            num_nodes=n,
            spot_price=m.zones[cand].price[k] if cand is not None else None,
            spot_nodes_available=m.zones[cand].capacity[k] if cand is not None else None,
            on_demand_price=m.on_demand_price,
            remaining_budget=max(0.0, job.budget - cost),
            interruption_rate_per_hour=rate,
            max_interruption_rate_per_hour=self.max_risk,
            max_late_risk=self.late_risk,
            min_finish_chance=self.chance,
            restart_overhead_s=mech.startup_s,
            lost_work_s=mech.step_s,
            deadline_s=max(
                0.0, job.deadline_s - elapsed
            ),  # what it runs now starts now, as for the baselines
            max_wait_s=math.inf,
            wait_interval_s=m.tick_s,
            wait_target_price=min(world.recent_low[k], self.limit(m)) if measured else self.limit(m),
            current={"spot": Choice.SPOT, "od": Choice.ON_DEMAND}.get(s.mode, Choice.WAIT),
            allow_late=self.allow_late,
        )


def simulate(world: World, job: Job, strategy) -> Outcome:
    m, mech, n, dt = world.market, world.mech, job.nodes, world.market.tick_s
    loss = world.loss(n)
    s, out = State(), Outcome()
    capped = isinstance(strategy, Policy)
    for k in range(job.start, job.horizon):
        elapsed = (k - job.start) * dt
        if s.mode == "spot" and world.draws[s.zone][k] < loss[s.zone][k]:
            out.preemptions += 1
            s.done = max(s.saved, s.done - mech.step_s) if strategy.warning else s.saved
            s.saved = s.done if strategy.warning else s.saved
            s.mode = s.zone = None
            s.startup_left = 0.0
        choice, zone = strategy.choose(world, job, k, elapsed, s, out.cost)
        if choice == Choice.STOP:
            out.stopped = True
            return out
        want = {Choice.SPOT: "spot", Choice.ON_DEMAND: "od"}.get(choice)
        if want != s.mode or (want == "spot" and zone != s.zone):
            if s.mode is not None:
                s.saved = s.done  # a switch or a stop of its own: save first, lose nothing
                out.switches += want is not None
            s.mode, s.zone = want, zone
            if want is not None:
                s.startup_left = mech.startup_s
                out.launches += 1
        if s.mode is None:
            continue
        price = m.zones[s.zone].price[k] if s.mode == "spot" else m.on_demand_price
        useful = max(0.0, dt - s.startup_left)
        over = max(
            0.0, s.done + useful - job.work_s
        )  # finished part-way through the tick: bill that part only
        tick_cost = (dt - over) / 3600 * n * price
        if capped and out.cost + tick_cost > job.budget + 1e-9:
            out.stopped = True  # the trainer saves and exits before the spend passes the cap
            return out
        s.startup_left = max(0.0, s.startup_left - dt)
        out.cost += tick_cost
        out.started = True
        s.done += useful
        if s.done - s.saved >= mech.checkpoint_s:
            s.saved = s.done - (s.done - s.saved) % mech.checkpoint_s
        if s.done >= job.work_s:
            out.time_s = elapsed + dt - over
            out.finished = True
            return out
    return out  # the trace ended first

"""Jobs drawn from a market, a strategy's row of the tables, and the grid of our policy's parameters."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass, field

from spot_traces import Market

from .strategies import simulate
from .world import BUDGET_CHANCES, LATE_RISKS, MAX_RISKS, PRICE_RATIOS, Job, Mechanics, Outcome, World


def work_range_h(market: Market) -> tuple[float, float]:
    half_h = market.ticks * market.tick_s / 3600 / 2
    return (4.0, 48.0) if half_h > 200 else (2.0, 24.0) if half_h > 48 else (0.25, 1.5)


def make_jobs(
    markets: list[Market], n_jobs: int, nodes: int, half: int, seed: int, mech: Mechanics
) -> list[Job]:
    """Jobs that start and end inside one half of their market's time range (0: first, 1: second)."""
    rng = random.Random(f"{seed}/{nodes}/{half}")
    usable = [i for i, m in enumerate(markets) if m.max_capacity >= nodes]
    jobs = []
    while len(jobs) < n_jobs and usable:
        i = usable[len(jobs) % len(usable)]
        m = markets[i]
        lo, hi = work_range_h(m)
        work = 3600 * math.exp(rng.uniform(math.log(lo), math.log(hi)))
        work = mech.step_s * max(1, round(work / mech.step_s))  # a job is a whole number of steps
        deadline = rng.uniform(1.2, 2.0) * (work + mech.startup_s)
        room = math.ceil(1.5 * deadline / m.tick_s) + 1
        mid = m.ticks // 2
        first, last = (0, mid) if half == 0 else (mid, m.ticks)
        if last - first <= room:
            continue
        start = rng.randrange(first, last - room)
        od_cost = (work + mech.startup_s) / 3600 * nodes * m.on_demand_price
        jobs.append(Job(i, start, last, work, nodes, deadline, rng.uniform(0.5, 1.5) * od_cost))
    return jobs


@dataclass
class Row:
    strategy: str
    jobs: list[Job]
    outcomes: list[Outcome]
    od_cost: float
    mech: Mechanics
    decisions: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        c = {"on_time": 0, "late": 0, "stopped": 0, "never": 0}
        for j, o in zip(self.jobs, self.outcomes):
            if o.finished:
                c["on_time" if o.time_s <= j.deadline_s + 1e-6 else "late"] += 1
            elif o.stopped and o.started:
                c["stopped"] += 1
            elif not o.started:
                c["never"] += 1
            else:
                c["late"] += 1  # ran, and the trace ended before it finished: past its deadline
        return c

    @property
    def cost(self) -> float:
        return sum(o.cost for o in self.outcomes)

    @property
    def violations(self) -> int:
        return sum(o.cost > j.budget + 1e-6 for j, o in zip(self.jobs, self.outcomes))

    def kept_each(self) -> list[bool]:
        """Per job: finished on time and within budget, what the user asked for."""
        return [
            o.finished and o.time_s <= j.deadline_s + 1e-6 and o.cost <= j.budget + 1e-6
            for j, o in zip(self.jobs, self.outcomes)
        ]

    @property
    def kept(self) -> int:
        return sum(self.kept_each())

    def times(self) -> tuple[float, float]:
        r = [o.time_s / j.od_time(self.mech) for j, o in zip(self.jobs, self.outcomes) if o.finished]
        unfinished = any(o.started and not o.finished and not o.stopped for o in self.outcomes)
        if not r:
            return math.nan, math.nan
        return statistics.median(r), math.inf if unfinished else max(r)

    def stopped_spend(self) -> float:
        return sum(o.cost for o in self.outcomes if o.stopped)

    def line(self) -> str:
        c, (med, mx) = self.counts(), self.times()
        sw = [o.switches for o in self.outcomes]
        return (
            f"| {self.strategy} | {self.cost / self.od_cost:.1%} | {med:.3f} | {mx:.3f} | {c['on_time']} "
            f"| {c['late']} | {c['stopped']} (${self.stopped_spend():,.0f}) | {c['never']} | {self.kept} "
            f"| {self.violations} | {statistics.fmean(sw) if sw else 0:.2f} / {max(sw, default=0)} "
            f"| {sum(o.preemptions for o in self.outcomes)} |"
        )


HEAD = (
    "| strategy | cost / on-demand | time / on-demand: median | max | on time | late | stopped (spent) "
    "| never started | on time within budget | budget violations | switches per job: mean / max "
    "| preemptions |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def run_size(worlds: list[World], jobs: list[Job], strategies: list, mech: Mechanics) -> list[Row]:
    od_cost = sum(j.od_cost(mech, worlds[j.market].market.on_demand_price) for j in jobs)
    rows = [Row("always on-demand", jobs, [
        Outcome(cost=j.od_cost(mech, worlds[j.market].market.on_demand_price),
                time_s=j.od_time(mech), finished=True, started=True, launches=1)
        for j in jobs], od_cost, mech)]  # fmt: skip
    for strategy in strategies:
        run = getattr(strategy, "run", None)  # an elastic group's own simulation
        outs = [run(worlds[j.market], j) if run else simulate(worlds[j.market], j, strategy) for j in jobs]
        rows.append(Row(strategy.name, jobs, outs, od_cost, mech, getattr(strategy, "decisions", {})))
    return rows


def param_grid() -> list[tuple]:
    """Every parameter set of our policy that is tuned: (max spot price ratio, max interruption rate,
    max late risk, min finish chance)."""
    return list(itertools.product(PRICE_RATIOS, MAX_RISKS, LATE_RISKS, BUDGET_CHANCES))


def distinct_sets(markets: list[Market], inputs: str = "measured") -> list[tuple]:
    """The grid, less the sets that cannot differ from an earlier one on these markets: with the measured
    inputs, a spot price limit at or above every price of the markets admits every offer and leaves the wait
    target at the trailing low, so the lowest such limit stands for the others. (With the DAG's inputs the
    limit is the wait target: no set is left out.)"""
    if inputs != "measured":
        return param_grid()
    prices = [(p, m.on_demand_price) for m in markets for z in m.zones for p in z.price]
    admits_all = [r for r in PRICE_RATIOS if all(p <= r * od for p, od in prices)]
    return [p for p in param_grid() if p[0] not in admits_all[1:]]

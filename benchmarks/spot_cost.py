"""Spot-cost simulator: the budget policy vs naive spot (with and without the warning) vs Uniform Progress.

    python benchmarks/spot_cost.py [TRACE_DIR] [--jobs 200] [--tune-jobs 300] [--seed 0 | --seeds A-B]
                                   [--inputs measured|dag] [--scenario NAME]
    python benchmarks/spot_cost.py --quick      # every scenario, 8 jobs per size: a check that it runs

TRACE_DIR (default ``../shared/data/spot`` relative to the repository) holds either ``*.market.json``
files (your own data, format in ``benchmarks/README.md``) or the shared research traces
(``benchmarks/spot_traces.py`` reads them and states the assumption each needs).

Every strategy runs on the same world with the same mechanisms:

- a job is W seconds of compute (a whole number of ``--step-s`` steps) on n nodes (1, 4 or 16); its
  on-demand time is W + one start-up; its deadline is a stretch (uniform 1.2-2.0) of that, its budget a
  fraction (uniform 0.5-1.5) of its on-demand cost. Always-on-demand is the reference (cost 100 %).
- a group of n runs in one zone, only at a tick where the zone has >= n nodes; it is preempted when the
  capacity falls below n, and when the capacity drops from c to c' >= n it loses one of its own nodes
  with the probability that c - c' nodes picked at random out of c hit one of its n (hypergeometric).
  Losing one node preempts the group. The draws are common to every strategy (one uniform number per
  zone and tick), so they face the same preemptions.
- every (re)launch costs ``--startup-s`` of billed time before training resumes; on-demand is always
  available. Billing per second at each tick's price.
- every strategy saves a checkpoint every ``--checkpoint-s`` of progress and before a switch it makes
  itself. With the two-minute warning it also saves when warned and loses at most one step
  (``--step-s``); without it, a preemption loses the work since the last checkpoint.
- the strategies: naive always-spot (cheapest zone that has the nodes, waits while none has, never
  on-demand) with and without the warning; Uniform Progress (Wu et al., "Can't Be Late", NSDI'24: spot
  whenever it can be had and kept until preempted; idle and behind the line W*t/D -> on-demand, kept
  until progress is ahead of the line at t + 2d; idle with less than remaining work + 2d left ->
  on-demand to the end; d = the start-up), with the warning, on the same zone choice; our policy:
  ``airflow_dtrain.spot.budget.decide`` every tick with the cheapest acceptable zone's offer (as
  SpotPriceSensor -> BudgetBranchOperator), its past-only interruption rate, ``current`` (so its deadline
  guard, Uniform Progress' safety net where a preemption is likelier than not, applies) and the budget
  and deadline left, with the warning, and the trainer's hard budget cap (it stops before a tick that
  would pass the budget). Naive spot and Uniform Progress know no budget: their overruns are counted.
  Our policy runs twice: with ``allow_late`` (late but within budget goes on; the operator's default) and
  without ("on time or stop"), each with its own parameters: the setting is the user's choice.
- held out: the policy's four parameters (the highest spot price accepted, as a fraction of on-demand,
  the highest interruption rate accepted, ``max_late_risk`` and ``min_finish_chance``) are chosen per
  scenario and job size (a size is known when a job is submitted) on jobs in the first half of each trace's
  time range (``--tune-jobs``, 300), simulated on that half only: the set most surely at or below every
  baseline there (the largest smallest paired t statistic of the difference, in cost and in jobs kept on time
  within budget, against any baseline; ``surest``), of equals the one with the lowest cost + a full on-demand
  job per job not kept; the tables are jobs in the second half. Where ours is not at or below a baseline, the
  verdict adds a 95 % paired bootstrap interval of the difference over the cell's jobs.
- ``--seeds``: the whole of the above once per seed (its own jobs, preemption draws and choice of parameters),
  the held-out jobs of every seed pooled in the tables and verdicts, and after each verdict the number of seeds
  on whose jobs alone each setting met it. A cell of one seed is 200 jobs that share one draw of the market's
  preemptions: its verdict is a coin toss where two strategies differ by a point or a job; pooled seeds are
  the expectation the verdict is about.
"""

from __future__ import annotations

import argparse
import itertools
import math
import multiprocessing
import os
import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from airflow_dtrain.spot.budget import BudgetInputs, Choice, decide  # noqa: E402
from spot_traces import Market, load_scenarios, quick_traces  # noqa: E402

DEFAULT_TRACES = REPO.parent / "shared" / "data" / "spot"
SIZES = (1, 4, 16)
PRICE_RATIOS = (0.5, 0.75, 1.0)
MAX_RISKS = (0.25, 1.0, math.inf)
LATE_RISKS = (0.0, 0.05, 0.2, 0.5, 1.0)
BUDGET_CHANCES = (None, 0.0, 0.05, 0.2, 0.5)
# what decide() is told besides the offer and the job's own state: "measured", the offer's zone's interruption rate
# over the trailing 24 h and the trailing-day low as the price to wait for (inputs the bundled DAG does not gather);
# "dag", what train_llama gives it: one fixed rate (the author's, from history: here the first half's) and the
# price limit as the wait target (BudgetBranchOperator's default, max_spot_price)
INPUTS = ("measured", "dag")
# the user's choice, not a tuned parameter: late results within budget are worth having, or they are not
OURS = {True: "our policy", False: "our policy, on time or stop"}


@dataclass(frozen=True)
class Mechanics:
    startup_s: float = 300.0
    checkpoint_s: float = 1800.0
    step_s: float = 30.0
    risk_window_h: float = 24.0


@dataclass(frozen=True)
class Job:
    market: int
    start: int
    horizon: int
    work_s: float
    nodes: int
    deadline_s: float
    budget: float

    def od_time(self, mech: Mechanics) -> float:
        return self.work_s + mech.startup_s

    def od_cost(self, mech: Mechanics, on_demand_price: float) -> float:
        """What always-on-demand pays for it: its on-demand time on all its nodes."""
        return self.od_time(mech) / 3600 * self.nodes * on_demand_price


@dataclass
class Outcome:
    cost: float = 0.0
    time_s: float = math.inf
    finished: bool = False
    stopped: bool = False
    started: bool = False
    preemptions: int = 0
    switches: int = 0
    launches: int = 0


# -- the world a market gives a group of n nodes -------------------------------------------------------


class World:
    """Per zone and tick, for a group of n: the chance to lose a node, the past-only loss rate, and the draws.

    :param prior_ticks: the ticks a DAG author's fixed interruption rate is counted over (``prior_rate``; default
        the first half of the market, the part the parameters are chosen on).
    """

    def __init__(self, market: Market, mech: Mechanics, seed: int, prior_ticks: int | None = None) -> None:
        self.market, self.mech = market, mech
        self.prior_ticks = market.ticks // 2 if prior_ticks is None else prior_ticks
        self._prior: dict[int, float] = {}
        rng = random.Random(f"{seed}/{market.name}")
        self.draws = [[rng.random() for _ in range(market.ticks)] for _ in market.zones]
        self._loss: dict[int, list[list[float]]] = {}
        self._rate: dict[int, list[list[float]]] = {}
        w = max(1, int(24 * 3600 / market.tick_s))
        cheapest = [min(z.price[k] for z in market.zones) for k in range(market.ticks)]
        self.recent_low, window = [], deque()
        for k, p in enumerate(cheapest):  # trailing-day minimum, past only
            while window and window[-1][1] >= p:
                window.pop()
            window.append((k, p))
            if window[0][0] <= k - w:
                window.popleft()
            self.recent_low.append(window[0][1])

    def loss(self, n: int) -> list[list[float]]:
        if n not in self._loss:
            out = []
            for z in self.market.zones:
                c, p = z.capacity, [0.0] * len(z.capacity)
                for k in range(1, len(c)):
                    if c[k - 1] < n:
                        continue  # the group could not have been running
                    if c[k] < n:
                        p[k] = 1.0
                    elif c[k] < c[k - 1]:
                        gone = (
                            c[k - 1] - c[k]
                        )  # P(none of our n among `gone` of c[k-1]) = C(c-n, gone) / C(c, gone)
                        p[k] = 1.0 - math.comb(c[k - 1] - n, gone) / math.comb(c[k - 1], gone)
                out.append(p)
            self._loss[n] = out
        return self._loss[n]

    def rate(self, n: int) -> list[list[float]]:
        """Losses per hour a group of n could have run, over the trailing window, up to the tick before."""
        if n not in self._rate:
            w = max(1, int(self.mech.risk_window_h * 3600 / self.market.tick_s))
            h = self.market.tick_s / 3600
            out = []
            for z, loss in zip(self.market.zones, self.loss(n)):
                lost = up = 0.0
                r = []
                for k in range(len(loss)):
                    r.append(lost / (up * h) if up * h >= 1.0 else 1.0)  # under an hour of history: 1/h
                    lost += loss[k]
                    up += z.capacity[k] >= n
                    if k >= w:
                        lost -= loss[k - w]
                        up -= z.capacity[k - w] >= n
                r = [max(0.0, x) for x in r]
                out.append(r)
            self._rate[n] = out
        return self._rate[n]

    def prior_rate(self, n: int) -> float:
        """One interruption rate for a group of n, as a DAG author would set ``interruption_rate_per_hour`` from
        history: its losses per hour of running, every zone together, over the first ``prior_ticks`` ticks
        (under an hour of it: 1/h, as ``rate``)."""
        if n not in self._prior:
            lost = up = 0.0
            for z, loss in zip(self.market.zones, self.loss(n)):
                lost += sum(loss[: self.prior_ticks])
                up += sum(c >= n for c in z.capacity[: self.prior_ticks])
            hours = up * self.market.tick_s / 3600
            self._prior[n] = lost / hours if hours >= 1.0 else 1.0
        return self._prior[n]


# -- strategies ---------------------------------------------------------------------------------------


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

    def limit(self, market: Market) -> float:
        """The highest spot price accepted, $/node-hour."""
        return self.max_price_ratio * market.on_demand_price

    def offer(self, world: World, k: int, n: int, s: State) -> int | None:
        """The zone whose spot offer decide() sees at tick ``k``: while on spot, the zone the group runs in (while
        its price is at or below the limit); otherwise SpotPriceSensor's choice (``choose_offer``: the cheapest
        offer at or below the limit) among the zones that have the ``n`` nodes, which is the zone naive spot and
        Uniform Progress take when it is within the limit. When no zone has them: the acceptable zone with the
        most, so that decide() is told how many of the ``n`` it could have."""
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
        m, mech, n = world.market, world.mech, job.nodes
        cand = self.offer(world, k, n, s)
        measured = self.inputs == "measured"
        rate = (world.rate(n)[cand][k] if measured else world.prior_rate(n)) if cand is not None else 0.0
        remaining = job.work_s - s.done + s.startup_left
        inputs = BudgetInputs(
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
        d = decide(inputs)
        self.decisions[d.choice.value] = self.decisions.get(d.choice.value, 0) + 1
        return d.choice, cand if d.choice == Choice.SPOT else None


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


# -- jobs, tuning, report -----------------------------------------------------------------------------


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
            f"| {self.strategy} | {self.cost / self.od_cost:.1%} | {med:.3f} | {mx:.3f} | {c['on_time']} | {c['late']} | "
            f"{c['stopped']} (${self.stopped_spend():,.0f}) | {c['never']} | {self.kept} | {self.violations} | "
            f"{statistics.fmean(sw) if sw else 0:.2f} / {max(sw, default=0)} | {sum(o.preemptions for o in self.outcomes)} |"
        )


HEAD = (
    "| strategy | cost / on-demand | time / on-demand: median | max | on time | late | stopped (spent) | never started "
    "| on time within budget | budget violations | switches per job: mean / max | preemptions |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def run_size(worlds: list[World], jobs: list[Job], strategies: list, mech: Mechanics) -> list[Row]:
    od_cost = sum(j.od_cost(mech, worlds[j.market].market.on_demand_price) for j in jobs)
    rows = [Row("always on-demand", jobs, [
        Outcome(cost=j.od_cost(mech, worlds[j.market].market.on_demand_price),
                time_s=j.od_time(mech), finished=True, started=True, launches=1)
        for j in jobs], od_cost, mech)]  # fmt: skip
    for strategy in strategies:
        outs = [simulate(worlds[j.market], j, strategy) for j in jobs]
        rows.append(Row(strategy.name, jobs, outs, od_cost, mech, getattr(strategy, "decisions", {})))
    return rows


def param_grid() -> list[tuple]:
    """Every parameter set of our policy that is tuned: (max spot price ratio, max interruption rate, max late risk,
    min finish chance)."""
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


def per_job(row: Row) -> list[tuple[float, bool]]:
    """(cost, kept on time within budget) of each job of a row."""
    return list(zip((o.cost for o in row.outcomes), row.kept_each()))


def totals(pairs) -> tuple[float, int]:
    """(cost, jobs kept) of per-job outcomes."""
    pairs = list(pairs)
    return sum(c for c, _ in pairs), sum(k for _, k in pairs)


def at_or_below(ours: tuple[float, int], base: tuple[float, int]) -> bool:
    """(cost, kept) no dearer, and keeping as many jobs on time within budget."""
    return ours[0] <= base[0] + 1e-9 and ours[1] >= base[1]


def score(pairs, od_cost: float) -> float:
    """Cost + a full on-demand job's cost per job not kept, as a fraction of the jobs' on-demand cost."""
    pairs = list(pairs)
    (cost, kept), n = totals(pairs), len(pairs)
    return (cost + od_cost / max(1, n) * (n - kept)) / od_cost if od_cost else math.inf


def surest(mine: list[tuple[float, bool]], bases: list[list[tuple[float, bool]]]) -> float:
    """How surely the per-job outcomes ``mine`` are at or below every baseline's on the same jobs: the
    smallest, over the baselines and over cost (lower is better) and jobs kept, of the paired t statistic of
    the difference (0 where it sums to nothing; +-inf where it is the same on every job)."""
    out = math.inf
    for base in bases:
        for i, sign in ((0, -1.0), (1, 1.0)):
            diff = [sign * (float(a[i]) - float(b[i])) for a, b in zip(mine, base)]
            total = sum(diff)
            if abs(total) < 1e-9:
                t = 0.0
            else:
                mean = total / len(diff)
                var = sum((x - mean) ** 2 for x in diff) / max(1, len(diff) - 1)
                t = math.copysign(math.inf, total) if var == 0 else total / math.sqrt(len(diff) * var)
            out = min(out, t)
    return out


_TUNING: tuple = ()  # (worlds, jobs per size, mech, inputs) of the tuning under way, for the worker processes


def _tune_set(task: tuple[bool, tuple]) -> dict[int, list[tuple[float, bool]]]:
    late, params = task
    worlds, jobs, mech, inputs = _TUNING
    return {n: per_job(run_size(worlds, js, [Policy(*params, allow_late=late, inputs=inputs)], mech)[1])
            for n, js in jobs.items()}  # fmt: skip


def tune(
    worlds: list[World], sizes: list[int], n_jobs: int, seed: int, mech: Mechanics, inputs: str = "measured"
):
    """Per user (``allow_late`` on and off) and job size (known when a job is submitted), on ``n_jobs`` jobs
    of the first half simulated on that half: the parameter set most surely at or below every baseline there,
    that is with the largest ``surest`` (cost, and jobs kept on time within budget, against each baseline); of
    equals, the lowest cost + a full on-demand job's cost per job not kept. Every set runs in a process pool
    (fork, one process per CPU). Returns {(allow_late, size): (below, score, surest, *parameters)}."""
    global _TUNING
    halves = [
        World(w.market.window(0, w.market.ticks // 2, "(first half)"), mech, seed, w.prior_ticks)
        for w in worlds
    ]
    jobs = {n: make_jobs([w.market for w in halves], n_jobs, n, 0, seed, mech) for n in sizes}
    bases = {n: [per_job(r) for r in run_size(halves, jobs[n], [Naive(True), Naive(False), UniformProgress()],
                                              mech)[1:]] for n in sizes}  # fmt: skip
    for w in halves:  # the worlds' lazy tables, once, before the workers fork
        for n in sizes:
            w.rate(n)
            w.prior_rate(n)
    tasks = list(itertools.product(OURS, distinct_sets([w.market for w in halves], inputs)))
    _TUNING = (halves, jobs, mech, inputs)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    procs = min(cpus, len(tasks))
    try:
        if procs > 1 and "fork" in multiprocessing.get_all_start_methods():
            with multiprocessing.get_context("fork").Pool(procs) as pool:
                results = pool.map(_tune_set, tasks, chunksize=max(1, len(tasks) // (4 * procs)))
        else:
            results = [_tune_set(t) for t in tasks]
    finally:
        _TUNING = ()
    od = {
        n: sum(j.od_cost(mech, halves[j.market].market.on_demand_price) for j in js) for n, js in jobs.items()
    }
    best: dict[tuple[bool, int], tuple] = {}
    for (late, params), outcome in zip(tasks, results):
        for n in sizes:
            mine = outcome[n]
            points = score(mine, od[n])
            below = all(at_or_below(totals(mine), totals(b)) for b in bases[n])
            z = surest(mine, bases[n])
            if (late, n) not in best or (-z, points) < best[late, n][0]:
                best[late, n] = ((-z, points), below, points, z, *params)
    return {key: value[1:] for key, value in best.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace_dir", nargs="?", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--jobs", type=int, default=200, help="held-out jobs per scenario and size")
    ap.add_argument(
        "--tune-jobs", type=int, default=300, help="jobs per size in the first half, to choose the parameters"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--seeds",
        type=seed_list,
        default=None,
        metavar="A-B|A,B,...",
        help="run every seed (each with its own jobs, draws and parameter choice) and report their "
        "held-out jobs pooled, with how many seeds each setting met the line on; replaces --seed",
    )
    ap.add_argument("--startup-s", type=float, default=300.0)
    ap.add_argument("--checkpoint-s", type=float, default=1800.0)
    ap.add_argument("--step-s", type=float, default=30.0)
    ap.add_argument(
        "--inputs",
        choices=INPUTS,
        default="measured",
        help="what our policy is told: the zone's measured trailing rate and price low, or what the bundled "
        "DAG gives it (one fixed rate from the first half, the price limit as the wait target)",
    )
    ap.add_argument(
        "--scenario",
        action="append",
        default=None,
        metavar="NAME",
        help="simulate only this scenario (aws-9az, aws-4node, groups, or one of yours; "
        "repeatable); default: every scenario in TRACE_DIR",
    )
    ap.add_argument("--quick", action="store_true", help="--jobs 8 --tune-jobs 8: every part, on few jobs")
    args = ap.parse_args(argv)
    if args.quick:
        args.jobs, args.tune_jobs = 8, 8
        args.trace_dir = quick_traces(args.trace_dir)
    seeds = args.seeds or [args.seed]
    mech = Mechanics(args.startup_s, args.checkpoint_s, args.step_s)
    t0 = time.monotonic()
    scenarios = load_scenarios(args.trace_dir)
    if args.scenario:
        unknown = sorted(set(args.scenario) - {sc.name for sc in scenarios})
        if unknown:
            ap.error(
                f"--scenario {', '.join(unknown)}: not in {args.trace_dir} (there: "
                f"{', '.join(sc.name for sc in scenarios)})"
            )
        scenarios = [sc for sc in scenarios if sc.name in args.scenario]
    print(f"traces: {args.trace_dir}; {_seeds_text(seeds)}; start-up {mech.startup_s:.0f} s, checkpoint every "
          f"{mech.checkpoint_s:.0f} s, step {mech.step_s:.0f} s; deadline 1.2-2.0x and budget 0.5-1.5x on-demand; "
          f"our policy's inputs: {args.inputs}")  # fmt: skip
    every_row: dict[str, list[Row]] = {}  # strategy -> its rows of every scenario and size
    by_size: dict[tuple[int, str], list[Row]] = {}
    judged_at: dict[str, int] = {}  # level -> how many verdicts
    misses: dict[str, dict[str, list[str]]] = {
        name: {} for name in OURS.values()
    }  # level -> where ours missed
    runs: list[tuple[int, str, int, list[Row]]] = []  # (seed, scenario, size, rows) of every run
    seed_met: dict[tuple[str, str], list[int]] = {}  # (ours, level) -> [seeds x places met, seeds x places]

    def merged(name: str, rows: list[Row]) -> Row:
        return Row(name, [j for r in rows for j in r.jobs], [o for r in rows for o in r.outcomes],
                   sum(r.od_cost for r in rows), mech)  # fmt: skip

    def pooled(runs_rows: list[list[Row]]) -> list[Row]:
        """Runs of the same strategies, in the same order, merged strategy by strategy."""
        return [merged(r.strategy, [rows[j] for rows in runs_rows]) for j, r in enumerate(runs_rows[0])]

    def of_seeds(keep) -> list[list[Row]]:
        """Per seed, its runs that ``keep(scenario, size)`` accepts, pooled (none for a single seed)."""
        if len(seeds) == 1:
            return []
        return [
            pooled([rows for s_, name, n, rows in runs if s_ == seed and keep(name, n)]) for seed in seeds
        ]

    def judged(rows: list[Row], level: str, where: str, by_seed: list[list[Row]] | None = None) -> None:
        print("\n".join(verdict(rows, name) for name in OURS.values()))
        print(frontier(rows))
        if len(seeds) > 1 and by_seed:
            print("\n".join(seed_by_seed(by_seed, seeds, name) for name in OURS.values()))
            for name in OURS.values():
                tally = seed_met.setdefault((name, level), [0, 0])
                tally[0] += sum(below_every(rows, name) for rows in by_seed)
                tally[1] += len(by_seed)
        judged_at[level] = judged_at.get(level, 0) + 1
        for name in OURS.values():
            if not below_every(rows, name):
                misses[name].setdefault(level, []).append(where)

    for sc in scenarios:
        cap = max(m.max_capacity for m in sc.markets)
        sizes = [n for n in SIZES if n <= cap]
        print(f"\n## {sc.title}")
        for m in sc.markets:
            print(f"- {m.name}: {len(m.zones)} zone(s), {m.ticks} ticks of {m.tick_s:.0f} s "
                  f"({m.ticks * m.tick_s / 3600:.1f} h), on-demand ${m.on_demand_price:.3f}/node-h, "
                  f"capacity up to {m.max_capacity}" + "".join(f"; {note}" for note in m.notes))  # fmt: skip
        skipped = [n for n in SIZES if n > cap]
        if skipped:
            print(f"- sizes {skipped}: not simulated, no zone here ever has that many nodes")
        cells: dict[int, list[list[Row]]] = {n: [] for n in sizes}  # size -> each seed's rows
        for seed in seeds:
            worlds = [World(m, mech, seed) for m in sc.markets]
            best = tune(worlds, sizes, args.tune_jobs, seed, mech, args.inputs)
            at = f"seed {seed}, " if len(seeds) > 1 else ""
            for (late, n), (below, score, z, ratio, risk, late_risk, chance) in best.items():
                print(f"- {at}{OURS[late]}, {n} node(s), chosen on the first half ({args.tune_jobs} jobs): max spot price {ratio:.2f} x "
                      f"on-demand, max interruption rate {risk:g}/h, max late risk {late_risk:g}, min finish chance {'- (expected cost and time)' if chance is None else chance} "
                      f"(smallest paired t against a baseline {z:+.2f}; score {score:.3f}; at or below every baseline there: "
                      f"{'yes' if below else 'no'})")  # fmt: skip
            for n in sizes:
                ours = [Policy(*best[late, n][3:], allow_late=late, inputs=args.inputs) for late in OURS]
                jobs = make_jobs(sc.markets, args.jobs, n, 1, seed, mech)
                cells[n].append(
                    run_size(worlds, jobs, [*ours, Naive(True), Naive(False), UniformProgress()], mech)
                )
                runs.append((seed, sc.name, n, cells[n][-1]))
        in_scenario: dict[str, list[Row]] = {}
        for n in sizes:
            rows = pooled(cells[n])
            print(
                f"\n{sc.name}, {n} node(s), {len(rows[0].jobs)} held-out jobs (second half"
                + (f", {len(seeds)} seeds" if len(seeds) > 1 else "")
                + "):"
            )
            print(HEAD)
            for r in rows:
                print(r.line())
                every_row.setdefault(r.strategy, []).append(r)
                by_size.setdefault((n, r.strategy), []).append(r)
                in_scenario.setdefault(r.strategy, []).append(r)
            judged(rows, "cells", f"{sc.name} at {n} node(s)", cells[n])
        rows = [merged(name, rs) for name, rs in in_scenario.items()]
        print(f"\n### {sc.name}: all sizes together, {len(rows[0].jobs)} held-out jobs\n{HEAD}")
        print("\n".join(r.line() for r in rows))
        judged(rows, "scenarios", sc.name, of_seeds(lambda name, size: name == sc.name))

    for n in SIZES:
        names = [name for (size, name) in by_size if size == n]
        if names:
            print(f"\n## all scenarios, {n} node(s) (held out)\n{HEAD}")
            rows = [merged(name, by_size[n, name]) for name in names]
            print("\n".join(r.line() for r in rows))
            judged(rows, "sizes", f"{n} node(s)", of_seeds(lambda name, size: size == n))
    print(f"\n## all scenarios and sizes together (held out)\n{HEAD}")
    rows = [merged(name, rs) for name, rs in every_row.items()]
    print("\n".join(r.line() for r in rows))
    judged(rows, "all", "all together", of_seeds(lambda name, size: True))
    print(
        "\n## Where each setting of ours is at or below every baseline (cost, jobs on time within budget), held out"
        + (
            f", the {len(seeds)} seeds' jobs pooled (seed by seed: each seed's jobs alone, places x seeds)"
            if len(seeds) > 1
            else ""
        )
    )
    levels = {"cells": "per scenario and size", "scenarios": "per scenario, all sizes",
              "sizes": "per size, all scenarios", "all": "all jobs together"}  # fmt: skip
    for name, by_level in misses.items():
        for level, title in levels.items():
            missed = by_level.get(level, [])
            print(
                f"- {name}, {title}: {judged_at[level] - len(missed)} of {judged_at[level]}"
                + (f" (not: {'; '.join(missed)})" if missed else "")
                + (
                    f"; seed by seed: {seed_met[name, level][0]} of {seed_met[name, level][1]}"
                    if (name, level) in seed_met
                    else ""
                )
            )
    print(f"\n{time.monotonic() - t0:.0f} s")
    return 0


def seed_list(text: str) -> list[int]:
    """``A-B`` (both included) or ``A,B,...``: the seeds of a pooled run."""
    try:
        if "-" in text.strip("-"):
            lo, hi = (int(x) for x in text.split("-"))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be A-B or A,B,...: got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must name at least one seed, each once: got {text!r}")
    return seeds


def _seeds_text(seeds: list[int]) -> str:
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}, pooled)"
    return f"seeds {','.join(map(str, seeds))} ({len(seeds)}, pooled)"


def seed_by_seed(by_seed: list[list[Row]], seeds: list[int], name: str) -> str:
    """On how many of the seeds ``name`` was at or below every baseline on that seed's jobs alone."""
    missed = [str(seed) for seed, rows in zip(seeds, by_seed) if not below_every(rows, name)]
    return (
        f"{name}, seed by seed: at or below every baseline on {len(seeds) - len(missed)} of {len(seeds)} seeds"
        + (f" (not: {', '.join(missed)})" if missed else "")
    )


def _baselines(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.strategy not in OURS.values() and r.strategy != "always on-demand"]


def _at_or_below(ours: Row, base: Row) -> bool:
    return at_or_below((ours.cost, ours.kept), (base.cost, base.kept))


def paired_interval(ours: Row, base: Row, draws: int = 2000, level: float = 0.95):
    """A paired bootstrap over the jobs of a cell (both rows ran the same jobs): the ``level`` interval of
    ours - base, as (cost in points of the cell's on-demand cost, jobs kept). It treats the jobs as
    independent; jobs that overlap in time on one trace are not, so it is narrower than the truth."""
    dc = [o.cost - b.cost for o, b in zip(ours.outcomes, base.outcomes)]
    dk = [int(o) - int(b) for o, b in zip(ours.kept_each(), base.kept_each())]
    rng, n = random.Random(0), len(dc)
    costs, kept = [], []
    for _ in range(draws):
        pick = [rng.randrange(n) for _ in range(n)]
        costs.append(100 * sum(dc[i] for i in pick) / ours.od_cost)
        kept.append(sum(dk[i] for i in pick))
    costs.sort()
    kept.sort()
    lo, hi = round((1 - level) / 2 * (draws - 1)), round((1 + level) / 2 * (draws - 1))
    return (costs[lo], costs[hi]), (kept[lo], kept[hi])


def below_every(rows: list[Row], name: str) -> bool:
    """Whether ours (``name``) is at or below every baseline of ``rows``."""
    ours = next(r for r in rows if r.strategy == name)
    return all(_at_or_below(ours, r) for r in _baselines(rows))


def verdict(rows: list[Row], name: str) -> str:
    """Whether ours (``name``) costs no more than each baseline while keeping as many jobs on time within budget;
    where not, the difference and its 95 % paired-bootstrap interval over the cell's jobs."""
    ours = next(r for r in rows if r.strategy == name)
    mine = f"{name}: {ours.cost / ours.od_cost:.2%}, {ours.kept} kept"
    worse = []
    for r in _baselines(rows):
        if _at_or_below(ours, r):
            continue
        (c_lo, c_hi), (k_lo, k_hi) = paired_interval(ours, r)
        worse.append(
            f"{r.strategy} ({r.cost / r.od_cost:.2%}, {r.kept} kept; ours "
            f"{100 * (ours.cost - r.cost) / ours.od_cost:+.2f} points, {ours.kept - r.kept:+d} kept; 95 % "
            f"interval {c_lo:+.2f} to {c_hi:+.2f} points, {k_lo:+d} to {k_hi:+d} kept)"
        )
    if not worse:
        return f"{mine}: at or below every baseline's cost, with as many or more jobs on time within budget"
    return f"{mine}: NOT at or below (cost, jobs on time within budget) of: {', '.join(worse)}"


def frontier(rows: list[Row]) -> str:
    """Whether each baseline is matched or beaten (cost and jobs kept) by one of the two users' settings: the
    trade-off between them is the user's, so this is weaker than one setting at or below every baseline."""
    ours = [r for r in rows if r.strategy in OURS.values()]
    missed = [b.strategy for b in _baselines(rows) if not any(_at_or_below(o, b) for o in ours)]
    if not missed:
        return "either setting of ours: every baseline is matched or beaten by one of them"
    return f"either setting of ours: NOT matched or beaten by either: {', '.join(missed)}"


if __name__ == "__main__":
    raise SystemExit(main())

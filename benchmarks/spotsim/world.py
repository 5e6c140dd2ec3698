"""The simulated world: a market's zones as a group of n nodes sees them, and what a job is.

Per zone and tick: the chance to lose one of the group's nodes (hypergeometric, from the capacity drop), the
past-only loss rate our policy is told, and the draws that every strategy shares.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

from airflow_dtrain.spot.estimates import REJOIN_WAIT_S
from spot_traces import Market

SIZES = (1, 4, 16)
PRICE_RATIOS = (0.5, 0.75, 1.0)
MAX_RISKS = (0.25, 1.0, math.inf)
LATE_RISKS = (0.0, 0.05, 0.2, 0.5, 1.0)
BUDGET_CHANCES = (None, 0.0, 0.05, 0.2, 0.5)
# what decide() is told besides the offer and the job's own state: "measured", the offer's zone's interruption
# rate over the trailing 24 h and the trailing-day low as the price to wait for (inputs the bundled DAG does
# not gather); "dag", what train_llama gives it: one fixed rate (the author's, from history: here the first
# half's) and the price limit as the wait target (BudgetBranchOperator's default, max_spot_price)
INPUTS = ("measured", "dag")
# the user's choice, not a tuned parameter: late results within budget are worth having, or they are not
OURS = {True: "our policy", False: "our policy, on time or stop"}
# the same two settings on elastic groups (``elastic``): rows beside the baselines, never baselines themselves
ELASTIC = {True: "our policy, elastic", False: "our policy, elastic, on time or stop"}


@dataclass(frozen=True)
class Mechanics:
    startup_s: float = 300.0
    checkpoint_s: float = 1800.0
    step_s: float = 30.0
    risk_window_h: float = 24.0
    rerendezvous_s: float = 60.0  # an elastic group's resize: the survivors re-rendezvous, nothing relaunches
    # a resize to fewer than all N also waits for more nodes (a lost node's survivors, for its replacement):
    # with the launchers, until every survivor is back (REJOIN_WAIT_S, trainer/elastic/rdzv_round.py);
    # torch's own
    # rendezvous waits its last call (the JobSpec's replace_timeout_s, 30 s by default)
    replace_timeout_s: float = REJOIN_WAIT_S
    # a resize that only adds nodes (a replacement joins, the group grows back); None: rerendezvous_s, as the
    # launchers restart every survivor's workers for it. With an in-process resize (the others train on while
    # the joiner takes the state from a peer, as torchft does) it pauses them for far less.
    grow_resize_s: float | None = None

    @property
    def grow_s(self) -> float:
        """What a resize that only adds nodes costs the group."""
        return self.rerendezvous_s if self.grow_resize_s is None else self.grow_resize_s


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

    :param prior_ticks: the ticks a DAG author's fixed interruption rate is counted over (``prior_rate``;
        default the first half of the market, the part the parameters are chosen on).
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
        """One interruption rate for a group of n, as a DAG author would set ``interruption_rate_per_hour``
        from history: its losses per hour of running, every zone together, over the first ``prior_ticks``
        ticks (under an hour of it: 1/h, as ``rate``)."""
        if n not in self._prior:
            lost = up = 0.0
            for z, loss in zip(self.market.zones, self.loss(n)):
                lost += sum(loss[: self.prior_ticks])
                up += sum(c >= n for c in z.capacity[: self.prior_ticks])
            hours = up * self.market.tick_s / 3600
            self._prior[n] = lost / hours if hours >= 1.0 else 1.0
        return self._prior[n]

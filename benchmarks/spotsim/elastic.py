"""Elastic pod groups (issue #39): a group of N nodes that runs on k of them, min_nodes <= k <= N.

The model, beside the all-or-nothing group of ``strategies.simulate`` (same world, draws, billing and cap):

- on spot the group runs in one zone on k = min(N, the zone's capacity) nodes, whenever k >= min_nodes
  (default ceil(N / 2); ``--min-nodes-fraction``); on-demand it runs on all N.
- the global batch is fixed (gradient accumulation adapts): the same steps, each at k nodes k/N as fast, so
  progress is k/N of the full rate and a job's node-seconds do not depend on k.
- when the zone's capacity drops, the number of the group's k nodes lost is drawn from the hypergeometric
  tail with the zone's shared draw, so that at least one is lost exactly when an all-or-nothing group of k
  would be preempted. While min_nodes or more survive, the group goes on, on the survivors: a re-rendezvous
  (``Mechanics.rerendezvous_s``, billed, no progress) in place of the full relaunch, after their wait
  (``Mechanics.replace_timeout_s``: the launchers' round closes once every survivor is back, 2 s; a
  replacement needs a node's start-up, longer),
  and, with the warning, at most one step lost. Replacements for the lost (as many as the zone still has,
  up to N) are started at once, as the launchers do: their start-up is billed, and they join once booted
  (``Mechanics.startup_s`` later), which is a second resize. When fewer than min_nodes survive it stops as an
  all-or-nothing group does (a later launch pays the full start-up): a group of 1 is all-or-nothing.
- it grows back towards N at the first tick after a checkpoint was saved, when the zone has the nodes; a
  resize costs the re-rendezvous too, and the wait when it is to fewer than N. A resize that only adds nodes
  (a join, a grow) costs ``Mechanics.grow_s`` (``--grow-resize-s``; by default the re-rendezvous).
- billing: every node-second of every tick at the price in effect, on the nodes of that tick; the hard budget
  cap is checked before every tick (so at every size change), as for the all-or-nothing policy. With
  ``record`` set, each outcome carries its ledger: (tick, nodes, cost) per billed tick.
- topped up (``top_up``, ``--top-up``; off by default, as the launchers cannot place such a group yet): where
  ``decide()`` would move the group to on-demand on all N, it may keep the k spot nodes and add N - k
  on-demand ones (``top_up_on_demand``), at full speed. Nodes added join at once (the survivors train on while
  they boot: their start-up is billed, the group pays a re-rendezvous); on-demand nodes leave, or spot nodes
  take their place, at the tick after a checkpoint (a resize). Only the spot nodes can be lost; the on-demand
  ones count towards min_nodes.
- the policy: ``decide()`` itself, told ``min_nodes``, the offer's capacity (``spot_nodes_available``) and the
  resize's cost (``resize_overhead_s`` = ``Mechanics.rerendezvous_s``); it chooses spot on k of the N nodes
  with their time (N/k as long), the resize to grow back and the cap at every size (``ElasticPolicy``). Its
  parameters are the all-or-nothing setting's of the same user and size, or with ``--tune-elastic`` its own,
  chosen on the first half the same way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from airflow_dtrain.spot.estimates import BudgetInputs, Choice

from .strategies import Policy, State, _cheapest
from .world import ELASTIC, Job, Outcome, World


def min_nodes(n: int, fraction: float) -> int:
    """The fewest nodes a group of ``n`` runs on: ceil(fraction x n), at least 1 and at most n."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"min_nodes_fraction: in (0, 1], got {fraction!r}")
    return min(n, max(1, math.ceil(fraction * n - 1e-9)))


def nodes_lost(c_prev: int, c_now: int, k: int, u: float) -> int:
    """How many of a group's ``k`` nodes go when its zone's capacity drops from ``c_prev`` to ``c_now``,
    from the zone's shared draw ``u``: the largest j with u < P(at least j of them among the c_prev - c_now
    gone), so that one or more go exactly when an all-or-nothing group of k is preempted (``World.loss``)."""
    if c_now >= c_prev or k <= 0:
        return 0
    gone = c_prev - c_now
    total = math.comb(c_prev, gone)
    tail, lost = 1.0, 0
    # At most min(k, gone) go: P(at least min(k, gone) + 1) is 0, which the float sum need not reach exactly.
    for j in range(min(k, gone)):
        tail -= math.comb(k, j) * math.comb(c_prev - k, gone - j) / total  # now P(at least j + 1)
        if u < tail or j < k - c_now:  # below the capacity left, the loss is certain
            lost = j + 1
        else:
            break
    return lost


@dataclass
class ElasticState(State):
    nodes: int = 0  # the spot nodes the group runs on now (on on-demand: all its nodes)
    od: int = 0  # on spot, the on-demand nodes it is topped up with
    grow: bool = False  # a checkpoint was saved in the last tick: the group may grow back now
    joining: int = 0  # replacements for lost nodes, booting
    join_left: float = 0.0  # seconds until they have booted and join
    idle_why: str = "launch"  # what the time without progress (``startup_left``) is: a launch or a resize


@dataclass
class ElasticOutcome(Outcome):
    resizes: int = 0
    od_dollars: float = 0.0  # of ``cost``, what the on-demand nodes billed
    ledger: list[tuple[int, int, float]] = field(default_factory=list)  # (tick, nodes, cost), with record
    spend: dict[str, float] = field(default_factory=dict)  # ``cost`` by what it bought (``SPEND``)


SPEND = ("training on spot", "training on on-demand", "launches' start-up", "resizes and their wait",
         "replacements' boot")  # fmt: skip
"""What an elastic group's dollars buy (``ElasticOutcome.spend``): progress on each kind of node, or none."""


class ElasticPolicy(Policy):
    """Our policy on an elastic group: a zone with at least min_nodes of the N at or below the price limit is
    an offer, and decide() is told the group's ``min_nodes``, the offer's ``spot_nodes_available`` and the
    resize's cost (``Mechanics.rerendezvous_s``): it knows elastic groups itself (the time at k nodes, the
    resize, the cap at every size). The interruption rate is that of a group of the k nodes it would run on.
    """

    def __init__(
        self, *params, min_fraction: float = 0.5, record: bool = False, top_up: bool = False, **kw
    ) -> None:
        super().__init__(*params, **kw)
        self.min_fraction, self.record, self.top_up = min_fraction, record, top_up
        self.name = ELASTIC[self.allow_late]

    def run(self, world: World, job: Job) -> ElasticOutcome:
        """One job on an elastic group (``run_size`` calls this in place of ``simulate``)."""
        return simulate_elastic(world, job, self)

    def offer(self, world: World, k: int, n: int, s: State) -> int | None:
        """As ``Policy.offer``, with a zone of at least min_nodes usable: the cheapest with all n within
        the limit, else the one within the limit with the most of min_nodes or more (of equals, the
        cheapest), else ``Policy.offer``'s."""
        m, limit = world.market, self.limit(world.market)
        if s.mode == "spot":
            return s.zone if m.zones[s.zone].price[k] <= limit else None
        cand = _cheapest(world, k, n, ok=lambda i: m.zones[i].price[k] <= limit)
        if cand is not None:
            return cand
        lowest = min_nodes(n, self.min_fraction)
        usable = [i for i, z in enumerate(m.zones) if z.price[k] <= limit and z.capacity[k] >= lowest]
        if not usable:
            return super().offer(world, k, n, s)  # what it could have, as the all-or-nothing policy is told
        return max(usable, key=lambda i: (min(n, m.zones[i].capacity[k]), -m.zones[i].price[k]))

    def budget_inputs(self, world, job, k, elapsed, s, cost, cand) -> BudgetInputs:
        inputs = super().budget_inputs(world, job, k, elapsed, s, cost, cand)
        n, lowest = job.nodes, min_nodes(job.nodes, self.min_fraction)
        inputs = dataclasses.replace(
            inputs, min_nodes=lowest, resize_overhead_s=world.mech.rerendezvous_s,
            replace_timeout_s=world.mech.replace_timeout_s, top_up_on_demand=self.top_up,
            topped_up=getattr(s, "od", 0) if s.mode == "spot" else 0,
        )  # fmt: skip
        have = min(n, world.market.zones[cand].capacity[k]) if cand is not None else 0
        if cand is None or have >= n or have < lowest:
            return inputs
        rate = world.rate(have)[cand][k] if self.inputs == "measured" else world.prior_rate(have)
        return dataclasses.replace(inputs, interruption_rate_per_hour=rate)


def _lose_nodes(world: World, job: Job, k: int, s: ElasticState, out: ElasticOutcome, lowest: int) -> float:
    """The capacity drop of tick ``k``: the spot nodes lost. While the survivors and the on-demand nodes are
    ``lowest`` or more, the group re-rendezvous on them and starts replacements from the zone's free nodes (up
    to N), which join when booted (``_join``); else it stops. Returns the replacements' boot, billed."""
    cap = world.market.zones[s.zone].capacity
    lost = nodes_lost(cap[k - 1], cap[k], s.nodes, world.draws[s.zone][k]) if k > 0 else 0
    if not lost:
        return 0.0
    out.preemptions += 1
    s.done = max(s.saved, s.done - world.mech.step_s)  # warned: saves, loses at most one step
    s.saved = s.done
    if s.nodes - lost + s.od < lowest:
        s.mode, s.zone, s.nodes, s.od, s.startup_left, s.joining = None, None, 0, 0, 0.0, 0
        return 0.0
    # the survivors go on, once their round has closed (every one of them back)
    s.nodes, s.startup_left = s.nodes - lost, world.mech.rerendezvous_s + world.mech.replace_timeout_s
    s.idle_why = "resize"
    out.resizes += 1
    asked = max(0, min(job.nodes - s.od, cap[k]) - s.nodes - s.joining)
    if asked:
        s.joining, s.join_left = s.joining + asked, world.mech.startup_s
    return world.mech.startup_s / 3600 * asked * world.market.zones[s.zone].price[k]


def _join(world: World, job: Job, k: int, s: ElasticState, out: ElasticOutcome) -> None:
    """Tick ``k`` of a group on spot: replacements that have booted join it (a resize; their boot was billed
    when they were started), as many as the zone still has."""
    if not s.joining:
        return
    s.join_left -= world.market.tick_s
    if s.join_left > 1e-9:
        return
    free = min(world.market.zones[s.zone].capacity[k], job.nodes - s.od) - s.nodes
    joins, s.joining = max(0, min(s.joining, free)), 0
    if joins:
        _resize(world, job, s, out, s.nodes + joins, s.od, (0.0, 0.0))


def _resize(
    world: World, job: Job, s: ElasticState, out: ElasticOutcome, spot: int, od: int, prices: tuple
) -> float:
    """The group becomes ``spot`` spot and ``od`` on-demand nodes (a re-rendezvous, saved first, with the
    round's last call when that is fewer than N); returns the boot of the nodes that join, billed at their
    prices ``(spot, on-demand)``: they start while the others train."""
    boot = world.mech.startup_s / 3600 * (max(0, spot - s.nodes) * prices[0] + max(0, od - s.od) * prices[1])
    grows = spot >= s.nodes and od >= s.od  # nodes only join: none leaves or is swapped
    s.nodes, s.od, s.saved = spot, od, s.done
    wait = world.mech.replace_timeout_s if spot + od < job.nodes else 0.0
    pause = (world.mech.grow_s if grows else world.mech.rerendezvous_s) + wait
    if s.startup_left < pause:
        s.startup_left, s.idle_why = pause, "resize"
    out.resizes += 1
    return boot


def _apply(world: World, job: Job, k: int, s: ElasticState, out: ElasticOutcome, decision, zone) -> float:
    """The strategy's decision: a switch or launch (full start-up, save first); or, staying on spot, a top-up
    with on-demand nodes (at once), their leave or a grow back to what the zone has (at the tick after a
    checkpoint), each a resize. Returns the boot billed for nodes that join a running group."""
    m, n = world.market, job.nodes
    want = {Choice.SPOT: "spot", Choice.ON_DEMAND: "od"}.get(decision.choice)
    od = decision.on_demand_nodes if want == "spot" else 0
    have = m.zones[zone].capacity[k] if want == "spot" else 0
    prices = (m.zones[zone].price[k] if want == "spot" else 0.0, m.on_demand_price)
    if want == "spot" and od and s.mode == "od":  # on-demand on all: k of them give way to spot nodes
        s.mode, s.zone, s.nodes, s.od = "spot", zone, 0, n
        return _resize(world, job, s, out, min(n - od, have), od, prices)
    if want != s.mode or (want == "spot" and zone != s.zone):
        if s.mode is not None:
            s.saved = s.done
            out.switches += want is not None
        s.mode, s.zone, s.nodes, s.od, s.joining = want, zone, 0, 0, 0
        if want is not None:
            s.startup_left, s.idle_why = world.mech.startup_s, "launch"
            s.nodes, s.od = (n, 0) if want == "od" else (min(n - od, have), od)
            out.launches += 1
        return 0.0
    if s.mode != "spot" or s.joining:  # replacements booting: they are the group's growth
        return 0.0
    spot = min(n - od, have)
    if od > s.od or (s.grow and (spot, od) != (s.nodes, s.od)):
        return _resize(
            world, job, s, out, spot, od, prices
        )  # a top-up now; a grow, leave or swap at a checkpoint
    return 0.0


def simulate_elastic(world: World, job: Job, strategy: ElasticPolicy) -> ElasticOutcome:
    """One job of an elastic group under ``strategy``, tick by tick (the model: the module's docstring)."""
    m, mech, n, dt = world.market, world.mech, job.nodes, world.market.tick_s
    lowest = min_nodes(n, strategy.min_fraction)
    s, out = ElasticState(), ElasticOutcome()
    for k in range(job.start, job.horizon):
        elapsed = (k - job.start) * dt
        boot = 0.0
        if s.mode == "spot":
            _join(world, job, k, s, out)
            boot = _lose_nodes(world, job, k, s, out, lowest)
        choice, zone = strategy.choose(world, job, k, elapsed, s, out.cost)
        if choice == Choice.STOP:
            out.stopped = True
            return out
        boot += _apply(world, job, k, s, out, strategy.last, zone)
        s.grow = False
        if s.mode is None:
            continue
        # the group's dollars per hour on its spot and on its on-demand nodes (on on-demand: all of them)
        od_h = (s.od if s.mode == "spot" else s.nodes) * m.on_demand_price
        spot_h = s.nodes * m.zones[s.zone].price[k] if s.mode == "spot" else 0.0
        useful = max(0.0, dt - s.startup_left)
        rate = (s.nodes + s.od) / n  # fixed global batch: k nodes make k/N of the full progress
        over = max(0.0, s.done + useful * rate - job.work_s) / rate  # wall seconds past the finish
        tick_cost = (dt - over) / 3600 * (spot_h + od_h) + boot
        if out.cost + tick_cost > job.budget + 1e-9:
            out.stopped = True  # the trainer saves and exits before the spend passes the cap
            return out
        _book(out.spend, s, spot_h, od_h, dt - over, boot)
        s.startup_left = max(0.0, s.startup_left - dt)
        out.cost += tick_cost
        out.od_dollars += (dt - over) / 3600 * od_h
        out.started = True
        if strategy.record:
            out.ledger.append((k, s.nodes + s.od, tick_cost))
        s.done += useful * rate
        if s.done - s.saved >= mech.checkpoint_s:
            s.saved = s.done - (s.done - s.saved) % mech.checkpoint_s
            s.grow = True
        if s.done >= job.work_s - 1e-9:
            out.time_s = elapsed + dt - over
            out.finished = True
            return out
    return out  # the trace ended first


def _book(spend: dict[str, float], s: ElasticState, spot_h: float, od_h: float, wall: float, boot: float):
    """A billed tick of ``wall`` seconds in ``spend`` (``SPEND``): the part without progress as a launch's
    start-up or a resize, the rest as training on spot or on on-demand; ``spot_h``, ``od_h``: the group's
    dollars per hour on its spot and on its on-demand nodes."""
    idle = min(wall, s.startup_left)
    parts = {
        "launches' start-up" if s.idle_why == "launch" else "resizes and their wait": idle * (spot_h + od_h),
        "training on spot": (wall - idle) * spot_h,
        "training on on-demand": (wall - idle) * od_h,
    }
    for what, dollars in parts.items():
        spend[what] = spend.get(what, 0.0) + dollars / 3600
    spend["replacements' boot"] = spend.get("replacements' boot", 0.0) + boot


def where_the_dollars_go(rows: list, markets: list) -> list[str]:
    """Per elastic row of a table (``tables.Row``): its cost, as % of on-demand, by what it bought
    (``SPEND``), then by market: its jobs' cost against their on-demand cost, and their training on
    on-demand."""
    lines = []
    for r in rows:
        if r.strategy not in ELASTIC.values():
            continue
        total = {what: sum(o.spend.get(what, 0.0) for o in r.outcomes) for what in SPEND}
        lines.append(f"- {r.strategy}, where its dollars go (% of on-demand): "
                     + "; ".join(f"{what} {v / r.od_cost:.1%}" for what, v in total.items()))  # fmt: skip
        for i, market in enumerate(markets):
            mine = [(j, o) for j, o in zip(r.jobs, r.outcomes) if j.market == i]
            if not mine:
                continue
            od = sum(j.od_cost(r.mech, market.on_demand_price) for j, _ in mine)
            on_od = sum(o.spend.get("training on on-demand", 0.0) for _, o in mine)
            cost = sum(o.cost for _, o in mine)
            lines.append(f"  - {market.name}: {len(mine)} jobs, {od / r.od_cost:.0%} of the on-demand cost; "
                         f"cost {cost / od:.1%} of theirs, of it training on on-demand "
                         f"{on_od / od:.1%}")  # fmt: skip
    return lines

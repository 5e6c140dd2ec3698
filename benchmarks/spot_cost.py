"""Spot-cost simulator: the budget policy vs always-on-demand vs naive always-spot, on real traces.

    python benchmarks/spot_cost.py [TRACE_DIR] [--jobs 500] [--seed 0] [--hazard-trace auto|none|PATH]

TRACE_DIR (default ``../shared/data/spot`` relative to the repository) is searched for:

- spot price series: a JSON object ``{zone: [price per tick, ...]}`` (e.g. SkyNomad's
  ``v100_spot_prices.json``), or per-zone JSON files ``{"prices": [...], "gap_seconds": s,
  "price_info": {"on_demand_price": p, "instance_type": t}}``; the file with the most zones wins;
- availability per zone: CSV files ``date,availability`` (1 = a spot instance could be
  launched) whose name starts with the zone's key, row i aligned with price tick i. A zone
  without one is taken as always available;
- optionally, preemption events of running instances: CSV ``ms_since_start,add|remove,node``
  (the Bamboo traces), turned into a per-node-hour hazard for the stress scenario.

Model (stated assumptions):

- A job is W seconds of compute on ``n`` nodes (its on-demand duration); its deadline is
  1.25 × (W + start-up) and its budget a random fraction of its on-demand cost.
- A spot group runs in one zone; it is preempted when the zone's availability drops to 0
  (the traces are launch probes, the usual reading in Can't Be Late / SkyNomad), and in the
  stress scenario also by a Poisson hazard per node-hour taken from the Bamboo trace.
- Every (re)start costs ``--startup-s`` of billed time before training resumes.
- The policy gets the two-minute warning, so its trainers checkpoint now and lose at most
  one step; the naive strategy loses the work since its last periodic checkpoint.
- The policy sees only the past: prices and availability now, interruption rates over the
  trailing 72 h. It runs ``airflow_dtrain.spot.budget.decide`` every tick (195 s in the
  SkyNomad trace), as a DAG with SpotPriceSensor -> BudgetBranchOperator would between runs.
- Billing per second at the price of each tick; on-demand is always available.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_dtrain.spot.budget import BudgetInputs, Choice, decide  # noqa: E402
from airflow_dtrain.spot.offers import ON_DEMAND_USD_PER_HOUR  # noqa: E402

DEFAULT_TRACES = REPO.parent / "shared" / "data" / "spot"


# -- traces ---------------------------------------------------------------------------------


@dataclass
class Market:
    zones: list[str]
    prices: dict[str, list[float]]
    available: dict[str, list[int]]
    tick_s: float
    on_demand: float
    instance_type: str | None
    sources: list[str] = field(default_factory=list)
    hazard_per_node_hour: float = 0.0

    @property
    def ticks(self) -> int:
        return min(len(p) for p in self.prices.values())

    def recent_low(self, window_h: float = 24.0) -> list[float]:
        """Per tick: the lowest price of any zone over the trailing window (past only)."""
        if getattr(self, "_recent_low", None) is None:
            from collections import deque

            w = max(1, int(window_h * 3600 / self.tick_s))
            cheapest = [min(self.prices[z][k] for z in self.zones) for k in range(self.ticks)]
            out, window = [], deque()
            for k, price in enumerate(cheapest):
                while window and window[-1][1] >= price:
                    window.pop()
                window.append((k, price))
                if window[0][0] <= k - w:
                    window.popleft()
                out.append(window[0][1])
            self._recent_low = out
        return self._recent_low


def _price_series(path: Path):
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(doc, dict) and isinstance(doc.get("prices"), list):
        return {path.stem: doc["prices"]}, doc.get("gap_seconds"), doc.get("price_info") or {}
    if isinstance(doc, dict) and doc and all(
        isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v[:50]) for v in doc.values()
    ):
        return doc, None, {}
    return None


def load_market(trace_dir: Path, *, on_demand: float | None, tick_s: float | None, hazard_trace: str) -> Market:
    if not trace_dir.is_dir():
        raise SystemExit(f"trace directory {trace_dir} does not exist")
    best, gap, info, sources = None, None, {}, []
    per_zone_info: list[tuple[float | None, dict]] = []
    per_zone: dict[Path, dict[str, list[float]]] = {}  # one-zone files, grouped by folder
    for path in sorted(trace_dir.rglob("*.json")):
        found = _price_series(path)
        if found is None:
            continue
        series, g, i = found
        if g or i:
            per_zone_info.append((g, i))
            per_zone.setdefault(path.parent, {}).update(series)
            continue
        if best is None or len(series) > len(best[0]):
            best = (series, [path])
    for folder, series in per_zone.items():
        if best is None or len(series) > len(best[0]):
            best = (series, sorted(folder.glob("*.json")))
    if best is None:
        raise SystemExit(f"{trace_dir}: no spot price series found (JSON {{zone: [prices]}} or {{'prices': [...]}})")
    prices, price_paths = best
    sources.extend(str(path.relative_to(trace_dir)) for path in price_paths)
    for g, i in per_zone_info:  # tick length / on-demand price from the per-zone files of the capture
        gap, info = gap or g, info or i
    tick = tick_s or gap or 195.0
    instance_type = info.get("instance_type")
    od = on_demand or info.get("on_demand_price") or ON_DEMAND_USD_PER_HOUR.get(instance_type or "", None)
    if od is None:
        raise SystemExit("no on-demand price in the traces: pass --on-demand-price")
    available: dict[str, list[int]] = {}
    csvs = sorted(trace_dir.rglob("*.csv"))
    for zone in prices:
        for path in csvs:
            if path.stem.startswith(zone) or zone.startswith(path.stem):
                with path.open() as fh:
                    rows = list(csv.DictReader(fh))
                if rows and "availability" in rows[0]:
                    available[zone] = [int(float(r["availability"])) for r in rows]
                    sources.append(str(path.relative_to(trace_dir)))
                    break
        available.setdefault(zone, [1] * len(prices[zone]))
    n = min(min(len(p) for p in prices.values()), min(len(a) for a in available.values()))
    prices = {z: [float(x) for x in p[:n]] for z, p in prices.items()}
    available = {z: a[:n] for z, a in available.items()}
    market = Market(sorted(prices), prices, available, float(tick), float(od), instance_type, sources)
    if hazard_trace != "none":
        paths = [Path(hazard_trace)] if hazard_trace != "auto" else [p for p in csvs if _is_event_trace(p)]
        hazards = [(p, _hazard(p)) for p in paths]
        hazards = [(p, h) for p, h in hazards if h is not None]
        if hazards:  # the first p3 trace if any (same instance family as the price series), else the first
            path, h = next(((p, h) for p, h in hazards if p.name.startswith("p3")), hazards[0])
            market.hazard_per_node_hour = h
            market.sources.append(str(path.relative_to(trace_dir)) if path.is_relative_to(trace_dir) else str(path))
    return market


def _is_event_trace(path: Path) -> bool:
    with path.open() as fh:
        first = fh.readline().strip().split(",")
    return len(first) == 3 and first[1] in ("add", "remove") and first[0].isdigit()


def _hazard(path: Path) -> float | None:
    """Removes per node-hour in an ``ms,add|remove,node`` trace."""
    up: set[str] = set()
    last = node_hours = 0.0
    removes = 0
    with path.open() as fh:
        for row in csv.reader(fh):
            if len(row) != 3 or not row[0].isdigit():
                continue
            t = int(row[0]) / 3.6e6
            node_hours += len(up) * (t - last)
            last = t
            if row[1] == "add":
                up.add(row[2])
            else:
                up.discard(row[2])
                removes += 1
    return removes / node_hours if node_hours > 0 else None


def trailing_rates(market: Market, window_h: float = 72.0) -> dict[str, list[float]]:
    """Per zone and tick: availability drops per available hour over the trailing window (past only)."""
    w = max(1, int(window_h * 3600 / market.tick_s))
    rates = {}
    for z in market.zones:
        a = market.available[z]
        drops = [0] * (len(a) + 1)
        up = [0] * (len(a) + 1)
        for k in range(len(a)):
            drops[k + 1] = drops[k] + (1 if k > 0 and a[k - 1] == 1 and a[k] == 0 else 0)
            up[k + 1] = up[k] + a[k]
        r = []
        for k in range(len(a)):
            lo = max(0, k - w)
            hours = (up[k] - up[lo]) * market.tick_s / 3600
            r.append((drops[k] - drops[lo]) / hours if hours > 1 else 0.5)  # no history: assume risky
        rates[z] = r
    return rates


# -- jobs and strategies ---------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    start: int
    work_s: float
    nodes: int
    budget: float
    deadline_s: float


@dataclass
class Outcome:
    cost: float = 0.0
    time_s: float = 0.0
    completed: bool = False
    preemptions: int = 0
    stopped: bool = False


@dataclass(frozen=True)
class Params:
    startup_s: float = 300.0
    step_s: float = 10.0
    naive_checkpoint_every_s: float = 1800.0
    max_price_fraction: float = 0.6
    stretch: float = 1.25


def make_jobs(market: Market, n: int, seed: int, p: Params) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    for _ in range(n):
        work_h = math.exp(rng.uniform(math.log(2), math.log(48)))
        nodes = rng.choice([1, 1, 2, 4, 8])
        od_time = work_h * 3600 + p.startup_s
        od_cost = od_time / 3600 * nodes * market.on_demand
        room = int(4 * od_time / market.tick_s) + 2
        start = rng.randrange(0, max(1, market.ticks - room))
        jobs.append(Job(start, work_h * 3600, nodes, od_cost * rng.uniform(0.5, 1.5), p.stretch * od_time))
    return jobs


def on_demand_only(job: Job, market: Market, p: Params, rng: random.Random) -> Outcome:
    t = job.work_s + p.startup_s
    return Outcome(cost=t / 3600 * job.nodes * market.on_demand, time_s=t, completed=True)


def _preempted(market: Market, zone: str, k: int, nodes: int, rng: random.Random) -> bool:
    if not market.available[zone][k]:
        return True
    h = market.hazard_per_node_hour
    return h > 0 and rng.random() < 1 - math.exp(-h * nodes * market.tick_s / 3600)


def naive_spot(job: Job, market: Market, p: Params, rng: random.Random) -> Outcome:
    """Cheapest available zone, run until preempted, lose work since the last periodic checkpoint."""
    out, dt = Outcome(), market.tick_s
    done = saved = 0.0
    zone, startup = None, 0.0
    for k in range(job.start, market.ticks):
        if zone is not None and _preempted(market, zone, k, job.nodes, rng):
            out.preemptions += 1
            done, zone = saved, None
        if zone is None:
            offers = [(market.prices[z][k], z) for z in market.zones if market.available[z][k]]
            if offers:
                zone, startup = min(offers)[1], p.startup_s
        if zone is not None:
            out.cost += dt / 3600 * job.nodes * market.prices[zone][k]
            useful = max(0.0, dt - startup)
            startup = max(0.0, startup - dt)
            done += useful
            if done - saved >= p.naive_checkpoint_every_s:
                saved = done - (done - saved) % p.naive_checkpoint_every_s
        out.time_s += dt
        if done >= job.work_s:
            out.completed = True
            out.time_s -= (done - job.work_s)  # finished part-way through the tick
            return out
    return out


def policy(job: Job, market: Market, p: Params, rng: random.Random, rates: dict[str, list[float]]) -> Outcome:
    """SpotPriceSensor (cheapest available zone under the limit, risk-adjusted) + decide() every tick."""
    out, dt = Outcome(), market.tick_s
    done = 0.0
    mode, zone, startup = None, None, 0.0  # mode: None | "spot" | "od"
    limit = p.max_price_fraction * market.on_demand
    recent_low = market.recent_low()
    for k in range(job.start, market.ticks):
        if mode == "spot" and _preempted(market, zone, k, job.nodes, rng):
            out.preemptions += 1  # warning -> checkpoint now: at most one step lost
            done = max(0.0, done - p.step_s)
            mode = zone = None
        elapsed = out.time_s
        offers = [
            (market.prices[z][k] * (1 + rates[z][k] * p.startup_s / 3600), z)
            for z in market.zones
            if market.available[z][k] and market.prices[z][k] <= limit
        ]
        best = min(offers)[1] if offers else None
        cand = zone if mode == "spot" else best
        launching_spot = mode != "spot"
        launching_od = mode != "od"
        remaining = job.work_s - done + (startup if mode else 0.0)
        spot_work = remaining + (p.startup_s if launching_spot else 0.0)
        inputs = BudgetInputs(
            steps_remaining=math.ceil(spot_work / p.step_s),
            step_time_s=p.step_s,
            num_nodes=job.nodes,
            spot_price=market.prices[cand][k] if cand else None,
            on_demand_price=market.on_demand,
            remaining_budget=max(0.0, job.budget - out.cost),
            interruption_rate_per_hour=rates[cand][k] if cand else 0.0,
            restart_overhead_s=p.startup_s,
            lost_work_s=p.step_s,
            deadline_s=max(0.0, job.deadline_s - elapsed - p.startup_s - dt),
            max_wait_s=math.inf,
            wait_interval_s=dt,
            wait_target_price=recent_low[k],  # what a wait can hope for: the past day's lowest price
        )
        d = decide(inputs)
        if d.choice == Choice.ON_DEMAND and launching_od:
            # the on-demand estimate must include its own start-up
            od_inputs = BudgetInputs(**{**inputs.__dict__, "steps_remaining": math.ceil((remaining + p.startup_s) / p.step_s), "spot_price": None})
            d = decide(od_inputs)
        if d.choice == Choice.STOP:
            out.stopped = True
            return out
        if d.choice == Choice.WAIT:
            mode = zone = None
        elif d.choice == Choice.SPOT and mode != "spot":
            mode, zone, startup = "spot", cand, p.startup_s
        elif d.choice == Choice.ON_DEMAND and mode != "od":
            mode, zone, startup = "od", None, p.startup_s
        if mode is not None:
            price = market.prices[zone][k] if mode == "spot" else market.on_demand
            out.cost += dt / 3600 * job.nodes * price
            done += max(0.0, dt - startup)
            startup = max(0.0, startup - dt)
        out.time_s += dt
        if done >= job.work_s:
            out.completed = True
            out.time_s -= done - job.work_s
            return out
    return out


# -- report ----------------------------------------------------------------------------------


def summarise(name: str, jobs: list[Job], outcomes: list[Outcome], od: list[Outcome], p: Params) -> dict:
    ratios = [o.time_s / r.time_s for o, r in zip(outcomes, od) if o.completed]
    return {
        "strategy": name,
        "cost": sum(o.cost for o in outcomes),
        "cost_vs_od": sum(o.cost for o in outcomes) / sum(r.cost for r in od),
        "completed": sum(o.completed for o in outcomes),
        "time_mean": statistics.fmean(ratios) if ratios else float("nan"),
        "time_p95": sorted(ratios)[int(0.95 * (len(ratios) - 1))] if ratios else float("nan"),
        "time_max": max(ratios) if ratios else float("nan"),
        "late": sum(r > p.stretch + 1e-9 for r in ratios),
        "violations": sum(o.cost > j.budget + 1e-9 for o, j in zip(outcomes, jobs)),
        "stopped": sum(o.stopped for o in outcomes),
        "preemptions": sum(o.preemptions for o in outcomes),
    }


def run(market: Market, jobs: list[Job], p: Params, seed: int) -> list[dict]:
    rates = trailing_rates(market)
    od = [on_demand_only(j, market, p, random.Random(seed)) for j in jobs]
    naive = [naive_spot(j, market, p, random.Random(seed * 7919 + i)) for i, j in enumerate(jobs)]
    pol = [policy(j, market, p, random.Random(seed * 7919 + i), rates) for i, j in enumerate(jobs)]
    return [
        summarise("budget policy", jobs, pol, od, p),
        summarise("always on-demand", jobs, od, od, p),
        summarise("naive always-spot", jobs, naive, od, p),
    ]


def table(rows: list[dict], n: int) -> str:
    head = (
        f"| strategy | total cost | cost / on-demand | completed (of {n}) | time / on-demand: mean, p95, max "
        f"| > 1.25× | budget violations | stopped (budget) | preemptions |"
    )
    lines = [head, "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['strategy']} | ${r['cost']:,.0f} | {r['cost_vs_od']:.1%} | {r['completed']} | "
            f"{r['time_mean']:.3f}, {r['time_p95']:.3f}, {r['time_max']:.3f} | {r['late']} | {r['violations']} | "
            f"{r['stopped']} | {r['preemptions']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace_dir", nargs="?", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--on-demand-price", type=float, default=None)
    ap.add_argument("--tick-s", type=float, default=None, help="seconds per trace tick (default: from the traces, else 195)")
    ap.add_argument("--hazard-trace", default="auto", help="preemption-event CSV for the stress scenario: auto, none or a path")
    ap.add_argument("--startup-s", type=float, default=300.0)
    args = ap.parse_args(argv)

    market = load_market(args.trace_dir, on_demand=args.on_demand_price, tick_s=args.tick_s, hazard_trace=args.hazard_trace)
    p = Params(startup_s=args.startup_s)
    jobs = make_jobs(market, args.jobs, args.seed, p)
    print(f"traces: {args.trace_dir}")
    for s in market.sources:
        print(f"  - {s}")
    print(
        f"{len(market.zones)} zones, {market.ticks} ticks of {market.tick_s:.0f} s "
        f"({market.ticks * market.tick_s / 86400:.1f} days), {market.instance_type or 'instance'} on-demand "
        f"${market.on_demand:.2f}/h; {len(jobs)} jobs, seed {args.seed}, 2-48 h of compute on 1-8 nodes, "
        f"budget 0.5-1.5x on-demand cost, deadline 1.25x on-demand time, start-up {p.startup_s:.0f} s"
    )
    hazard = market.hazard_per_node_hour
    market.hazard_per_node_hour = 0.0
    print("\nA. preemption = the zone's availability drops to 0")
    print(table(run(market, jobs, p, args.seed), len(jobs)))
    if hazard:
        market.hazard_per_node_hour = hazard
        print(f"\nB. stress: A + Poisson preemptions at {hazard:.3f} per node-hour (Bamboo trace)")
        print(table(run(market, jobs, p, args.seed), len(jobs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

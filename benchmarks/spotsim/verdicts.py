"""Verdicts on the held-out jobs: is ours at or below every baseline, and if not, by how much."""

from __future__ import annotations

import random

from .tables import Row
from .tuning import at_or_below
from .world import ELASTIC, OURS


def seed_by_seed(by_seed: list[list[Row]], seeds: list[int], name: str) -> str:
    """On how many of the seeds ``name`` was at or below every baseline on that seed's jobs alone."""
    missed = [str(seed) for seed, rows in zip(seeds, by_seed) if not below_every(rows, name)]
    return (
        f"{name}, seed by seed: at or below every baseline on {len(seeds) - len(missed)} of "
        f"{len(seeds)} seeds" + (f" (not: {', '.join(missed)})" if missed else "")
    )


def _baselines(rows: list[Row]) -> list[Row]:
    ours = {*OURS.values(), *ELASTIC.values()}
    return [r for r in rows if r.strategy not in ours and r.strategy != "always on-demand"]


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
    """Whether ours (``name``) costs no more than each baseline while keeping as many jobs on time within
    budget; where not, the difference and its 95 % paired-bootstrap interval over the cell's jobs."""
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

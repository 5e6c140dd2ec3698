"""Choosing our policy's parameters on the first half of each trace: per-job outcomes, scores, ``tune``."""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os

from .elastic import ElasticPolicy
from .strategies import Naive, Policy, UniformProgress
from .tables import Row, distinct_sets, make_jobs, run_size
from .world import OURS, Mechanics, World


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


_TUNING: tuple = ()  # (worlds, jobs per size, mech, inputs, elastic) of the tuning under way, for the workers


def _tune_set(task: tuple[bool, tuple]) -> dict:
    """Per size n, the per-job outcomes of one parameter set on all-or-nothing groups (key n) and, with an
    elastic min_nodes fraction, on elastic groups of more than one node (key (n, "elastic"))."""
    late, params = task
    worlds, jobs, mech, inputs, fraction = _TUNING
    out: dict = {n: per_job(run_size(worlds, js, [Policy(*params, allow_late=late, inputs=inputs)], mech)[1])
                 for n, js in jobs.items()}  # fmt: skip
    for n, js in jobs.items():
        if fraction is not None and n > 1:
            policy = ElasticPolicy(*params, allow_late=late, inputs=inputs, min_fraction=fraction)
            out[n, "elastic"] = per_job(run_size(worlds, js, [policy], mech)[1])
    return out


def tune(
    worlds: list[World],
    sizes: list[int],
    n_jobs: int,
    seed: int,
    mech: Mechanics,
    inputs: str = "measured",
    elastic: float | None = None,
):
    """Per user (``allow_late`` on and off) and job size (known when a job is submitted), on ``n_jobs`` jobs
    of the first half simulated on that half: the parameter set most surely at or below every baseline there,
    that is with the largest ``surest`` (cost, and jobs kept on time within budget, against each baseline); of
    equals, the lowest cost + a full on-demand job's cost per job not kept. Every set runs in a process pool
    (fork, one process per CPU). Returns {(allow_late, size): (below, score, surest, *parameters)}; with
    ``elastic`` (a min_nodes fraction) also {(allow_late, size, "elastic"): ...} for elastic groups of more
    than one node, chosen the same way against the same baselines (a group of 1 is all-or-nothing)."""
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
    _TUNING = (halves, jobs, mech, inputs, elastic)
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
        for key, mine in outcome.items():
            n = key[0] if isinstance(key, tuple) else key
            points = score(mine, od[n])
            below = all(at_or_below(totals(mine), totals(b)) for b in bases[n])
            z = surest(mine, bases[n])
            at = (late, *key) if isinstance(key, tuple) else (late, key)
            if at not in best or (-z, points) < best[at][0]:
                best[at] = ((-z, points), below, points, z, *params)
    return {key: value[1:] for key, value in best.items()}

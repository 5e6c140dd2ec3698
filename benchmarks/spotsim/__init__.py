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
  the held-out jobs of every seed pooled in the tables and verdicts, and after each verdict the number of
  seeds on whose jobs alone each setting met it. A cell of one seed is 200 jobs that share one draw of the
  market's preemptions: its verdict is a coin toss where two strategies differ by a point or a job; pooled
  seeds are the expectation the verdict is about.

The package, in the order a run uses it: ``world`` (markets as a group of n sees them, jobs), ``strategies``
(the strategies and ``simulate``), ``elastic`` (elastic pod groups: ``simulate_elastic`` and our policy on
them, rows beside the all-or-nothing ones; its docstring has the model), ``tables`` (jobs, rows, the parameter
grid), ``tuning`` (the choice of parameters on the first half), ``verdicts`` (held-out verdicts), ``cli`` (the
run and its report).
"""

import _common  # noqa: F401 - the repository on sys.path, for airflow_dtrain

from .cli import DEFAULT_TRACES, main, seed_list
from .elastic import SPEND, ElasticPolicy, min_nodes, nodes_lost, simulate_elastic
from .strategies import Naive, Policy, State, UniformProgress, simulate
from .tables import HEAD, Row, distinct_sets, make_jobs, param_grid, run_size, work_range_h
from .tuning import at_or_below, per_job, score, surest, totals, tune
from .verdicts import _at_or_below, below_every, frontier, paired_interval, seed_by_seed, verdict  # noqa: F401
from .world import (
    BUDGET_CHANCES,
    ELASTIC,
    INPUTS,
    LATE_RISKS,
    MAX_RISKS,
    OURS,
    PRICE_RATIOS,
    SIZES,
    Job,
    Mechanics,
    Outcome,
    World,
)

__all__ = [
    "BUDGET_CHANCES", "DEFAULT_TRACES", "ELASTIC", "ElasticPolicy", "HEAD", "INPUTS", "Job", "LATE_RISKS",
    "MAX_RISKS", "Mechanics", "Naive", "OURS", "Outcome", "PRICE_RATIOS", "Policy", "Row", "SIZES", "SPEND",
    "State", "UniformProgress", "World", "at_or_below", "below_every", "distinct_sets", "frontier", "main",
    "make_jobs", "min_nodes", "nodes_lost", "paired_interval", "param_grid", "per_job", "run_size", "score",
    "seed_by_seed", "seed_list", "simulate", "simulate_elastic", "surest", "totals", "tune", "verdict",
    "work_range_h"
]  # fmt: skip

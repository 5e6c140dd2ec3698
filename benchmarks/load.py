"""Many jobs, one Airflow: concurrent train_llama runs and sweeps under a real scheduler and triggerer
(LocalExecutor), with random preemptions and one scheduler restart in the middle. Nothing may be lost.

    python benchmarks/load.py [--quick] [--seed S] [--db auto|postgres|sqlite] [--runs N] [--sweeps N]

Airflow's components (api-server, scheduler, dag-processor, triggerer) run as separate processes in a
throwaway Airflow home, on a throwaway Postgres cluster when this machine can start one (``initdb`` and
``pg_ctl`` on PATH, ``psycopg2`` importable), else on sqlite, whose limits are printed. The DAGs are the
bundled train_llama (its ``max_active_runs`` raised to let the runs overlap) and sweep_llama, on the local
backend: debug flavour, one process per group, a few steps. A seeded clock sends SIGTERM to a random
training group's agent (a spot reclaim) and restarts the scheduler once.

Checked and printed: every run ends finished or stopped at its cap; each job's ledger equals its
attempts' billed seconds x price to the cent; no statsd datagram, checkpoint or log line of one job names
another; a table of the time to schedule (trigger to first task running), the overhead per run (wall time
minus training time) and peak memory (RSS of Airflow's processes and of the groups). ``--quick`` (2 runs,
no sweep, one preemption): a few minutes, for ``make bench-smoke``. Exit 1 when a check does not hold.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401 - the repository on sys.path
from loadlab import checks
from loadlab.chaos import Chaos, MemorySampler
from loadlab.cluster import Cluster
from loadlab.database import Database
from loadlab.runs import Run, dags_folder, plan, trigger_all, wait_all

from tests.statsd_listener import StatsdListener


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 train_llama runs, no sweep, one preemption")
    p.add_argument("--runs", type=int, default=8, help="concurrent train_llama runs (default 8)")
    p.add_argument("--sweeps", type=int, default=2, help="sweep_llama runs (default 2)")
    p.add_argument("--steps", type=int, default=20, help="steps of each training (default 20)")
    p.add_argument("--preemptions", type=int, default=3, help="SIGTERMs to random groups (default 3)")
    p.add_argument("--db", choices=("auto", "postgres", "sqlite"), default="auto")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--timeout", type=float, default=3600, help="seconds for every run to end")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    if args.quick:
        args.runs, args.sweeps, args.preemptions, args.steps = 2, 0, 1, min(args.steps, 15)
    return args


def start(work: Path, db: Database, runs: list[Run], statsd_port: int) -> tuple[Cluster, dict]:
    """Airflow on ``db``: migrated, every component healthy, both DAGs parsed."""
    extra = {"AIRFLOW__DTRAIN__STATSD_HOST": "127.0.0.1", "AIRFLOW__DTRAIN__STATSD_PORT": str(statsd_port)}
    cluster = Cluster(work, db, dags_folder(work, max_active_runs=len(runs) + 1), extra)
    cluster.migrate()
    cluster.start()
    cluster.wait_healthy()
    return cluster, cluster.wait_parsed(*sorted({r.dag_id for r in runs}))


def table(runs: list[Run], peak: dict[str, int], billed: dict[str, tuple[float, float]]) -> None:
    """One row per run, then the medians and peaks. Training time: the seconds billed to the run's groups
    (every attempt, a sweep's members added up); the overhead is the rest of the run's wall time."""
    print(f"\n{'run':28} {'job':8} {'state':8} {'schedule s':>10} {'wall s':>7} {'train s':>7} "
          f"{'overhead s':>10} {'relaunch':>8} {'ledger $':>9}")  # fmt: skip
    sched, over = [], []
    for r in runs:
        to_schedule = (r.first_task_at - r.triggered_at) if r.first_task_at else None
        wall = (r.ended_at - r.triggered_at) if r.ended_at else None
        dollars, training = billed.get(r.run_id, (0.0, 0.0))
        overhead = wall - training if wall is not None else None
        relaunches = sum(int(s.get("relaunches") or 0) for s in r.summaries)
        sched += [to_schedule] if to_schedule is not None else []
        over += [overhead] if overhead is not None else []
        f = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
        print(f"{r.run_id:28} {r.job:8} {r.state:8} {f(to_schedule):>10} {f(wall):>7} {training:7.1f} "
              f"{f(overhead):>10} {relaunches:8d} {dollars:9.2f}")  # fmt: skip
    med = lambda xs: f"{statistics.median(xs):.1f}" if xs else "-"  # noqa: E731
    print("(a sweep's members train side by side: their billed seconds add up past its wall time)")
    print(f"\ntime to schedule: median {med(sched)} s, max {max(sched, default=0):.1f} s")
    print(f"overhead per run (wall - training): median {med(over)} s, max {max(over, default=0):.1f} s")
    print(
        f"peak RSS: Airflow processes {peak['airflow'] / 2**20:.0f} MiB, "
        f"groups {peak['groups'] / 2**20:.0f} MiB"
    )


def verdicts(work: Path, cluster: Cluster, runs: list[Run], lines: list[str]) -> tuple[bool, dict]:
    """Run every check, print each with its problems; True when all held."""
    ledger, dollars = checks.ledger_problems(cluster.home, runs)
    results = {
        "every run finished or stopped at its cap": checks.ended_well(runs),
        "ledger = billed seconds x price, to the cent": ledger,
        "no metric crosses between jobs": checks.metric_problems(lines, runs),
        "no checkpoint crosses between jobs": checks.checkpoint_problems(cluster.home, runs),
        "no log line crosses between jobs": checks.log_problems(cluster.home, work / "groups", runs),
    }
    print()
    for what, problems in results.items():
        print(f"{'HELD' if not problems else 'FAILED'}: {what}")
        for p in problems[:20]:
            print(f"    {p}")
    return all(not p for p in results.values()), dollars


def main() -> int:
    args = parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    rng, started = random.Random(seed), time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="dtrain-load-"))
    runs = plan(args.runs, args.sweeps, args.steps)
    db, listener = Database(work, args.db), StatsdListener()
    print(f"seed {seed}; {len(runs)} runs; database: {db.note}; work dir {work}", flush=True)
    cluster = None
    try:
        cluster, dags = start(work, db, runs, listener.port)
        print(f"Airflow up in {time.monotonic() - started:.0f}s", flush=True)
        sampler = MemorySampler(cluster)
        chaos = Chaos(cluster, rng, args.preemptions, restart_at_s=90.0 if args.quick else 240.0)
        trigger_all(cluster, runs, dags)
        wait_all(cluster, runs, args.timeout, on_tick=chaos.tick)
        peak = sampler.stop()
        print(
            f"preemptions sent: {len(chaos.sent)}; scheduler restarts: {cluster.restarts.get('scheduler', 0)}"
        )
        held, dollars = verdicts(work, cluster, runs, list(listener.lines))
        table(runs, peak, dollars)
    finally:
        if cluster is not None:
            cluster.stop()
        db.stop()
        listener.close()
    print(f"\nwall time {time.monotonic() - started:.0f}s; seed {seed}; database {db.kind}", flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())

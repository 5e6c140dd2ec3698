"""The Training jobs page with 1,000 jobs: how long a request takes, and how many files it reads, against a
page that reads every job at every request, measured side by side in one run.

    python benchmarks/ui_jobs.py [--jobs 1000] [--live 50] [--requests 200] [--rounds 3]
    python benchmarks/ui_jobs.py --quick    # 100 jobs, 20 requests, one round: a check that it runs

Writes ``--jobs`` synthetic job directories (tests/ui/synthetic_jobs.py: progress, two spend files, two
committed checkpoints, a registry entry, an index entry each), ``--live`` of them running, then answers
``GET /api/jobs`` (page 1 of 50 rows, sorted by spend) through the app itself (FastAPI's TestClient, the
login replaced by a fixed user: Airflow's login is not what is measured) in four ways:

* full scan: every request reads every job's files (``read.read_row`` for each entry): the reference;
* cold: the first request of a new ``RowCache`` (an api-server's first, after a restart);
* warm: nothing changed since the last request: one listing of the index, nothing read;
* live: ``LIVE_REFRESH_S`` has passed: the live jobs' files are read again, and only theirs.

Each round runs a block of each kind in turn, and each block starts from a collected heap. So a block pays
for the garbage collections its own requests cause, and not for the garbage of the block before it: a
full scan or a cold request allocates some thousands of rows, and a full collection of the process's heap
(Airflow's, most of it) that they set off would otherwise land in whichever request comes next.

Prints the median, the 95th percentile and the slowest of each, the files each reads per request, the full
collections that ran inside each block, and warm/full scan and live/full scan. The stated bound
(benchmarks/RESULTS.md): warm and live requests at 1,000 jobs answer within 100 ms at the 95th percentile
on the 2-core machine, reading no file of an ended job.
"""

import argparse
import gc
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401 - the repository on sys.path

from fastapi.testclient import TestClient  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--live", type=int, default=50, help="how many of the jobs are running")
    p.add_argument("--requests", type=int, default=200, help="warm and live requests in a block")
    p.add_argument("--scans", type=int, default=10, help="full scan and cold requests in a block")
    p.add_argument("--rounds", type=int, default=3, help="blocks of each kind, in turn")
    p.add_argument("--quick", action="store_true", help="--jobs 100 --live 5 --requests 20, one round")
    args = p.parse_args()
    if args.quick:
        args.jobs, args.live, args.requests, args.scans, args.rounds = 100, 5, 20, 5, 1
    return args


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    args = parse_args()
    root = Path(tempfile.mkdtemp(prefix="dtrain-ui-bench-"))
    os.environ.setdefault("AIRFLOW_HOME", str(root / "airflow"))
    os.environ["AIRFLOW__DTRAIN__JOBS_INDEX"] = str(root / "index")
    os.environ["AIRFLOW__DTRAIN__STORAGE_ROOTS"] = str(root)

    try:
        measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def write_jobs(args: argparse.Namespace, root: Path) -> None:
    from tests.ui.synthetic_jobs import write_job

    started = time.perf_counter()
    for i in range(args.jobs):
        live = i < args.live
        write_job(root, f"job-{i:05d}", owner=f"user:u{i % 37}", state="running" if live else "finished",
                  step=30 if live else 60, dollars=0.01 * i)  # fmt: skip
    print(
        f"{args.jobs} jobs ({args.live} running) written in {time.perf_counter() - started:.1f} s under", root
    )


def measure(args: argparse.Namespace, root: Path) -> None:
    from airflow.api_fastapi.core_api.security import get_user

    from airflow_dtrain import jobs_index
    from airflow_dtrain.ui import app as ui_app
    from airflow_dtrain.ui import read

    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    write_jobs(args, root)

    ui_app.readable_dags = lambda user: {"train_llama"}
    query = {"sort": "spent_usd", "per_page": 50}

    class FullScan(read.RowCache):
        """The reference: every job read at every request."""

        def rows(self, dag_ids):
            entries = [(d, e) for d in dag_ids for e in jobs_index.list_entries(d)]
            read.Reads.count += len(entries)  # each entry is read, as RowCache counts it
            return [read.read_row(jobs_index.read_entry(d, e)) for d, e in entries]

    def client(cache: read.RowCache) -> TestClient:
        app = ui_app.create_app(cache)
        app.dependency_overrides[get_user] = lambda: "benchmark"
        return TestClient(app)

    def request(to: TestClient) -> tuple[float, int]:
        before, t = read.Reads.count, time.perf_counter()
        response = to.get("/api/jobs", params=query)
        took = time.perf_counter() - t
        assert response.status_code == 200 and response.json()["total"] == args.jobs, response.text[:300]
        return took, read.Reads.count - before

    full, kept = client(FullScan()), client(read.RowCache())
    request(kept)  # its first: every row read, kept

    def live() -> tuple[float, int]:
        read.LIVE_REFRESH_S = 0.0  # as if 5 s had passed since the last request
        try:
            return request(kept)
        finally:
            read.LIVE_REFRESH_S = 5.0

    kinds = {
        "full scan": (args.scans, lambda: request(full)),
        "cold": (args.scans, lambda: request(client(read.RowCache()))),
        "warm": (args.requests, lambda: request(kept)),
        "live": (args.requests, live),
    }
    results: dict[str, list[tuple[float, int]]] = {k: [] for k in kinds}
    full_collections = dict.fromkeys(kinds, 0)
    for _ in range(args.rounds):
        for kind, (count, one) in kinds.items():
            gc.collect()
            before = gc.get_stats()[2]["collections"]
            results[kind] += [one() for _ in range(count)]
            full_collections[kind] += gc.get_stats()[2]["collections"] - before

    report(args, results, full_collections)


def report(
    args: argparse.Namespace, results: dict[str, list[tuple[float, int]]], full_collections: dict[str, int]
) -> None:
    """The table: median, p95 and slowest of each kind, the files each read, and the ratios."""
    print(f"\nGET /api/jobs (50 rows of {args.jobs}, sorted by spend), {args.rounds} rounds, "
          f"the collector tracking {len(gc.get_objects()):,} objects")  # fmt: skip
    print(f"{'request':<10} {'requests':>8} {'median ms':>10} {'p95 ms':>8} {'max ms':>8} {'files read':>11} "
          f"{'full gcs':>9}")  # fmt: skip
    medians = {}
    for kind, runs in results.items():
        times = [t * 1000 for t, _ in runs]
        medians[kind] = statistics.median(times)
        reads = statistics.median(n for _, n in runs)
        print(f"{kind:<10} {len(times):>8} {medians[kind]:>10.1f} {p95(times):>8.1f} {max(times):>8.1f} "
              f"{reads:>11.0f} {full_collections[kind]:>9}")  # fmt: skip
    print(f"\nwarm / full scan: {medians['warm'] / medians['full scan']:.3f}")
    print(f"live / full scan: {medians['live'] / medians['full scan']:.3f}")
    live_reads = statistics.median(n for _, n in results["live"])
    print(f"live request: {live_reads:.0f} files read for {args.live} running jobs "
          f"({live_reads / max(1, args.live):.1f} per running job; ended jobs: 0)")  # fmt: skip


if __name__ == "__main__":
    main()

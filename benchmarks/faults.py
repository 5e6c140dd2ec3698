"""Fault injection on the local backend: does every run finish (or stop at its cap) with the weights an
uninterrupted run has, the spend within the cap, one writer per checkpoint directory and every
corrupted checkpoint detected?

    python benchmarks/faults.py [--trials N] [--quick] [--seed S] [--only NAME ...]

Every run is ``python -m trainer.launch --standalone --nproc-per-node 2 -m trainer`` (torchrun with the
trainer's exit codes), debug flavour, 40 steps, a checkpoint every 5. An uninterrupted reference run is
made once; after each faulted trial the final checkpoint's tensors (model and optimizer state, unsharded)
are compared with the reference's, bit for bit. The step each fault lands on is drawn from a seeded RNG
(the seed is printed): every fault's step (or the save it hits, or the checkpoint it corrupts) is drawn
from it. This is a benchmark, not a test: it prints what it saw, including what did not hold.

The faults: signals and kills (faultlab/process_faults.py), corrupted checkpoints (corruption.py), a full
disk, a spend cap and a second writer (resource_faults.py), S3 answering 500 and 503 SlowDown on checkpoint,
spend-ledger and lease writes (s3_faults.py: moto behind a fault front, s3_server.py), and a slow disk under
an async save and a clock 5 minutes off (time_faults.py; the clock needs libfaketime: apt-get install
faketime). Each fault's expected outcome is printed under the table; the new ones check theirs ("outcome
held").

Default trials per fault: 2 for the quick ones, 1 for the slow ones (kill -9 of a rank, of the agent, of
the supervisor, a full disk, a second writer, an S3 outage), so the whole run stays about 15 minutes on 2
CPU cores; ``--trials N`` sets every fault's count. ``--quick`` runs the reference and one trial of two
faults, a signal (``sigterm-agent``) and a corruption (``flipped-byte-shard``): a check that the benchmark
runs, in about a minute (``--trials 1`` is one trial of every fault). Exit 1 when a property does not hold (a
trial that could not run did not finish).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO
from faultlab import runs
from faultlab.checkpoints import load_tensors, row
from faultlab.report import FAULTS, QUICK, print_table, print_verdicts
from faultlab.runs import EVERY, STEPS, Run, kill_leftovers


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, help="trials per fault (default: 2, 1 for the slow ones)")
    p.add_argument("--quick", action="store_true", help=f"one trial of {' and '.join(QUICK)} only")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--only", nargs="*", help="fault names to run")
    return p.parse_args()


def set_up(seed: int, started: float) -> Path:
    """The work directory, the processes' environment and the uninterrupted reference run."""
    work = Path(tempfile.mkdtemp(prefix="dtrain-faults-"))
    runs.BASE_ENV = {**os.environ, "PYTHONPATH": str(REPO), "DTRAIN_DATA_DIR": str(work / "data")}
    runs.BASE_ENV.pop("RANK", None)
    # the local launcher's groups
    os.environ.update(PYTHONPATH=str(REPO), DTRAIN_DATA_DIR=str(work / "data"))
    import torch

    print(f"seed {seed}; torch {torch.__version__}; {os.cpu_count()} CPUs; work dir {work}", flush=True)
    runs.REFERENCE_DIR = work / "reference"
    ref = Run(runs.REFERENCE_DIR, work, args=["--set", f"checkpoint.keep={STEPS // EVERY}"])  # all kept
    rc = ref.wait()
    runs.REFERENCE = load_tensors(runs.REFERENCE_DIR / f"step-{STEPS:08d}", work)
    print(
        f"reference: exit {rc}, {len(runs.REFERENCE)} tensors, {time.perf_counter() - started:.0f}s",
        flush=True,
    )
    return work


def run_trials(args: argparse.Namespace, rng: random.Random, work: Path) -> dict[str, list[dict]]:
    """Every selected fault's trials, in the table's order: {fault: [row per trial]}."""
    only = args.only or (QUICK if args.quick else None)
    results: dict[str, list[dict]] = {}
    for name, fn, default, *_ in FAULTS:
        if only and name not in only:
            continue
        trials = 1 if args.quick else (args.trials or default)
        for t in range(trials):
            ckpt = work / f"{name}-{t}"
            t0 = time.perf_counter()
            try:
                r = fn(rng, ckpt, work)
            except Exception as err:  # noqa: BLE001 - a benchmark reports, it does not abort
                r = row(note=f"benchmark error: {type(err).__name__}: {err}")
            r["seconds"] = time.perf_counter() - t0
            results.setdefault(name, []).append(r)
            figures = json.dumps({k: v for k, v in r.items() if k != "note"}, default=str)
            print(f"  {name} #{t}: {figures} -- {r['note']}", flush=True)
            shutil.rmtree(ckpt, ignore_errors=True)
            kill_leftovers()
    return results


def main() -> int:
    args = parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    started = time.perf_counter()
    work = set_up(seed, started)
    results = run_trials(args, rng, work)
    print_table(results)
    held = print_verdicts(results)
    print(f"\nwall time {time.perf_counter() - started:.0f}s; seed {seed}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())

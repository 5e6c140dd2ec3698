"""One trainer run under fault injection, and what every trial shares: the run's arguments, the
environment of its processes and the uninterrupted reference run's tensors (set by ``faults.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psutil

from _common import REPO, events_env, trainer_command
from trainer.events import EventCursor
from trainer.elastic.workers import rank_of

STEPS, EVERY = 40, 5
ARGS = [
    "--flavor",
    "debug",
    "--set",
    "data.seq_len=32",
    "--set",
    "global_batch_size=8",
    "--set",
    "micro_batch_size=4",
    "--steps",
    str(STEPS),
    "--set",
    f"checkpoint.every={EVERY}",
    "--set",
    "metrics.log_every=1",
]
NPROC = 2
PRICE = 3600.0  # $/node-hour: a dollar a second, so the budget fault's cap is in seconds of this machine

BENCH_ID = uuid.uuid4().hex[:8]
"""This benchmark run's: every trainer run it starts is tagged ``DTRAIN_BENCH_RUN=<BENCH_ID>-...`` and every
local-launcher group it starts is named ``faults-<BENCH_ID>-...``, so that ``kill_leftovers`` ends its own
processes and never those of another benchmark run on this machine (CI's ``--quick`` beside a full run)."""

# Set once by faults.py before the first trial: the processes' environment, and the reference run's
# directory and final tensors (model and optimizer state, unsharded).
BASE_ENV: dict = {}
REFERENCE: dict = {}
REFERENCE_DIR: Path = Path()

# --------------------------------------------------------------------------- running the trainer


class Run:
    """One ``trainer.launch`` run: its events to a directory of its own (``$DTRAIN_EVENTS_DIR``), read with
    ``trainer.events.EventCursor``; stdout and stderr to files; its workers tagged."""

    def __init__(self, ckpt: Path, work: Path, env: dict | None = None, args: list[str] = ()):
        self.tag = f"{BENCH_ID}-{uuid.uuid4().hex}"
        self.out, self.err = work / f"{self.tag}.out", work / f"{self.tag}.err"
        self.events_dir = work / f"{self.tag}.events"
        full_env = events_env({**BASE_ENV, **(env or {}), "DTRAIN_BENCH_RUN": self.tag}, self.events_dir)
        cmd = trainer_command(NPROC, *ARGS, *args, "--checkpoint-uri", str(ckpt))
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=full_env, stdout=out, stderr=err, start_new_session=True
            )
        self._cursor = EventCursor(self.events_dir)
        self.events: list[dict] = []

    def poll_events(self) -> list[dict]:
        """The events written since the last poll (whole lines only: one being written waits)."""
        new = self._cursor.read()
        self.events += new
        return new

    def wait_for(self, pred, timeout: float = 300) -> dict | None:
        """The first event (from now on) matching ``pred``; None when the run ended or time ran out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.poll_events():
                if pred(e):
                    return e
            if self.proc.poll() is not None:
                for e in self.poll_events():
                    if pred(e):
                        return e
                return None
            time.sleep(0.05)
        return None

    def wait(self, timeout: float = 400) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            rc = self.proc.wait()
        self.poll_events()
        return rc

    def stderr(self) -> str:
        return self.err.read_text()

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]

    def workers(self) -> dict[int, psutil.Process]:
        """{rank: process} of this run's training processes."""
        out = {}
        for p in psutil.process_iter():
            try:
                env = p.environ()
                rank = rank_of(p.pid) if env.get("DTRAIN_BENCH_RUN") == self.tag else None
                if rank is not None and p.status() != psutil.STATUS_ZOMBIE:
                    out[rank] = p
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        return out

    def signal_all(self, sig: int) -> None:
        """``sig`` to the agent and every worker (the workers live in sessions of their own)."""
        os.killpg(self.proc.pid, sig)
        for p in self.workers().values():
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def kill_all(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in self.workers().values():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def train_event(at: int):
    return lambda e: e.get("event") == "train" and e.get("step", 0) >= at


def kill_leftovers() -> None:
    """Nothing of a trial may outlive it: every process of this benchmark's runs and faults groups."""
    for leftover in psutil.process_iter():
        try:
            env = leftover.environ()
            if env.get("DTRAIN_BENCH_RUN", "").startswith(f"{BENCH_ID}-") or env.get(
                "DTRAIN_GROUP_NAME", ""
            ).startswith(f"faults-{BENCH_ID}-"):
                leftover.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue


def open_spend(root, attempt: str, cap: float) -> float:
    """The attempt's spend file, opened at the launch as the operator does (``opening_entry``: billing runs
    from now, at ``PRICE`` under the cap ``cap``); returns the launch time."""
    from trainer.config.sections import CostConfig
    from trainer.money.ledger import opening_entry

    launched = time.time()
    cost = CostConfig(capacity_type="any", price_per_node_hour=PRICE, gpus_per_node=0, budget_usd=cap)
    root.record_spend(attempt, opening_entry(cost, nodes=1, at=launched))
    return launched

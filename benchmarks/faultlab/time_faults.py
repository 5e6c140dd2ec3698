"""Faults of time: a slow disk under an async save, and a node whose clock is 5 minutes off.

The slow disk goes through the trainer's fault seam (``DTRAIN_TEST_SLOW_FSYNC``, trainer/testing/faults.py):
one rank's files of one save take seconds longer to sync. Expected: training goes on meanwhile (the async
save's point), the save commits late, and the run finishes bitwise equal.

The clock is moved with libfaketime (``apt-get install faketime``), preloaded into every process of one run
(``FAKETIME=+300`` or ``-300``). libfaketime moves the monotonic clock by the same constant, which changes
no interval; leaving it alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``) breaks Python's ``time.sleep`` under
libfaketime 0.9.10 (EINVAL from clock_nanosleep), and with it torchrun's rendezvous.
Expected: leases are ordered by token, not by time, so a writer whose clock is ahead or behind neither
fences the rightful (newest) writer nor commits once fenced; and a run whose clock is off still stops at its
spend cap, the spend (billed by this process's clock) within it.
"""

from __future__ import annotations

import os

from trainer.testing.faults import SLOW_FSYNC_ENV, activate

from .checkpoints import bitwise_equal, row
from .resource_faults import budget_trial, second_writer_trial
from .runs import EVERY, NPROC, STEPS, Run

FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
SKEW_S = 300


def skewed(offset_s: int) -> dict:
    """The environment that moves a process group's wall clock by ``offset_s`` seconds (libfaketime)."""
    lib = next((p for p in FAKETIME_LIBS if os.path.exists(p)), None)
    if lib is None:
        raise RuntimeError(f"libfaketime not found in {FAKETIME_LIBS}: apt-get install faketime")
    return {"LD_PRELOAD": lib, "FAKETIME": f"{offset_s:+d}"}


def f_slow_disk(rng, ckpt, work):
    k = rng.choice(range(EVERY, STEPS - EVERY, EVERY))
    delay, rank = round(rng.uniform(2.0, 5.0), 1), rng.randint(0, NPROC - 1)
    env = activate({SLOW_FSYNC_ENV: f"{k}:{delay}:{rank}"})
    run = Run(ckpt, work, env=env, args=["--set", "checkpoint.async_save=true"])
    rc = run.wait()
    save = next((c for c in run.of("checkpoint") if c.get("step") == k), {})
    late = float(save.get("seconds", 0.0)) >= delay
    went_on = int(
        save.get("overlap_steps") or 0
    )  # the trainer's count of steps trained while it was in flight
    return row(
        finished=rc == 0,
        bitwise=bitwise_equal(ckpt, work),
        held=rc == 0 and late and went_on >= 2 and bool(save.get("async")),
        note=f"rank {rank}'s files of step {k} synced {delay}s late: committed after "
        f"{save.get('seconds', 0):.1f}s (async {save.get('async')}), {went_on} steps trained meanwhile; "
        f"exit {rc}",
    )


def f_clock_writer(rng, ckpt, work):
    offset = rng.choice([SKEW_S, -SKEW_S])
    which = rng.randint(0, 1)  # 0: the stalled (older) writer's clock is off; 1: the newer one's
    envs = (skewed(offset), {}) if which == 0 else ({}, skewed(offset))
    skews = (offset, 0) if which == 0 else (0, offset)
    label = f"{'older' if which == 0 else 'newer'} writer's clock {offset:+d}s; "
    return second_writer_trial(rng, ckpt, work, envs=envs, skews=skews, label=label)


def f_clock_budget(rng, ckpt, work):
    offset = rng.choice([SKEW_S, -SKEW_S])
    r = budget_trial(rng, ckpt, work, env=skewed(offset), label=f"clock {offset:+d}s; ")
    r["held"] = r["finished"] in ("cap", True) and r["spend_ratio"] is not None and r["spend_ratio"] <= 1.0
    return r

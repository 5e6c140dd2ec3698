"""Checkpoint faults a test injects, driven by the environment: activate with
``DTRAIN_FAULTS=trainer.testing.faults:from_env`` (the seam: trainer/checkpoint/faults.py).

``DTRAIN_TEST_COMMIT_DELAY="STEP:SECONDS[:FILE]"`` makes rank 0 sleep after the files of that step are
written (and uploaded) but before its manifest, so that a test can kill -9 a group in the middle of a save
deterministically; with FILE, only until FILE exists.

``DTRAIN_TEST_ENOSPC_AT_STEP="STEP[:RANK]"`` (rank 0 by default) makes that rank's storage writer fail the
write of that step with ENOSPC after leaving a partial shard file behind, as a disk filling up mid-save does.

``DTRAIN_TEST_SLOW_FSYNC="STEP:SECONDS[:RANK]"`` (every rank by default) makes that rank's files of that step
take SECONDS longer to reach the disk: its storage writer sleeps after writing and fsyncing them, in the
save's own thread, as a throttled disk's fsync would (under an async save, training goes on meanwhile).

``DTRAIN_TEST_STEP_SLEEP=SECONDS``: every step also sleeps SECONDS (as a slower machine's step would take),
so that the tests' long-running and time-capped groups leave the CPU to the tests running beside them
(tests/conftest.py's slow_steps).

``DTRAIN_TEST_HOLD="NODES:STEPS"``: in a world of NODES nodes, once it has trained STEPS steps, every rank
waits until it is told to stop (SIGTERM, the contract's ``Signals``), at most ``HOLD_S``: an elastic group
at that size goes on only at a resize, whenever the node that joins it is ready (no race with its end).
"""

from __future__ import annotations

import errno
import os
import signal
import time

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from trainer.checkpoint.faults import FAULTS_ENV, Faults
from trainer.base.say import say

COMMIT_DELAY_ENV = "DTRAIN_TEST_COMMIT_DELAY"
ENOSPC_ENV = "DTRAIN_TEST_ENOSPC_AT_STEP"
STEP_SLEEP_ENV = "DTRAIN_TEST_STEP_SLEEP"
HOLD_ENV = "DTRAIN_TEST_HOLD"
HOLD_S = 300.0
SLOW_FSYNC_ENV = "DTRAIN_TEST_SLOW_FSYNC"
FROM_ENV = f"{__name__}:from_env"
"""What ``DTRAIN_FAULTS`` is set to for these faults."""


def activate(env: dict[str, str]) -> dict[str, str]:
    """``env`` with these faults switched on: for the environment of a trainer subprocess."""
    return {**env, FAULTS_ENV: FROM_ENV}


class NoSpaceWriter(dcp.FileSystemWriter):
    """A disk that fills up part-way through a shard (``DTRAIN_TEST_ENOSPC_AT_STEP``)."""

    def write_data(self, plan, planner):
        name = os.path.join(str(self.path), f"__{dist.get_rank() if dist.is_initialized() else 0}_0.distcp")
        with open(name, "wb") as f:
            f.write(b"\0" * 4096)  # what got written before the disk was full
        say(f"[trainer] test hook: {ENOSPC_ENV}: {name} fails with ENOSPC")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)


class SlowDiskWriter(dcp.FileSystemWriter):
    """A disk whose fsync takes ``delay_s`` longer (``DTRAIN_TEST_SLOW_FSYNC``): the files are written and
    synced as usual, then the writer holds the save that long before reporting them written."""

    def __init__(self, path: str, delay_s: float, **kw):
        super().__init__(path, **kw)
        self.delay_s = delay_s

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        say(f"[trainer] test hook: {SLOW_FSYNC_ENV}: {self.path} takes {self.delay_s}s more to sync")
        time.sleep(self.delay_s)
        return written


def slow_fsync(spec: str, step: int, rank: int) -> float | None:
    """The extra seconds ``DTRAIN_TEST_SLOW_FSYNC`` (``STEP:SECONDS[:RANK]``) asks of this rank's save of
    ``step``; None when it asks none."""
    if not spec:
        return None
    parts = spec.split(":")
    try:
        at, seconds, at_rank = int(parts[0]), float(parts[1]), (int(parts[2]) if len(parts) > 2 else None)
    except (ValueError, IndexError):
        raise ValueError(f"{SLOW_FSYNC_ENV}: expected STEP:SECONDS[:RANK], got {spec!r}") from None
    if len(parts) > 3 or seconds < 0:
        raise ValueError(f"{SLOW_FSYNC_ENV}: expected STEP:SECONDS[:RANK], got {spec!r}")
    return seconds if at == step and at_rank in (None, rank) else None


class EnvFaults(Faults):
    """The faults the DTRAIN_TEST_* variables ask for (read at each hook, so a test may change them)."""

    def storage_writer(self, write_dir: str, step: int, rank: int, thread_count: int):
        spec = os.environ.get(ENOSPC_ENV, "")
        at, _, at_rank = spec.partition(":")
        if spec and int(at) == step and int(at_rank or 0) == rank:
            return NoSpaceWriter(write_dir, thread_count=thread_count)
        delay = slow_fsync(os.environ.get(SLOW_FSYNC_ENV, ""), step, rank)
        if delay is not None:
            return SlowDiskWriter(write_dir, delay, thread_count=thread_count)
        return None

    def before_manifest(self, step: int, rank: int) -> None:
        spec = os.environ.get(COMMIT_DELAY_ENV, "")
        if rank != 0 or not spec:
            return
        at, _, rest = spec.partition(":")
        seconds, _, release = rest.partition(":")
        if int(at) != step:
            return
        say(f"[trainer] test hook: step {step} files written, sleeping {seconds}s before the manifest")
        until = time.monotonic() + float(seconds)
        while time.monotonic() < until and not (release and os.path.exists(release)):
            time.sleep(min(0.2, max(0.0, until - time.monotonic())))

    trained = 0  # steps of this process's round (a round builds its faults anew)

    def after_step(self, step: int) -> None:
        self.trained += 1
        nodes, _, steps = os.environ.get(HOLD_ENV, "").partition(":")
        if nodes and os.environ.get("GROUP_WORLD_SIZE") == nodes and self.trained == int(steps):
            say(f"[trainer] test hook: {HOLD_ENV}: holding after step {step} until told to stop")
            _until_told_to_stop(time.monotonic() + HOLD_S)
        raw = os.environ.get(STEP_SLEEP_ENV) or ""
        try:
            seconds = float(raw or 0)
        except ValueError:
            raise ValueError(f"{STEP_SLEEP_ENV}: expected a number of seconds, got {raw!r}") from None
        if seconds > 0:
            time.sleep(seconds)


def _until_told_to_stop(deadline: float) -> None:
    """Sleep until the SIGTERM handler (``trainer.contract.Signals``) set its stop flag, or ``deadline``."""
    handler = signal.getsignal(signal.SIGTERM)
    signals = getattr(handler, "__self__", None)
    while time.monotonic() < deadline and not getattr(signals, "stop", False):
        time.sleep(0.05)


def from_env() -> EnvFaults:
    return EnvFaults()

"""Where a training process's start went, from the process's own start to its first step.

Each attempt and each restart of a node's workers (an elastic group's resize) pays it before training
again: on a GPU a cold one is a minute. Rank 0 logs it once its first step is done and emits a "startup"
event (``trainer/events.py``), which ``benchmarks/recovery.py`` reads beside the time from SIGTERM:

* ``imports_s``: the process's start to the trainer's ``main`` (the interpreter and its imports; about 0
  for a worker forked from its node's fork server, ``trainer/elastic/forked_worker.py``);
* ``process_group_s``: joining the process group;
* ``build_s``: the data, the model (parallelized), the optimizer and the checkpoint directory's look-up;
* ``load_s``: loading the checkpoint it resumes from (0 from scratch);
* ``first_step_s``: the first step, waited for (its compile, on a GPU its NCCL communicators);
* ``total_s``: all of it; ``started_at``: the process's start, seconds since the epoch;
* ``graphs_compiled``: the graphs ``torch.compile`` compiled in this round until its first step, the most of
  any rank (0 where every process was kept or warmed up, ``trainer/elastic/warm_join.py``).

Stdlib only.
"""

from __future__ import annotations

import os
import time

PHASES = ("imports", "process_group", "build", "load", "first_step")
STARTED_AT_ENV = "DTRAIN_STARTED_AT"
"""Where a round trained in an elastic group's host (``trainer/elastic/worker_host.py``) started: the start
of the worker its agent forked, seconds since the epoch; its start-up is timed from there, not from the
host's."""


def process_started_at() -> float:
    """This process's start, seconds since the epoch (Linux ``/proc``; elsewhere: now). A round trained in
    an elastic group's host (``trainer/elastic/worker_host.py``) starts where the worker its agent forked did
    (``$DTRAIN_STARTED_AT``)."""
    if forked := os.environ.get(STARTED_AT_ENV):
        try:
            return float(forked)
        except ValueError:
            pass
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime: ticks since boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


class StartupClock:
    """Marks the end of each phase of ``PHASES`` in order; ``fields()`` is the "startup" event."""

    def __init__(self, started_at: float | None = None):
        self.started_at = process_started_at() if started_at is None else started_at
        self._last = self.started_at
        self._seconds: dict[str, float] = {}
        self._graphs_before = graphs_compiled()

    def mark(self, phase: str) -> None:
        """``phase`` ended now (it began where the previous one ended)."""
        if phase not in PHASES:
            raise ValueError(f"unknown startup phase {phase!r}; one of {PHASES}")
        now = time.time()
        self._seconds[phase] = max(0.0, now - self._last)
        self._last = now

    def graphs_compiled(self) -> int | None:
        """The graphs dynamo compiled in this process since this clock started; None: not counted
        (``trainer.torch_private``, hook ``dynamo_graph_counter``)."""
        now = graphs_compiled()
        return None if now is None or self._graphs_before is None else now - self._graphs_before

    def fields(self) -> dict[str, float]:
        out = {f"{p}_s": round(self._seconds.get(p, 0.0), 3) for p in PHASES}
        out["total_s"] = round(self._last - self.started_at, 3)
        out["started_at"] = round(self.started_at, 3)
        return out

    def summary(self) -> str:
        """One line for the task log: ``started in 12.3 s: imports 0.0 s, process group 0.4 s, ...``."""
        f = self.fields()
        parts = ", ".join(f"{p.replace('_', ' ')} {f[p + '_s']:.1f} s" for p in PHASES)
        return f"started in {f['total_s']:.1f} s: {parts}"


def graphs_compiled() -> int | None:
    """The graphs dynamo has compiled in this process (0 before torch.compile is imported; None: not
    counted)."""
    from trainer.torch_private import tensor_hooks

    return tensor_hooks.graphs_compiled()

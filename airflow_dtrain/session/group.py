"""A task's pod groups, from first launch to the end: the one place that owns their life.

``GroupSession`` is to a pod group what cncf.kubernetes' ``PodManager`` is to a pod: it
attaches to a group an earlier try left running or launches one, watches it (state first,
then the log lines since the last look), relaunches it from its latest checkpoint when it
ends preempted, fails with its last log lines when it ends otherwise, and stops it.
``FSDPTrainOperator`` (its synchronous and deferrable paths alike) and
``EvaluateCheckpointOperator`` use it; ``FSDPTrainTrigger`` only drives a ``GroupWatch``
from the triggerer.

Groups of one task are named ``<base>-r<n>`` (``spec.group_name``): the same task instance
always finds its own groups again, which is what makes a restarted task reattach instead
of launching a second writer.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from airflow_dtrain import metrics
from airflow_dtrain.launchers.base import GroupState, GroupStatus, PodGroupLauncher
from airflow_dtrain.session.money import SessionMoney
from airflow_dtrain.session.watch import GroupWatch, report
from airflow_dtrain.job.naming import group_name, relaunch_index
from airflow_dtrain.status_line import StatusLine
from trainer.checkpoint.directory import CheckpointDir
from trainer.config.job_config import (
    BUDGET_EXIT_CODE,
    FENCED_EXIT_CODE,
    STORAGE_EXIT_CODE,
    WORKER_LOST_EXIT_CODE,
)

if TYPE_CHECKING:
    from airflow_dtrain.aws.prices import SpotPriceFeed
    from airflow_dtrain.job.spec import JobSpec

log = logging.getLogger(__name__)


class GroupFailed(RuntimeError):
    """A pod group failed (not preempted), ran out of relaunches, or did not end in time."""


class GroupSession(SessionMoney):
    """The pod groups of one task instance: attach or launch, watch, relaunch, stop.

    :param launcher: the backend's launcher.
    :param base: the task's group base name (``spec.group_base_name``).
    :param spec: what every group of this task runs.
    :param log: where the groups' output and the session's decisions go (the task log).
    :param error: the exception raised when a group fails (a ``GroupFailed`` subclass).
    :param purpose: a word for the log, e.g. "training" or "eval".
    :param spot_prices: where a spot group's prices are read (``airflow_dtrain.aws.prices.SpotPriceFeed``):
        while it runs, for its trainer's cap (``GroupWatch.feed_prices``), and when it ends, to bill it again
        (``trainer.money.bill.at_prices_in_effect``). None: at its launch price only.
    """

    def __init__(
        self,
        launcher: PodGroupLauncher,
        base: str,
        spec: JobSpec,
        *,
        log: logging.Logger | Any,
        error: type[GroupFailed] = GroupFailed,
        purpose: str = "training",
        spot_prices: SpotPriceFeed | None = None,
    ) -> None:
        self.launcher = launcher
        self.base = base
        self.spec = spec
        self.log = log
        self.error = error
        self.purpose = purpose
        self.spot_prices = spot_prices
        self.recovering_since: float | None = None
        self.current: str | None = None
        self.stopped_at_budget: dict[str, Any] | None = None
        """Set when the job ended at its dollar cap (the group stopped itself, or a relaunch was not
        affordable)."""
        self._status: StatusLine | None = None
        self.tags = metrics.job_tags(spec)
        """The statsd tags of the job's metrics, as its trainer sends them (None: the task's context's)."""

    # -- the groups of this task -------------------------------------------------------------
    def groups(self) -> list[str]:
        """This task's groups, oldest first."""
        names = [n for n in self.launcher.find(self.base) if relaunch_index(self.base, n) is not None]
        return sorted(names, key=lambda n: relaunch_index(self.base, n))

    def preemptions(self, names: list[str] | None = None) -> int:
        return sum(self.launcher.status(n).state == GroupState.PREEMPTED for n in names or self.groups())

    def launch(self, relaunch: int) -> str:
        name = group_name(self.base, relaunch)
        spec = self.spec
        self.log.info(
            "Launching %s group %s: %d node(s) x %d process(es) on %s (%s capacity), %s",
            self.purpose,
            name,
            spec.num_nodes,
            spec.procs_per_node,
            spec.backend,
            spec.capacity.value,
            " ".join(spec.entrypoint)
            or (
                f"{spec.train.model.flavor} flavour, {spec.train.steps} steps, "
                f"checkpoints in {spec.train.checkpoint.uri}"
            ),
        )
        spent = self._spent()  # before this group's own spend file: what the job spent until now
        self._open_spend(name)  # billing starts before the first pod or process exists
        self.launcher.launch(name, self.spec, spent_usd=spent)
        metrics.incr("group.launches", tags=self.tags)
        self.current = name
        return name

    def attach_or_launch(self, *, reuse_succeeded: bool = True) -> str:
        """The group to watch: the newest one if it is still pending or running (or, with
        ``reuse_succeeded``, already succeeded), or if it ended at the job's dollar cap (its end
        says so again: another group would only be stopped there too); else a new launch numbered
        after it."""
        names = self.groups()
        if not names:
            return self.launch(0)
        last = names[-1]
        status = self.launcher.status(last)
        keep = {GroupState.PENDING, GroupState.RUNNING, GroupState.AT_BUDGET}
        keep |= {GroupState.SUCCEEDED} if reuse_succeeded else set()
        if status.state in keep or BUDGET_EXIT_CODE in status.node_exit_codes.values():
            self.log.info(
                "Reattaching to %s group %s (%s), launched by an earlier try",
                self.purpose,
                last,
                status.state.value,
            )
            self.current = last
            return last
        self.log.info(
            "%s group %s of an earlier try ended %s (%s); launching the next",
            self.purpose.capitalize(),
            last,
            status.state.value,
            status.message,
        )
        return self.launch(relaunch_index(self.base, last) + 1)

    # -- watching --------------------------------------------------------------------------------
    def watch(self, name: str, *, poll_interval: float, timeout_s: float | None = None) -> dict[str, Any]:
        """Follow ``name`` from this process until it ends, its output into the log; its end event."""
        watch = GroupWatch(
            self.launcher,
            name,
            recovering_since=self.recovering_since,
            tags=self.tags,
            prices=self.price_watch(),
            ledger_uri=self.spend_uri(),
            deadline=self.deadline_terms(),
        )
        status_line = self.status_line()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status, lines = watch.poll()
            report(self.log, lines, status_line, watch.events)
            if watch.ended(status):
                self.recovering_since = watch.recovering_since
                return watch.event(status)
            if deadline is not None and time.monotonic() > deadline:
                self.launcher.stop(name)
                raise self.error(f"{self.purpose} group {name} did not end within {timeout_s:.0f}s")
            time.sleep(poll_interval)

    def on_end(self, event: dict[str, Any]) -> str | None:
        """What a group's end means: None when it succeeded, the name of its relaunch when it was
        preempted (within ``max_preemptions``); raises ``error`` otherwise."""
        name = event["name"]
        self._close_spend(name)
        if event["status"] == "success":
            self.current = name
            return None
        if self._ended_at_cap(name, event):
            return None
        if event["status"] == "preempted":
            return self._after_preemption(name, event)
        metrics.incr("group.failures", tags=self.tags)
        self._refuse_relaunch(name, event)
        if WORKER_LOST_EXIT_CODE in (event.get("node_exit_codes") or {}).values():
            return self._after_lost_worker(name, event)
        tail = "\n".join(event.get("log_tail") or [])
        said = "".join(f"\n  {text}" for text in event.get("rank_errors") or [])
        raise self.error(
            f"{self.purpose} group {name} {event.get('state')}: {event.get('message')}\n"
            + (f"What its training processes said first:{said}\n" if said else "")
            + f"Last lines of its log:\n{tail}"
        )

    def _after_preemption(self, name: str, event: dict[str, Any]) -> str | None:
        """A preempted group's relaunch (None: not affordable); raises past ``max_preemptions``."""
        metrics.incr("group.preemptions", tags=self.tags)
        self.recovering_since = time.time()
        preemptions = self.preemptions()
        if preemptions > self.spec.max_preemptions:
            raise self.error(
                f"group {name} was preempted {preemptions} times, more than max_preemptions="
                f"{self.spec.max_preemptions}: {event['message']}"
            )
        if self._unaffordable(name):
            return None
        self.log.warning(
            "Group %s preempted (%s): relaunching from the latest checkpoint (preemption %d of at most %d)",
            name,
            event["message"],
            preemptions,
            self.spec.max_preemptions,
        )
        return self.launch(relaunch_index(self.base, name) + 1)

    def _refuse_relaunch(self, name: str, event: dict[str, Any]) -> None:
        """Raise for the ends a relaunch cannot fix: the directory fenced by a newer writer, a refused
        write."""
        if FENCED_EXIT_CODE in (event.get("node_exit_codes") or {}).values():
            raise self.error(
                f"{self.purpose} group {name} stopped (exit {FENCED_EXIT_CODE}): another group took over the "
                f"checkpoint directory {self.spec.train.checkpoint.uri} (its writer lease is newer); "
                "not relaunching: "
                f"{event.get('message')}\nLast lines of its log:\n" + "\n".join(event.get("log_tail") or [])
            )
        if STORAGE_EXIT_CODE in (event.get("node_exit_codes") or {}).values():
            tail = event.get("log_tail") or []
            # The trainer's own line names the path and the cause (ENOSPC, EACCES, ...): it leads the error.
            said = next(
                (
                    line.split("[trainer] ", 1)[-1]
                    for line in reversed(tail)
                    if "could not be written to" in line
                ),
                event.get("message"),
            )
            raise self.error(
                f"{self.purpose} group {name} could not write a checkpoint (exit {STORAGE_EXIT_CODE}): "
                f"{said}; not "
                f"relaunching: a full disk or a refused write does not fix itself (free space in, or fix the "
                f"permissions of, {self.spec.train.checkpoint.uri}, then clear the task: it resumes from the "
                "last "
                f"committed checkpoint)\nLast lines of its log:\n" + "\n".join(tail)
            )

    def _after_lost_worker(self, name: str, event: dict[str, Any]) -> str | None:
        """A group that lost a training process: its relaunch (None: not affordable); raises past
        ``max_failures``."""
        lost = sum(
            WORKER_LOST_EXIT_CODE in self.launcher.status(n).node_exit_codes.values() for n in self.groups()
        )
        if lost <= self.spec.max_failures:
            if self._unaffordable(name):
                return None
            self.log.warning(
                "Group %s lost a training process (%s): relaunching from the last committed checkpoint "
                "(failure %d of at most %d)",
                name,
                event["message"],
                lost,
                self.spec.max_failures,
            )
            return self.launch(relaunch_index(self.base, name) + 1)
        raise self.error(
            f"group {name} lost a training process {lost} times, more than max_failures="
            f"{self.spec.max_failures}: {event['message']}"
        )

    def status_line(self) -> StatusLine | None:
        """The one-line status of a training job (None for other purposes: an evaluation): one for the
        session, carried over relaunches, and started from the job's progress.json (a relaunch, a resumed
        job, a reattached or deferred task do not start again from step 0)."""
        if self.purpose != "training":
            return None
        if self._status is None:
            train, ledger = self.spec.train, self._ledger_dir()
            self._status = StatusLine(
                steps=train.steps,
                tokens_per_step=train.global_batch_size * train.data.seq_len,
                budget_usd=train.cost.budget_usd,
                ledger_uri=ledger.storage.uri if ledger is not None else None,
            )
            try:
                progress = CheckpointDir(train.checkpoint.uri).progress() if train.checkpoint.uri else {}
            except (OSError, ValueError):
                progress = {}
            self._status.step = int((progress or {}).get("step") or 0)
            if (progress or {}).get("checkpoint_step") is not None:
                self._status.checkpoint_step = int(progress["checkpoint_step"])
        return self._status

    def placement(self, names: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Where each of ``names`` ran, as its launcher recorded it (groups it knows nothing of are left
        out)."""
        found = {name: self.launcher.placement(name) for name in names}
        return {name: where for name, where in found.items() if where}

    def run(
        self, *, poll_interval: float, reuse_succeeded: bool = True, timeout_s: float | None = None
    ) -> str:
        """Attach or launch, then watch and relaunch until a group succeeds; its name."""
        name = self.attach_or_launch(reuse_succeeded=reuse_succeeded)
        while True:
            relaunched = self.on_end(self.watch(name, poll_interval=poll_interval, timeout_s=timeout_s))
            if relaunched is None:
                return name
            name = relaunched

    def stop(self, name: str | None = None, grace_period_s: float = 30.0) -> GroupStatus | None:
        """Ask ``name`` (default: the current group) to checkpoint and exit; kill what is left."""
        name = name or self.current
        if not name:
            return None
        self.log.info("Stopping %s group %s", self.purpose, name)
        status = self.launcher.stop(name, grace_period_s)
        self.log.info("Group %s is %s", name, status.state.value)
        return status

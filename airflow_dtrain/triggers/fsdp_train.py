"""Trigger that watches a pod group without holding a worker slot.

Thin by design: it drives a ``GroupWatch`` (the same look the synchronous path takes) until
the group ends and hands the end event back; what the end means -- done, relaunch, fail --
is decided by the operator's ``GroupSession``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_dtrain.launchers.factory import get_launcher
from airflow_dtrain.session.watch import GroupWatch, report
from airflow_dtrain.status_line import StatusLine


class FSDPTrainTrigger(BaseTrigger):
    """
    Watch pod group ``name`` until it ends, copying its output into the task log.

    :param name: the group's name.
    :param backend: the launcher backend (``local`` or ``kubernetes``).
    :param launcher_kwargs: keyword arguments of the launcher (plain values).
    :param poll_interval: seconds between looks at the group.
    :param log_cursor: where the log was left off (from a previous trigger or the worker).
    :param recovering_since: unix time a preemption of the previous group was noticed, if this
        group is its relaunch (reported as ``group.recovery_seconds`` once it trains again).
    :param status: the job's ``StatusLine`` as a dict: a status line in the triggerer's log every
        ``status.every_s`` seconds (None: no status line).
    :param tags: the job's statsd tags (``GroupSession.tags``) for the metrics sent from here.
    :param prices: a spot group's price feed (``GroupSession.price_watch``): the prices in effect are written
        for its trainer's cap while it runs (None: none).
    :param ledger_uri: where the job's spend files are (``GroupSession.spend_uri``).
    :param deadline: the terms its budget deadline follows its spend by (``GroupSession.deadline_terms``).
    """

    def __init__(
        self,
        *,
        name: str,
        backend: str,
        launcher_kwargs: dict[str, Any] | None = None,
        poll_interval: float = 5.0,
        log_cursor: Any = None,
        recovering_since: float | None = None,
        status: dict[str, Any] | None = None,
        tags: dict[str, str] | None = None,
        prices: dict[str, Any] | None = None,
        ledger_uri: str | None = None,
        deadline: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.backend = backend
        self.launcher_kwargs = launcher_kwargs or {}
        self.poll_interval = poll_interval
        self.log_cursor = log_cursor
        self.recovering_since = recovering_since
        self.status = status
        self.tags = tags
        self.prices = prices
        self.ledger_uri = ledger_uri  # where an elastic group's node changes are billed as they come
        self.deadline = deadline  # what its budget deadline follows its spend by

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_dtrain.triggers.fsdp_train.FSDPTrainTrigger",
            {
                "name": self.name,
                "backend": self.backend,
                "launcher_kwargs": self.launcher_kwargs,
                "poll_interval": self.poll_interval,
                "log_cursor": self.log_cursor,
                "recovering_since": self.recovering_since,
                "status": self.status,
                "tags": self.tags,
                "prices": self.prices,
                "ledger_uri": self.ledger_uri,
                "deadline": self.deadline,
            },
        )

    def _launcher(self):
        return get_launcher(self.backend, **self.launcher_kwargs)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watch = GroupWatch(
            self._launcher(),
            self.name,
            self.log_cursor,
            self.recovering_since,
            tags=self.tags,
            prices=self.prices,
            ledger_uri=self.ledger_uri,
            deadline=self.deadline,
        )
        status_line = StatusLine.from_dict(self.status)
        try:
            while True:
                status, lines = await asyncio.to_thread(watch.poll)
                # the status line reads the spend ledger (a file or an S3 GET): off the event loop
                await asyncio.to_thread(report, self.log, lines, status_line, watch.events)
                if watch.ended(status):
                    self.log.info("Group %s is %s: %s", self.name, status.state.value, status.message)
                    yield TriggerEvent(watch.event(status))
                    return
                await asyncio.sleep(self.poll_interval)
        except Exception as err:  # the operator must hear about it, not time out
            self.log.exception("Watching group %s failed", self.name)
            yield TriggerEvent(
                {
                    "status": "error",
                    "name": self.name,
                    "state": "unknown",
                    "message": repr(err),
                    "log_tail": list(watch.tail),
                }  # fmt: skip
            )

    async def on_kill(self) -> None:
        """The user killed the deferred task: stop the group, leaving no process behind."""
        self.log.info("Stopping group %s", self.name)
        await asyncio.to_thread(self._launcher().stop, self.name)

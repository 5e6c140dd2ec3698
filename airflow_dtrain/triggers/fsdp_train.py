"""Trigger that watches a pod group without holding a worker slot."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_dtrain.launchers import GroupState, GroupStatus, get_launcher, poll_group

LOG_TAIL_LINES = 40

EVENT_STATUS = {
    GroupState.SUCCEEDED: "success",
    GroupState.PREEMPTED: "preempted",
}


def observe_recovery(lines: list[str], since: float | None) -> float | None:
    """Report ``group.recovery_seconds`` once a relaunched group trains again; returns what is left to watch."""
    if since is None:
        return None
    for line in lines:
        if '"event": "resume"' in line or '"event": "train"' in line:
            from airflow_dtrain import metrics

            metrics.timing("group.recovery_seconds", time.time() - since)
            return None
    return since


def group_event(status: GroupStatus, tail: list[str], cursor: Any) -> dict[str, Any]:
    """The payload both the trigger and the synchronous path hand to the operator."""
    return {
        "status": EVENT_STATUS.get(status.state, "error"),
        "name": status.name,
        "state": status.state.value,
        "message": status.message,
        "node_exit_codes": {str(k): v for k, v in status.node_exit_codes.items()},
        "log_tail": tail,
        "log_cursor": cursor,
    }


class FSDPTrainTrigger(BaseTrigger):
    """
    Watch pod group ``name`` until it ends, copying its output into the task log.

    :param name: the group's name.
    :param backend: the launcher backend (``local``).
    :param launcher_kwargs: keyword arguments of the launcher (plain values).
    :param poll_interval: seconds between looks at the group.
    :param log_cursor: where the log was left off (from a previous trigger or the worker).
    :param recovering_since: unix time a preemption of the previous group was noticed, if this
        group is its relaunch (reported as ``group.recovery_seconds`` once it trains again).
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
    ) -> None:
        super().__init__()
        self.name = name
        self.backend = backend
        self.launcher_kwargs = launcher_kwargs or {}
        self.poll_interval = poll_interval
        self.log_cursor = log_cursor
        self.recovering_since = recovering_since

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
            },
        )

    def _launcher(self):
        return get_launcher(self.backend, **self.launcher_kwargs)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        launcher = self._launcher()
        cursor = self.log_cursor
        recovering_since = self.recovering_since
        tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        try:
            while True:
                status, chunk = await asyncio.to_thread(poll_group, launcher, self.name, cursor)
                for line in chunk.lines:
                    self.log.info("%s", line)
                tail.extend(chunk.lines)
                cursor = chunk.cursor
                recovering_since = observe_recovery(chunk.lines, recovering_since)
                if status.state.terminal or status.state == GroupState.NOT_FOUND:
                    self.log.info("Group %s is %s: %s", self.name, status.state.value, status.message)
                    yield TriggerEvent(group_event(status, list(tail), cursor))
                    return
                await asyncio.sleep(self.poll_interval)
        except Exception as err:  # the operator must hear about it, not time out
            self.log.exception("Watching group %s failed", self.name)
            yield TriggerEvent(
                {"status": "error", "name": self.name, "state": "unknown", "message": repr(err), "log_tail": list(tail)}
            )

    async def on_kill(self) -> None:
        """The user killed the deferred task: stop the group, leaving no process behind."""
        self.log.info("Stopping group %s", self.name)
        await asyncio.to_thread(self._launcher().stop, self.name)

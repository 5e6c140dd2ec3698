"""Trigger that watches for interruption notices of a group and has it checkpoint at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class SpotInterruptionTrigger(BaseTrigger):
    """
    Watch the SQS queue (and the group's node taints) until a notice for the group arrives, or
    (``follow_relaunches_s`` in ``watch_kwargs``) for as long as the group and its relaunches train.

    The checkpoint-now request is sent from here, not from the resumed task: a spot warning
    gives two minutes, and a resumed task may take longer than that to be scheduled. The queue is
    checked against the admin's ``[dtrain] interruption_queues`` (as this triggerer reads it) before
    anything is looked at.

    :param watch_kwargs: keyword arguments of ``airflow_dtrain.interruption_watch.InterruptionWatch``,
        with the instance source as ``source: [classpath, kwargs]`` (plain values).
    :param poll_interval: seconds between looks (on top of the SQS long poll).
    """

    def __init__(self, *, watch_kwargs: dict[str, Any], poll_interval: float = 5.0) -> None:
        super().__init__()
        self.watch_kwargs = watch_kwargs
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_dtrain.triggers.spot_interruption.SpotInterruptionTrigger",
            {"watch_kwargs": self.watch_kwargs, "poll_interval": self.poll_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_dtrain.aws.sqs import check_queue
        from airflow_dtrain.errors import SpecError
        from airflow_dtrain.interruption_watch import InterruptionWatch
        from airflow_dtrain.spot.members import deserialize_source

        kwargs = dict(self.watch_kwargs)
        group = kwargs["group"]
        try:
            check_queue(kwargs.get("sqs_queue_url"))
        except SpecError as err:  # refused, not failed: the message as it is
            yield TriggerEvent({"status": "error", "group": group, "message": str(err)})
            return
        try:
            kwargs["source"] = deserialize_source(*kwargs["source"])
            watch = InterruptionWatch(**kwargs)
            while True:
                record = await asyncio.to_thread(watch.look)
                if record is not None:
                    yield TriggerEvent({"status": "success", **record})
                    return
                await asyncio.sleep(self.poll_interval)
        except Exception as err:  # the task must hear about it, not time out
            self.log.exception("Watching group %s for interruptions failed", group)
            yield TriggerEvent(
                {"status": "error", "group": group, "message": f"watching for interruptions failed: {err!r}"}
            )

"""Looking for interruption notices of a group, and the response: checkpoint now.

Shared by ``SpotInterruptionSensor.poke`` and ``SpotInterruptionTrigger.run`` (plain
arguments only, so the trigger can carry them to the triggerer). The I/O is here (the group's
launcher, its instance source, the SQS queue through ``airflow_dtrain.aws.sqs``); what is new and
when the watch is over is ``airflow_dtrain.spot.interruptions.WatchState``'s.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

from airflow_dtrain.aws.sqs import delete_messages, receive_notices
from airflow_dtrain.spot.events import InterruptionNotice
from airflow_dtrain.spot.interruptions import DEFAULT_KINDS, WatchState
from airflow_dtrain.spot.members import InstanceSource

log = logging.getLogger(__name__)


def current_group(launcher: Any, group: str) -> tuple[str, Any]:
    """(name, status) of ``group``, or of the newest relaunch of it (``<group>-r<n>``, highest n)."""
    from airflow_dtrain.launchers.base import GroupState
    from airflow_dtrain.launchers.factory import relaunches

    status = launcher.status(group)
    if status.state == GroupState.NOT_FOUND:
        names = relaunches(launcher, group) or sorted(launcher.find(group))
        if names:
            return names[-1], launcher.status(names[-1])
    return group, status


class InterruptionWatch:
    """Looks for interruption notices of a group, and the response: checkpoint now.

    Single-shot (``follow_relaunches_s`` 0) or following the group's relaunches (> 0): see
    ``airflow_dtrain.spot.interruptions``.

    :param group: the group's name, or the base name of its relaunches (``<group>-r<n>``).
    :param source: which instances and nodes are the group's, and their taints.
    :param backend: the group's launcher backend; ``launcher_kwargs``: that launcher's arguments.
    :param sqs_queue_url: the EventBridge-fed queue (None: node taints only), read with
        ``aws_conn_id`` / ``region_name``, long-polling ``wait_time_seconds``.
    :param kinds: which notices are acted on.
    :param follow_relaunches_s: 0 for a single-shot watch, else how long to wait for a relaunch.
    :param tags: the statsd tags of the counters it sends (``airflow_dtrain.metrics.task_tags`` of the
        sensor's task: in the triggerer there is no task context to read them from).
    """

    def __init__(
        self,
        *,
        group: str,
        source: InstanceSource,
        backend: str,
        launcher_kwargs: dict[str, Any],
        sqs_queue_url: str | None,
        aws_conn_id: str | None,
        region_name: str | None,
        kinds: Iterable[str] = DEFAULT_KINDS,
        wait_time_seconds: int = 0,
        follow_relaunches_s: float = 0.0,
        tags: dict[str, str] | None = None,
    ) -> None:
        self.group, self.source, self.backend, self.launcher_kwargs = group, source, backend, launcher_kwargs
        self.sqs_queue_url, self.aws_conn_id, self.region_name = sqs_queue_url, aws_conn_id, region_name
        self.kinds, self.wait_time_seconds = tuple(kinds), wait_time_seconds
        self.state = WatchState(follow_relaunches_s=follow_relaunches_s)
        self.tags = tags

    @functools.cached_property
    def launcher(self) -> Any:
        """Built on the first look (not at construction: nothing is called before then), then kept."""
        from airflow_dtrain.launchers.factory import get_launcher

        return get_launcher(self.backend, **self.launcher_kwargs)

    def look(self) -> dict[str, Any] | None:
        """One look; the watch's record once it is over, else None."""
        from airflow_dtrain.launchers.base import GroupState

        launcher = self.launcher
        name, status = current_group(launcher, self.group)
        if status.state.terminal or status.state == GroupState.NOT_FOUND:
            return self.state.group_gone(name, status)
        members = self.source.members(name)
        notices: list[InterruptionNotice] = []
        receipts: list[str] = []
        if self.sqs_queue_url:
            notices, receipts = receive_notices(
                queue_url=self.sqs_queue_url, members=members, kinds=self.kinds, aws_conn_id=self.aws_conn_id,
                region_name=self.region_name, wait_time_seconds=self.wait_time_seconds,
            )  # fmt: skip
        notices += [n for n in self.source.node_notices(name) if n.kind in self.kinds]
        fresh = self.state.fresh(name, notices)
        if not fresh:
            return None
        for notice in fresh:
            log.warning(
                "%s for %s (%s) of group %s, at %s",
                notice.kind, notice.instance_id or notice.node_name, notice.source, name, notice.time,
            )  # fmt: skip
        asked = launcher.checkpoint_now(name) if status.state == GroupState.RUNNING else 0
        log.warning("Asked %d process(es) of group %s to checkpoint now", asked, name)
        delete_messages(queue_url=self.sqs_queue_url or "", receipts=receipts, aws_conn_id=self.aws_conn_id,
                        region_name=self.region_name)  # fmt: skip
        _count(fresh, self.tags)
        return self.state.acted(name, status, fresh, asked)


def _count(notices: list[InterruptionNotice], tags: dict[str, str] | None) -> None:
    from airflow_dtrain import metrics

    names = {
        "spot-interruption": "spot.interruption_warning",
        "rebalance-recommendation": "spot.rebalance_recommendation",
    }
    for notice in notices:
        metrics.incr(names.get(notice.kind, "spot.node_disruption"), tags=tags)

"""Looking for interruption notices of a group, and the response: checkpoint now.

Shared by ``SpotInterruptionSensor.poke`` and ``SpotInterruptionTrigger.run`` (plain
arguments only, so the trigger can carry them to the triggerer).

SQS handling, chosen so that several groups (and other consumers) can share one queue:

- a notice for one of the group's instances is acted on, then deleted;
- a well-formed event for another instance, or of a kind not watched, is made visible
  again at once (``ChangeMessageVisibility`` 0) for whoever it concerns;
- a malformed message is logged with its id and the reason, and left alone: it becomes
  visible again after the queue's visibility timeout, and the queue's redrive policy
  moves it to a dead-letter queue after ``maxReceiveCount`` receives.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from airflow_dtrain.spot.events import (
    DISRUPTION,
    REBALANCE_RECOMMENDATION,
    SPOT_INTERRUPTION,
    InterruptionNotice,
    MalformedMessage,
    parse_sqs_body,
)
from airflow_dtrain.spot.members import InstanceSource

log = logging.getLogger(__name__)

DEFAULT_KINDS = (SPOT_INTERRUPTION, REBALANCE_RECOMMENDATION, DISRUPTION)
"""Every notice that a node is, or may soon be, going away. ``disruption`` matters most on
Karpenter clusters: when Karpenter handles a spot warning itself, the only sign on the node is
its ``karpenter.sh/disrupted`` taint. Scheduled maintenance is days ahead: left out."""


def receive_notices(
    *,
    queue_url: str,
    members: Any,
    kinds: Iterable[str],
    aws_conn_id: str | None,
    region_name: str | None,
    wait_time_seconds: int = 0,
    max_messages: int = 10,
) -> tuple[list[InterruptionNotice], list[str]]:
    """Receive once from the queue: (the group's notices, their receipt handles to delete)."""
    from airflow.providers.amazon.aws.hooks.sqs import SqsHook

    client = SqsHook(aws_conn_id=aws_conn_id, region_name=region_name).conn
    response = client.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=max_messages, WaitTimeSeconds=wait_time_seconds
    )
    kinds = set(kinds)
    ours: list[InterruptionNotice] = []
    receipts: list[str] = []
    for message in response.get("Messages", []):
        message_id = message.get("MessageId")
        try:
            notice = parse_sqs_body(message.get("Body", ""), message_id=message_id)
        except MalformedMessage as err:
            log.warning("Skipping malformed SQS message %s from %s: %s", message_id, queue_url, err)
            continue
        if notice is not None and notice.kind in kinds and notice in members:
            ours.append(notice)
            receipts.append(message["ReceiptHandle"])
            continue
        log.debug("SQS message %s is not for this group: %s", message_id, notice)
        try:
            client.change_message_visibility(
                QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
        except Exception:  # it becomes visible after the timeout anyway
            log.warning("Could not release SQS message %s", message_id, exc_info=True)
    return ours, receipts


def delete_messages(*, queue_url: str, receipts: list[str], aws_conn_id: str | None, region_name: str | None) -> None:
    if not receipts:
        return
    from airflow.providers.amazon.aws.hooks.sqs import SqsHook

    client = SqsHook(aws_conn_id=aws_conn_id, region_name=region_name).conn
    for start in range(0, len(receipts), 10):
        batch = receipts[start : start + 10]
        client.delete_message_batch(
            QueueUrl=queue_url, Entries=[{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(batch)]
        )


def current_group(launcher: Any, group: str) -> tuple[str, Any]:
    """(name, status) of ``group``, or of the newest relaunch of it (``<group>-r<n>``, highest n)."""
    from airflow_dtrain.launchers import GroupState, relaunches

    status = launcher.status(group)
    if status.state == GroupState.NOT_FOUND:
        names = relaunches(launcher, group) or sorted(launcher.find(group))
        if names:
            return names[-1], launcher.status(names[-1])
    return group, status


class InterruptionWatch:
    """Looks for interruption notices of a group, and the response: checkpoint now.

    Single-shot (``follow_relaunches_s`` 0): the first notice ends the watch (its record), and so
    does the group's end. Following (``follow_relaunches_s`` > 0, for a watch that runs beside
    the training task): every new notice is acted on once and the watch goes on, across the
    task's relaunches; it ends when the newest group succeeded, failed or was stopped, or was
    preempted and no relaunch appeared within ``follow_relaunches_s`` (nor any group at all
    within that time of the start), with the record of every notice handled.

    :param group: the group's name, or the base name of its relaunches (``<group>-r<n>``).
    :param source: which instances and nodes are the group's, and their taints.
    :param backend: the group's launcher backend; ``launcher_kwargs``: that launcher's arguments.
    :param sqs_queue_url: the EventBridge-fed queue (None: node taints only), read with
        ``aws_conn_id`` / ``region_name``, long-polling ``wait_time_seconds``.
    :param kinds: which notices are acted on.
    :param follow_relaunches_s: 0 for a single-shot watch, else how long to wait for a relaunch.
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
    ) -> None:
        self.group, self.source, self.backend, self.launcher_kwargs = group, source, backend, launcher_kwargs
        self.sqs_queue_url, self.aws_conn_id, self.region_name = sqs_queue_url, aws_conn_id, region_name
        self.kinds, self.wait_time_seconds = tuple(kinds), wait_time_seconds
        self.follow_relaunches_s = follow_relaunches_s
        self.handled: list[dict[str, Any]] = []  # notices acted on, as records' "notices"
        self.checkpoint_requested = 0
        self._seen: set[tuple[str, str, str | None]] = set()  # (group, kind, instance or node): a taint stays
        self._started = time.monotonic()
        self._ended_since: dict[str, float] = {}

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
            if not self.follow_relaunches_s:
                if status.state.terminal:
                    return self._record(name, status, [])
            elif not self._relaunch_expected(name, status.state):
                return self._record(name, status, self.handled)
            return None
        members = self.source.members(name)
        notices: list[InterruptionNotice] = []
        receipts: list[str] = []
        if self.sqs_queue_url:
            notices, receipts = receive_notices(
                queue_url=self.sqs_queue_url, members=members, kinds=self.kinds, aws_conn_id=self.aws_conn_id,
                region_name=self.region_name, wait_time_seconds=self.wait_time_seconds,
            )  # fmt: skip
        notices += [n for n in self.source.node_notices(name) if n.kind in self.kinds]
        fresh = [n for n in notices if (name, n.kind, n.instance_id or n.node_name) not in self._seen]
        if not fresh:
            return None
        self._seen.update((name, n.kind, n.instance_id or n.node_name) for n in fresh)
        for notice in fresh:
            log.warning(
                "%s for %s (%s) of group %s, at %s",
                notice.kind, notice.instance_id or notice.node_name, notice.source, name, notice.time,
            )  # fmt: skip
        asked = launcher.checkpoint_now(name) if status.state == GroupState.RUNNING else 0
        log.warning("Asked %d process(es) of group %s to checkpoint now", asked, name)
        delete_messages(queue_url=self.sqs_queue_url or "", receipts=receipts, aws_conn_id=self.aws_conn_id,
                        region_name=self.region_name)  # fmt: skip
        _count(fresh)
        self.checkpoint_requested += asked
        handled_at = datetime.now(timezone.utc).isoformat()
        self.handled += [{**n.to_dict(), "group": name, "handled_at": handled_at} for n in fresh]
        if self.follow_relaunches_s:
            return None
        return {**self._record(name, status, [n.to_dict() for n in fresh]), "handled_at": handled_at}

    def _relaunch_expected(self, name: str, state: Any) -> bool:
        """Following: may a (first or next) group still come? Only a preempted group is relaunched."""
        from airflow_dtrain.launchers.base import GroupState

        if state == GroupState.NOT_FOUND:
            since = self._started
        elif state == GroupState.PREEMPTED:
            since = self._ended_since.setdefault(name, time.monotonic())
        else:
            return False
        return time.monotonic() - since < self.follow_relaunches_s

    def _record(self, name: str, status: Any, notices: list[dict[str, Any]]) -> dict[str, Any]:
        record = {"interrupted": bool(notices), "group": name, "group_state": status.state.value, "notices": notices}
        if notices:
            record["checkpoint_requested"] = self.checkpoint_requested
        return record


def _count(notices: list[InterruptionNotice]) -> None:
    from airflow_dtrain import metrics

    names = {"spot-interruption": "spot.interruption_warning", "rebalance-recommendation": "spot.rebalance_recommendation"}
    for notice in notices:
        metrics.incr(names.get(notice.kind, "spot.node_disruption"))

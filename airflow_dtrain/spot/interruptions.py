"""One look for interruption notices of a group, and the response: checkpoint now.

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

import logging
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from airflow_dtrain.spot.events import (
    REBALANCE_RECOMMENDATION,
    SPOT_INTERRUPTION,
    InterruptionNotice,
    MalformedMessage,
    parse_sqs_body,
)
from airflow_dtrain.spot.members import InstanceSource

log = logging.getLogger(__name__)

DEFAULT_KINDS = (SPOT_INTERRUPTION, REBALANCE_RECOMMENDATION)


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
    """(name, status) of ``group``, or of the newest group whose name starts with it (a relaunch)."""
    from airflow_dtrain.launchers.base import GroupState

    status = launcher.status(group)
    if status.state == GroupState.NOT_FOUND:
        names = launcher.find(group)
        if names:
            return names[-1], launcher.status(names[-1])
    return group, status


def watch_once(
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
) -> dict[str, Any] | None:
    """One look: on a notice for the group, ask it to checkpoint now and return the record.

    Returns None while nothing happened; a record with ``interrupted: False`` when the
    group ended without a notice (nothing left to protect).
    """
    from airflow_dtrain.launchers.base import GroupState, get_launcher

    kinds = tuple(kinds)
    launcher = get_launcher(backend, **launcher_kwargs)
    name, status = current_group(launcher, group)
    if status.state.terminal:
        return {"interrupted": False, "group": name, "group_state": status.state.value, "notices": []}
    members = source.members(name)
    notices: list[InterruptionNotice] = []
    receipts: list[str] = []
    if sqs_queue_url:
        notices, receipts = receive_notices(
            queue_url=sqs_queue_url, members=members, kinds=kinds, aws_conn_id=aws_conn_id,
            region_name=region_name, wait_time_seconds=wait_time_seconds,
        )  # fmt: skip
    notices += [n for n in source.node_notices(name) if n.kind in kinds]
    if not notices:
        return None
    for notice in notices:
        log.warning(
            "%s for %s (%s) of group %s, at %s",
            notice.kind, notice.instance_id or notice.node_name, notice.source, name, notice.time,
        )  # fmt: skip
    asked = launcher.checkpoint_now(name) if status.state == GroupState.RUNNING else 0
    log.warning("Asked %d process(es) of group %s to checkpoint now", asked, name)
    delete_messages(queue_url=sqs_queue_url or "", receipts=receipts, aws_conn_id=aws_conn_id, region_name=region_name)
    _count(notices)
    return {
        "interrupted": True,
        "group": name,
        "group_state": status.state.value,
        "checkpoint_requested": asked,
        "notices": [n.to_dict() for n in notices],
        "handled_at": datetime.now(timezone.utc).isoformat(),
    }


def _count(notices: list[InterruptionNotice]) -> None:
    from airflow_dtrain import metrics

    names = {"spot-interruption": "spot.interruption_warning", "rebalance-recommendation": "spot.rebalance_recommendation"}
    for notice in notices:
        metrics.incr(names.get(notice.kind, "spot.interruption_warning"))

"""A group's interruption notices from an EventBridge-fed SQS queue, through the amazon provider's
``SqsHook``.

SQS handling, chosen so that several groups (and other consumers) can share one queue:

- a notice for one of the group's instances is acted on, then deleted (``delete_messages``);
- a well-formed event for another instance, or of a kind not watched, is made visible
  again at once (``ChangeMessageVisibility`` 0) for whoever it concerns;
- a malformed message is logged with its id and the reason, and left alone: it becomes
  visible again after the queue's visibility timeout, and the queue's redrive policy
  moves it to a dead-letter queue after ``maxReceiveCount`` receives.

Parsing the messages is ``airflow_dtrain.spot.events``'s (pure).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from airflow_dtrain.spot.events import InterruptionNotice, MalformedMessage, parse_sqs_body

log = logging.getLogger(__name__)


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
    """Delete the messages acted on (``DeleteMessageBatch``, ten at a time)."""
    if not receipts:
        return
    from airflow.providers.amazon.aws.hooks.sqs import SqsHook

    client = SqsHook(aws_conn_id=aws_conn_id, region_name=region_name).conn
    for start in range(0, len(receipts), 10):
        batch = receipts[start : start + 10]
        client.delete_message_batch(
            QueueUrl=queue_url, Entries=[{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(batch)]
        )

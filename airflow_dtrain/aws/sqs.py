"""A group's interruption notices from an EventBridge-fed SQS queue, through the amazon provider's
``SqsHook``.

Which queues may be read at all is the platform admin's: ``[dtrain] interruption_queues``
(``AIRFLOW__DTRAIN__INTERRUPTION_QUEUES``), comma-separated URLs of queues dedicated to this provider's
spot watch. Unset: none. An account prefix is refused: receiving a message counts toward its queue's
``maxReceiveCount`` whatever the visibility is set back to, so a queue shared with another consumer would
move that consumer's messages to its dead-letter queue after a few polls. So only exact URLs, of queues
that only this provider reads; a foreign message in one is still made visible again at once. A DAG's
author may narrow the list for one task (``check_queue(allowed=...)``); a trigger
chooses within both. ``check_queue`` runs before any AWS call: reading a queue consumes its messages
(receive counts toward its dead-letter queue, a received message is hidden from other consumers for
the visibility timeout), so a run must not point a task at another team's queue.

SQS handling, chosen so that several groups (and other consumers) can share one queue:

- a notice for one of the group's instances is acted on, then deleted (``delete_messages``);
- every other message is made visible again at once (``ChangeMessageVisibility`` 0) for
  whoever it concerns, never deleted: a well-formed event for another instance or of a kind
  not watched, and a malformed one (logged with its id and the reason; the queue's redrive
  policy moves it to a dead-letter queue after ``maxReceiveCount`` receives).

Parsing the messages is ``airflow_dtrain.spot.events``'s (pure).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from airflow_dtrain.errors import SpecError
from airflow_dtrain.spot.events import InterruptionNotice, MalformedMessage, parse_sqs_body

log = logging.getLogger(__name__)

QUEUES_OPTION = "[dtrain] interruption_queues"
"""The admin's list of the SQS queues any task may read (``AIRFLOW__DTRAIN__INTERRUPTION_QUEUES``)."""

# A queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>), or without the name: an account prefix.
_QUEUE = re.compile(
    r"^https?://[A-Za-z0-9.-]+(:[0-9]+)?/[A-Za-z0-9_-]+/(?P<name>[A-Za-z0-9_-]{1,80}(\.fifo)?)?$"
)


def admin_queues() -> tuple[str, ...]:
    """``[dtrain] interruption_queues``, read when called (not at import); a bad entry raises SpecError."""
    from airflow.sdk import conf

    raw = conf.get("dtrain", "interruption_queues", fallback="") or ""
    return queue_patterns(QUEUES_OPTION, raw.split(","))


def queue_patterns(where: str, entries: Iterable[str]) -> tuple[str, ...]:
    """Queue URLs, checked; blank entries dropped. An account prefix (ending in ``/``) is refused."""
    if isinstance(entries, str):
        raise SpecError(f"{where}: expected a list of queue URLs, got {entries!r}")
    patterns = []
    for entry in entries:
        if isinstance(entry, str) and not entry.strip():
            continue
        if not isinstance(entry, str) or not _QUEUE.match(entry.strip()):
            raise SpecError(
                f"{where}: not a queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>), "
                f"got {entry!r}"
            )
        if entry.strip().endswith("/"):
            raise SpecError(
                f"{where}: {entry.strip()!r} is an account prefix: list each queue dedicated to the spot "
                f"watch by its URL (a queue shared with another consumer loses its messages to the "
                f"dead-letter queue: every receive counts toward maxReceiveCount)"
            )
        patterns.append(entry.strip())
    return tuple(patterns)


def queue_allowed(url: str, patterns: Iterable[str]) -> bool:
    """``url`` is one of ``patterns`` (exact queue URLs)."""
    match = _QUEUE.match(url)
    return bool(match and match.group("name")) and url in tuple(patterns)


def check_queue(
    url: str | None, *, field: str = "sqs_queue_url", allowed: Iterable[str] | None = None
) -> None:
    """Raise SpecError, naming ``field``, the URL and the list, unless the queue is on the admin's
    ``[dtrain] interruption_queues`` and (when the DAG's author gives one) on ``allowed``. None: no queue."""
    if url is None:
        return
    admin = admin_queues()
    if not queue_allowed(url, admin):
        listed = (
            f"the admin's {QUEUES_OPTION}: {', '.join(admin)}" if admin else f"{QUEUES_OPTION} is not set"
        )
        raise SpecError(
            f"{field}: {url!r} is not an allowed interruption queue ({listed}). To allow it, the "
            f"platform admin adds the queue URL, of a queue only the spot watch reads, to {QUEUES_OPTION} "
            "(environment variable "
            "AIRFLOW__DTRAIN__INTERRUPTION_QUEUES, comma-separated)"
        )
    if allowed is not None:
        allowed = tuple(allowed)
        if not queue_allowed(url, allowed):
            raise SpecError(
                f"{field}: {url!r} is not allowed by this DAG "
                f"(interruption_queues: {', '.join(allowed) or 'none'})"
            )


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
    """Receive once from the queue: (the group's notices, their receipt handles to delete).

    Raises SpecError, before any AWS call, for a queue not on the admin's ``[dtrain] interruption_queues``.
    """
    from airflow.providers.amazon.aws.hooks.sqs import SqsHook

    check_queue(queue_url)
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
        except MalformedMessage as err:  # left for its owner too, or for the dead-letter queue
            log.warning("Skipping malformed SQS message %s from %s: %s", message_id, queue_url, err)
        else:
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


def delete_messages(
    *, queue_url: str, receipts: list[str], aws_conn_id: str | None, region_name: str | None
) -> None:
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

"""Interruption notices: EventBridge events as they arrive in SQS, and Kubernetes node taints.

SQS bodies come in three shapes, all handled by ``parse_sqs_body``:

- the EventBridge event itself (an EventBridge rule targeting the queue, as
  aws-node-termination-handler's queue-processor mode and Karpenter's interruption queue use);
- the event inside an SNS envelope (``{"Type": "Notification", "Message": "<event JSON>"}``);
- the same SNS envelope with raw message delivery off, i.e. the two above.

Node taints (``notice_from_node``): aws-node-termination-handler taints a node it is
draining (``aws-node-termination-handler/spot-itn``, ``.../rebalance-recommendation``,
``.../scheduled-maintenance``, ``.../asg-lifecycle-termination``); Karpenter taints a node it
is about to take away (``karpenter.sh/disrupted``, earlier ``karpenter.sh/disruption``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

SPOT_INTERRUPTION = "spot-interruption"
"""The two-minute warning: the instance will be stopped, hibernated or terminated."""
REBALANCE_RECOMMENDATION = "rebalance-recommendation"
"""The instance is at elevated risk of interruption; it may run on for a long time."""
SCHEDULED_MAINTENANCE = "scheduled-maintenance"
DISRUPTION = "disruption"
"""The node is being removed for another reason (ASG scale-in, Karpenter consolidation)."""

KINDS = (SPOT_INTERRUPTION, REBALANCE_RECOMMENDATION, SCHEDULED_MAINTENANCE, DISRUPTION)

DETAIL_TYPES = {
    "EC2 Spot Instance Interruption Warning": SPOT_INTERRUPTION,
    "EC2 Instance Rebalance Recommendation": REBALANCE_RECOMMENDATION,
}
"""EventBridge ``detail-type`` -> kind, for the events whose ``detail`` names one instance."""

NODE_TAINTS = {
    "aws-node-termination-handler/spot-itn": SPOT_INTERRUPTION,
    "aws-node-termination-handler/rebalance-recommendation": REBALANCE_RECOMMENDATION,
    "aws-node-termination-handler/scheduled-maintenance": SCHEDULED_MAINTENANCE,
    "aws-node-termination-handler/asg-lifecycle-termination": DISRUPTION,
    "karpenter.sh/disrupted": DISRUPTION,
    "karpenter.sh/disruption": DISRUPTION,
}

_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
_PROVIDER_ID = re.compile(r"^aws:///(?P<zone>[^/]*)/(?P<instance>i-[0-9a-f]+)$")


class MalformedMessage(ValueError):
    """An SQS message that is not a well-formed event; the reason is the message."""


@dataclass(frozen=True)
class InterruptionNotice:
    """One instance (or node) of a group is going away, or may go away soon."""

    kind: str
    instance_id: str | None
    node_name: str | None = None
    time: str | None = None
    region: str | None = None
    action: str | None = None
    """For spot interruptions: ``terminate``, ``stop`` or ``hibernate``."""
    source: str = "sqs"
    """``sqs`` or ``node-taint``."""
    detail_type: str | None = None
    message_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_sqs_body(body: str, message_id: str | None = None) -> InterruptionNotice | None:
    """The notice in one SQS message body; None for well-formed events of other kinds.

    Raises ``MalformedMessage`` naming what is wrong (not JSON, no ``detail-type``, an
    interruption event without a valid ``instance-id``).
    """
    try:
        doc = json.loads(body)
    except (TypeError, ValueError) as err:
        raise MalformedMessage(f"body is not JSON ({err}): {str(body)[:80]!r}") from None
    if isinstance(doc, dict) and doc.get("Type") == "Notification" and "Message" in doc:  # SNS envelope
        inner = doc["Message"]
        if not isinstance(inner, str):
            raise MalformedMessage("SNS envelope: Message is not a string")
        try:
            doc = json.loads(inner)
        except ValueError as err:
            raise MalformedMessage(f"SNS envelope: Message is not JSON ({err}): {inner[:80]!r}") from None
    if not isinstance(doc, dict):
        raise MalformedMessage(f"body is JSON {type(doc).__name__}, not an object")
    detail_type = doc.get("detail-type")
    if not isinstance(detail_type, str):
        raise MalformedMessage(f"no detail-type: not an EventBridge event (keys {sorted(doc)[:8]})")
    kind = DETAIL_TYPES.get(detail_type)
    if kind is None:
        return None  # a state-change notification, a health event, ...: not ours to act on
    detail = doc.get("detail")
    instance_id = detail.get("instance-id") if isinstance(detail, dict) else None
    if not isinstance(instance_id, str) or not _INSTANCE_ID.match(instance_id):
        raise MalformedMessage(f"{detail_type!r} without a valid detail.instance-id: {instance_id!r}")
    return InterruptionNotice(
        kind=kind,
        instance_id=instance_id,
        time=doc.get("time"),
        region=doc.get("region"),
        action=detail.get("instance-action"),
        source="sqs",
        detail_type=detail_type,
        message_id=message_id,
    )


def instance_id_of_provider_id(provider_id: str | None) -> str | None:
    """``aws:///us-east-1a/i-0abc...`` (a node's ``spec.providerID``) -> ``i-0abc...``."""
    match = _PROVIDER_ID.match(provider_id or "")
    return match.group("instance") if match else None


def notice_from_node(node: dict[str, Any]) -> InterruptionNotice | None:
    """The notice a node's taints carry (the most urgent if several), or None.

    :param node: a Node as a dict (``ApiClient().sanitize_for_serialization(node)`` or the API JSON).
    """
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    found: list[tuple[int, dict[str, Any], str]] = []
    for taint in spec.get("taints") or []:
        kind = NODE_TAINTS.get(taint.get("key", ""))
        if kind is not None:
            found.append((KINDS.index(kind), taint, kind))
    if not found:
        return None
    _, taint, kind = min(found, key=lambda f: f[0])
    return InterruptionNotice(
        kind=kind,
        instance_id=instance_id_of_provider_id(spec.get("providerID")),
        node_name=metadata.get("name"),
        time=taint.get("timeAdded") or taint.get("time_added"),
        source="node-taint",
        detail_type=taint.get("key"),
    )

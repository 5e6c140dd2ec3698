"""EventBridge events as EC2 sends them (shapes from the EC2 user guide), raw or in an SNS envelope."""

from __future__ import annotations

import json
import uuid


def spot_warning(instance_id: str, *, action: str = "terminate", zone: str = "us-east-1b") -> dict:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-02-18T14:01:29Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:ec2:{zone}:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "instance-action": action},
    }


def rebalance(instance_id: str) -> dict:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-02-18T13:58:02Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:ec2:us-east-1b:instance/{instance_id}"],
        "detail": {"instance-id": instance_id},
    }


def state_change(instance_id: str) -> dict:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "EC2 Instance State-change Notification",
        "source": "aws.ec2",
        "time": "2026-02-18T14:03:00Z",
        "region": "us-east-1",
        "detail": {"instance-id": instance_id, "state": "shutting-down"},
    }


def sns(event: dict) -> dict:
    """The SNS envelope an SQS subscriber receives (raw message delivery off)."""
    return {
        "Type": "Notification",
        "MessageId": str(uuid.uuid4()),
        "TopicArn": "arn:aws:sns:us-east-1:123456789012:spot-events",
        "Message": json.dumps(event),
        "Timestamp": "2026-02-18T14:01:30.000Z",
        "SignatureVersion": "1",
    }

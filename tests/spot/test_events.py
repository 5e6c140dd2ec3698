"""Parsing interruption notices: SQS bodies (raw and SNS-wrapped) and node taints, table by table."""

from __future__ import annotations

import json

import pytest

from airflow_dtrain.spot.events import (
    DISRUPTION,
    REBALANCE_RECOMMENDATION,
    SPOT_INTERRUPTION,
    MalformedMessage,
    notice_from_node,
    parse_sqs_body,
)
from airflow_dtrain.spot.members import GroupMembers
from tests.spot.events import rebalance, sns, spot_warning, state_change

ID = "i-0b662ef9931388ba0"


@pytest.mark.parametrize(
    ("body", "kind", "action"),
    [
        (spot_warning(ID), SPOT_INTERRUPTION, "terminate"),
        (spot_warning(ID, action="hibernate"), SPOT_INTERRUPTION, "hibernate"),
        (sns(spot_warning(ID)), SPOT_INTERRUPTION, "terminate"),
        (rebalance(ID), REBALANCE_RECOMMENDATION, None),
        (sns(rebalance(ID)), REBALANCE_RECOMMENDATION, None),
    ],
)
def test_interruption_events_are_parsed_raw_and_in_sns_envelopes(body, kind, action):
    notice = parse_sqs_body(json.dumps(body), message_id="m-1")
    assert (notice.kind, notice.instance_id, notice.action, notice.message_id) == (kind, ID, action, "m-1")
    assert notice.region == "us-east-1" and notice.time.startswith("2026-02-18T")


def test_other_well_formed_events_are_not_notices():
    assert parse_sqs_body(json.dumps(state_change(ID))) is None
    assert parse_sqs_body(json.dumps(sns(state_change(ID)))) is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json at all", "body is not JSON"),
        ("", "body is not JSON"),
        ("[1, 2]", "body is JSON list, not an object"),
        (json.dumps({"hello": "world"}), "no detail-type"),
        (json.dumps({"Type": "Notification", "Message": "{broken"}), "SNS envelope: Message is not JSON"),
        (json.dumps({"Type": "Notification", "Message": 42}), "SNS envelope: Message is not a string"),
        (json.dumps({**spot_warning(ID), "detail": {}}), "without a valid detail.instance-id: None"),
        (json.dumps({**spot_warning(ID), "detail": {"instance-id": "node-7"}}), "'node-7'"),
        (
            json.dumps({**rebalance(ID), "detail": "i-0b662ef9931388ba0"}),
            "without a valid detail.instance-id",
        ),
    ],
)
def test_malformed_bodies_raise_naming_what_is_wrong(body, reason):
    with pytest.raises(MalformedMessage, match=None) as err:
        parse_sqs_body(body)
    assert reason in str(err.value)


def _node(name: str, taints: list[dict], provider_id: str = f"aws:///us-east-1b/{ID}") -> dict:
    return {"metadata": {"name": name}, "spec": {"providerID": provider_id, "taints": taints}}


@pytest.mark.parametrize(
    ("taints", "kind"),
    [
        (
            [{"key": "aws-node-termination-handler/spot-itn", "value": "1771423289", "effect": "NoSchedule"}],
            SPOT_INTERRUPTION,
        ),
        (
            [{"key": "aws-node-termination-handler/rebalance-recommendation", "effect": "NoSchedule"}],
            REBALANCE_RECOMMENDATION,
        ),
        ([{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}], DISRUPTION),
        ([{"key": "karpenter.sh/disruption", "value": "disrupting", "effect": "NoSchedule"}], DISRUPTION),
        # the most urgent wins
        (
            [
                {"key": "aws-node-termination-handler/rebalance-recommendation", "effect": "NoSchedule"},
                {"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"},
            ],
            SPOT_INTERRUPTION,
        ),
        ([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}], None),
        ([], None),
    ],
)
def test_node_taints_of_termination_handler_and_karpenter(taints, kind):
    notice = notice_from_node(_node("ip-10-0-1-7.ec2.internal", taints))
    if kind is None:
        assert notice is None
        return
    assert (notice.kind, notice.node_name, notice.instance_id, notice.source) == (
        kind, "ip-10-0-1-7.ec2.internal", ID, "node-taint",
    )  # fmt: skip


def test_membership_by_instance_id_or_node_name():
    members = GroupMembers(frozenset({ID}), frozenset({"node-a"}))
    assert parse_sqs_body(json.dumps(spot_warning(ID))) in members
    assert parse_sqs_body(json.dumps(spot_warning("i-0123456789abcdef0"))) not in members
    tainted = [{"key": "aws-node-termination-handler/spot-itn"}]
    assert notice_from_node(_node("node-a", tainted, provider_id="")) in members
    assert notice_from_node(_node("node-b", tainted, provider_id="")) not in members

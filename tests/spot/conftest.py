"""A moto server on 127.0.0.1 for EC2 and SQS, with real spot price histories injected.

moto answers ``DescribeSpotPriceHistory`` with a placeholder price (0.00001) and a fixed
timestamp. ``FakeSpotMarket`` replaces that one response handler of the moto server (the
server side, not boto3 or the hooks): the request still goes from the amazon provider's
hook through botocore over HTTP to moto, which filters and pages the injected records the
way EC2 does.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

REGION = "us-east-1"


@pytest.fixture
def moto_server(moto_endpoint, monkeypatch):
    """The session's moto server (tests/conftest.py ``moto_endpoint``), and ``aws_default`` pointing at it
    for this test only: set for the whole session, it reached every later test of the worker."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_DEFAULT",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "testing",
                "password": "testing",
                "extra": {"endpoint_url": moto_endpoint, "region_name": REGION},
            }
        ),
    )
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    return moto_endpoint


class FakeSpotMarket:
    """Spot price records per region, served by the moto server's EC2 endpoint.

    Semantics of ``DescribeSpotPriceHistory`` reproduced: a record is returned when the
    interval in which it was in effect overlaps [StartTime, EndTime] (so the price in
    effect at StartTime is included), filtered by instance type, availability zone and
    product description, newest first, paged by MaxResults / NextToken.
    """

    def __init__(self, page_size: int = 4) -> None:
        self.records: dict[str, list[dict[str, Any]]] = {}
        self.requests = 0
        self.page_size = page_size
        """Records per page when the request sets no MaxResults: small, so paging is exercised."""

    def set(self, region: str, history: dict[tuple[str, str], list[tuple[float, float]]]) -> None:
        """``{(instance_type, zone): [(hours_ago, price), ...]}``: each price takes effect hours_ago."""
        now = datetime.now(timezone.utc)
        records = []
        for (instance_type, zone), points in history.items():
            for hours_ago, price in points:
                records.append(
                    {
                        "InstanceType": instance_type,
                        "AvailabilityZone": zone,
                        "ProductDescription": "Linux/UNIX",
                        "SpotPrice": f"{price:.6f}",
                        "Timestamp": now - timedelta(hours=hours_ago),
                    }
                )
        self.records[region] = records

    def query(self, region: str, params: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
        self.requests += 1
        types = set(params.get("InstanceTypes") or [])
        filters = params.get("filters") or {}
        start, end = params.get("StartTime"), params.get("EndTime") or datetime.now(timezone.utc)
        records = [
            r for r in self.records.get(region, [])
            if (not types or r["InstanceType"] in types)
            and all(
                {"availability-zone": r["AvailabilityZone"], "instance-type": r["InstanceType"],
                 "product-description": r["ProductDescription"]}.get(k) in v
                for k, v in filters.items()
            )
        ]  # fmt: skip
        by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in records:
            by_key.setdefault((r["InstanceType"], r["AvailabilityZone"]), []).append(r)
        selected = []
        for series in by_key.values():
            series.sort(key=lambda r: r["Timestamp"])
            for i, r in enumerate(series):
                until = series[i + 1]["Timestamp"] if i + 1 < len(series) else None
                if r["Timestamp"] <= end and (start is None or until is None or until > start):
                    selected.append(r)
        selected.sort(key=lambda r: r["Timestamp"], reverse=True)
        offset = int(params.get("NextToken") or 0)
        size = int(params.get("MaxResults") or self.page_size)
        page = selected[offset : offset + size]
        token = str(offset + size) if offset + size < len(selected) else None
        return page, token


def _parse_time(value: str | datetime | None) -> datetime | None:
    if not value:
        return None
    if not isinstance(value, datetime):  # moto parses timestamps already, in most versions
        value = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


@pytest.fixture
def spot_market(moto_server, monkeypatch) -> FakeSpotMarket:
    """Injects spot price histories into the moto server's EC2 API for one test."""
    from moto.core.responses import ActionResult
    from moto.ec2.responses.spot_instances import SpotInstances

    market = FakeSpotMarket()

    def describe_spot_price_history(self) -> ActionResult:
        params = {
            "InstanceTypes": self._get_param("InstanceTypes", []),
            "filters": self._filters_from_querystring(),
            "StartTime": _parse_time(self._get_param("StartTime")),
            "EndTime": _parse_time(self._get_param("EndTime")),
            "MaxResults": self._get_param("MaxResults"),
            "NextToken": self._get_param("NextToken"),
        }
        page, token = market.query(self.region, params)
        history = [{**r, "Timestamp": r["Timestamp"].strftime("%Y-%m-%dT%H:%M:%S.000Z")} for r in page]
        result: dict[str, Any] = {"SpotPriceHistory": history}
        if token:
            result["NextToken"] = token
        return ActionResult(result)

    monkeypatch.setattr(SpotInstances, "describe_spot_price_history", describe_spot_price_history)
    return market


@pytest.fixture
def sqs_queue(moto_server, monkeypatch):
    """A fresh SQS queue on the moto server, on the admin's [dtrain] interruption_queues: (client, url)."""
    import uuid

    from airflow.providers.amazon.aws.hooks.sqs import SqsHook

    client = SqsHook(aws_conn_id="aws_default").conn
    url = client.create_queue(
        QueueName=f"spot-events-{uuid.uuid4().hex[:8]}", Attributes={"VisibilityTimeout": "30"}
    )["QueueUrl"]
    monkeypatch.setenv("AIRFLOW__DTRAIN__INTERRUPTION_QUEUES", url)
    return client, url


def write_manifest(
    checkpoint_uri: Path,
    step: int,
    *,
    step_time_s: float | None = 1.5,
    spot_dollars: float = 0.0,
    on_demand_dollars: float = 0.0,
    local_dollars: float = 0.0,
    gpus_per_node: int = 8,
    price: float = 3.06,
    cost: Any = "auto",
    committed: bool = True,
) -> Path:
    """A checkpoint directory as the trainer commits it: ``step-XXXXXXXX/manifest.json`` with the ledger."""
    directory = Path(checkpoint_uri) / f"step-{step:08d}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "__0_0.distcp").write_bytes(b"\0" * 16)

    def entry(dollars: float) -> dict[str, float]:
        node_hours = dollars / price if price else 0.0
        return {"node_hours": node_hours, "gpu_hours": node_hours * gpus_per_node, "dollars": dollars}

    if cost == "auto":
        cost = {
            "spot": entry(spot_dollars),
            "on_demand": entry(on_demand_dollars),
            "local": entry(local_dollars),
            "total_dollars": spot_dollars + on_demand_dollars + local_dollars,
        }
    # every field a committed manifest has (trainer.checkpoint.directory.MANIFEST_REQUIRED): the budget reads
    # only manifests that pass the checks validation makes
    manifest = {
        "step": step,
        "flavor": "debug",
        "files": {},
        "cost": cost,
        "world_size": 1,
        "config_hash": "0",
        "tokens_seen": 8 * step,
        "wall_time_s": 1.5 * step,
    }
    if step_time_s is not None:
        manifest["step_time_s"] = step_time_s
    if committed:
        (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory

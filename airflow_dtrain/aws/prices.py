"""Spot and on-demand prices read from AWS, and one look at the market (``find_offer``).

Every AWS call goes through the amazon provider's hooks (``EC2Hook`` for the spot price
history, ``AwsBaseHook(client_type="pricing")`` for the Price List API), so the usual
Airflow connection (``aws_default`` or the one you name) decides credentials, region and
endpoint. boto3 is imported by those hooks only when a price is actually read. Which offer
to take is decided by the pure functions of ``airflow_dtrain.spot.offers``.

On-demand prices are looked up in this order:

1. ``overrides`` you pass (``{"p3.2xlarge": 3.06}`` or ``{"us-west-2/p3.2xlarge": 3.06}``);
2. the AWS Price List API (``pricing:GetProducts``), when reachable;
3. ``trainer.money.prices.ON_DEMAND_USD_PER_HOUR``, the built-in table.

``AwsPrices`` is these reads behind ``trainer.money.prices.PriceSource``, the interface the money reads
prices through.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_dtrain.spot.offers import PriceChoice, choose_offer
from trainer.money.prices import ON_DEMAND_USD_PER_HOUR, SpotPrice, parse_price_list_product, region_of_zone

log = logging.getLogger(__name__)

PRICE_LIST_REGION = "us-east-1"
"""The Price List API is served from us-east-1 (also eu-central-1, ap-south-1)."""


def current_spot_prices(
    *,
    instance_types: Iterable[str],
    region: str | None = None,
    availability_zones: Iterable[str] | None = None,
    product_description: str = "Linux/UNIX",
    aws_conn_id: str | None = "aws_default",
    now: datetime | None = None,
) -> list[SpotPrice]:
    """The spot price in effect now for each instance type × zone of one region.

    ``DescribeSpotPriceHistory`` with a start time and no end time returns every price in
    effect since then, including the one that was in effect at the start time, so the
    newest record per (type, zone) is the current price.

    :param instance_types: instance types to look at.
    :param region: the region (default: the connection's).
    :param availability_zones: only these zones of the region (default: all).
    :param product_description: e.g. ``Linux/UNIX`` (VPC and EC2-Classic spellings are both accepted).
    :param aws_conn_id: the Airflow AWS connection.
    :param now: the time to read prices at (tests).
    """
    from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook

    hook = EC2Hook(api_type="client_type", aws_conn_id=aws_conn_id, region_name=region)
    client = hook.conn
    now = now or datetime.now(timezone.utc)
    filters = [{"Name": "product-description", "Values": _product_descriptions(product_description)}]
    zones = sorted(set(availability_zones or ()))
    if zones:
        filters.append({"Name": "availability-zone", "Values": zones})
    latest: dict[tuple[str, str], SpotPrice] = {}
    paginator = client.get_paginator("describe_spot_price_history")
    pages = paginator.paginate(
        InstanceTypes=sorted(set(instance_types)), Filters=filters, StartTime=now - timedelta(seconds=1)
    )
    for page in pages:
        for record in page.get("SpotPriceHistory", []):
            key = (record["InstanceType"], record["AvailabilityZone"])
            stamp = record["Timestamp"]
            stamp = stamp.isoformat() if isinstance(stamp, datetime) else str(stamp)
            price = SpotPrice(key[0], key[1], float(record["SpotPrice"]), stamp)
            if key not in latest or price.timestamp > latest[key].timestamp:
                latest[key] = price
    return sorted(latest.values(), key=lambda p: (p.price, p.instance_type, p.availability_zone))


@dataclass(frozen=True)
class AwsPrices:
    """``trainer.money.prices.PriceSource`` read from AWS: ``on_demand_price`` and ``spot_price_history``
    below, through the Airflow connection ``aws_conn_id``. Plain values, so a trigger can carry it."""

    aws_conn_id: str | None = "aws_default"
    overrides: Mapping[str, float] | None = None
    use_price_list_api: bool = True

    def on_demand_price(self, instance_type: str, region: str) -> tuple[float | None, str]:
        return on_demand_price(
            instance_type,
            region,
            overrides=self.overrides,
            use_price_list_api=self.use_price_list_api,
            aws_conn_id=self.aws_conn_id,
        )

    def spot_price_history(
        self, instance_type: str, availability_zone: str, start: float, end: float
    ) -> list[tuple[float, float]]:
        return spot_price_history(
            instance_type=instance_type,
            availability_zone=availability_zone,
            start=start,
            end=end,
            aws_conn_id=self.aws_conn_id,
        )


@dataclass(frozen=True)
class SpotPriceFeed:
    """Where a spot group's prices are read: while it runs (every ``every_s``, for its trainer's cap) and when
    it ends (to bill it again). Plain values, so a trigger can carry it.

    :param zone: the availability zone the group runs in.
    :param instance_type: its nodes' instance type.
    :param aws_conn_id: the Airflow AWS connection.
    :param every_s: seconds between two reads while the group runs.
    """

    zone: str
    instance_type: str
    aws_conn_id: str | None = "aws_default"
    every_s: float = 300.0

    def history(self, start: float, end: float) -> list[tuple[float, float]]:
        source = AwsPrices(aws_conn_id=self.aws_conn_id)
        return source.spot_price_history(self.instance_type, self.zone, start, end)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spot_price_history(
    *,
    instance_type: str,
    availability_zone: str,
    start: float,
    end: float,
    product_description: str = "Linux/UNIX",
    aws_conn_id: str | None = "aws_default",
) -> list[tuple[float, float]]:
    """Every spot price of ``instance_type`` in ``availability_zone`` in effect between ``start`` and ``end``
    (unix seconds), including the one in effect at ``start``: ``[(since, usd_per_node_hour), ...]``, oldest
    first.

    :param instance_type: e.g. ``p3.2xlarge``.
    :param availability_zone: e.g. ``us-east-1a`` (its region is the one asked).
    :param start: the first second to price (a group's launch).
    :param end: the last (its end).
    :param product_description: e.g. ``Linux/UNIX``; where EC2 keeps both spellings, the plain one wins.
    :param aws_conn_id: the Airflow AWS connection.
    """
    from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook

    region = region_of_zone(availability_zone)
    client = EC2Hook(api_type="client_type", aws_conn_id=aws_conn_id, region_name=region).conn
    descriptions = _product_descriptions(product_description)
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=[instance_type],
        Filters=[{"Name": "product-description", "Values": descriptions},
                 {"Name": "availability-zone", "Values": [availability_zone]}],
        StartTime=datetime.fromtimestamp(start, timezone.utc),
        EndTime=datetime.fromtimestamp(end, timezone.utc),
    )  # fmt: skip
    found: dict[str, list[tuple[float, float]]] = {}
    for page in pages:
        for record in page.get("SpotPriceHistory", []):
            stamp = record["Timestamp"]
            if not isinstance(stamp, datetime):
                stamp = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
            series = found.setdefault(record.get("ProductDescription", descriptions[0]), [])
            series.append((stamp.timestamp(), float(record["SpotPrice"])))
    for description in descriptions:  # one series: two spellings of one product are not two prices at once
        if found.get(description):
            return sorted(found[description])
    return []


def _product_descriptions(description: str) -> list[str]:
    if "(Amazon VPC)" in description:
        return [description]
    return [description, f"{description} (Amazon VPC)"]


def on_demand_price(
    instance_type: str,
    region: str,
    *,
    overrides: Mapping[str, float] | None = None,
    use_price_list_api: bool = True,
    aws_conn_id: str | None = "aws_default",
) -> tuple[float | None, str]:
    """The on-demand price of ``instance_type`` in ``region`` and where it came from.

    Returns ``(price, source)``; source is ``override``, ``price-list-api``, ``builtin`` or
    ``unknown`` (price None).

    :param instance_type: e.g. ``p3.2xlarge``.
    :param region: e.g. ``us-east-1``.
    :param overrides: your prices: ``{"<type>": $/h}`` or ``{"<region>/<type>": $/h}`` (the latter wins).
    :param use_price_list_api: ask the AWS Price List API before the built-in table.
    :param aws_conn_id: the Airflow AWS connection for the Price List API.
    """
    overrides = overrides or {}
    for key in (f"{region}/{instance_type}", instance_type):
        if key in overrides:
            return float(overrides[key]), "override"
    if use_price_list_api:
        try:
            price = price_list_on_demand(instance_type, region, aws_conn_id=aws_conn_id)
        except Exception as err:  # unreachable, not permitted, not implemented: fall back
            log.warning(
                "On-demand price of %s in %s: Price List API unavailable (%s); using the built-in table",
                instance_type, region, err,
            )  # fmt: skip
        else:
            if price is not None:
                return price, "price-list-api"
    if instance_type in ON_DEMAND_USD_PER_HOUR:
        return ON_DEMAND_USD_PER_HOUR[instance_type], "builtin"
    return None, "unknown"


def price_list_on_demand(
    instance_type: str, region: str, *, aws_conn_id: str | None = "aws_default"
) -> float | None:
    """The Linux, shared-tenancy on-demand price from ``pricing:GetProducts`` (None: no such product)."""
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    client = AwsBaseHook(aws_conn_id=aws_conn_id, client_type="pricing", region_name=PRICE_LIST_REGION).conn
    filters = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "licenseModel": "No License required",
    }
    response = client.get_products(
        ServiceCode="AmazonEC2",
        Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
        MaxResults=10,
    )
    prices = [p for p in map(parse_price_list_product, response.get("PriceList", [])) if p is not None]
    return min(prices) if prices else None


def find_offer(
    *,
    instance_types: list[str],
    availability_zones: list[str] | None = None,
    regions: list[str] | None = None,
    max_price: float | None = None,
    max_price_fraction: float | None = None,
    on_demand_prices: Mapping[str, float] | None = None,
    use_price_list_api: bool = True,
    product_description: str = "Linux/UNIX",
    aws_conn_id: str | None = "aws_default",
) -> tuple[PriceChoice | None, list[str]]:
    """One look at the market: the cheapest acceptable offer (or None) and the reasons.

    Shared by ``SpotPriceSensor.poke`` and ``SpotPriceTrigger``; plain arguments only.
    Zones select their regions; with neither zones nor regions, the connection's region.
    """
    by_region: dict[str | None, list[str] | None] = {}
    for zone in availability_zones or ():
        by_region.setdefault(region_of_zone(zone), []).append(zone)
    for region in regions or ():
        by_region.setdefault(region, None)
    if not by_region:
        by_region[None] = None
    prices: list[SpotPrice] = []
    for region, zones in by_region.items():
        prices.extend(
            current_spot_prices(
                instance_types=instance_types,
                region=region,
                availability_zones=zones,
                product_description=product_description,
                aws_conn_id=aws_conn_id,
            )
        )
    on_demand: dict[tuple[str, str], tuple[float | None, str]] = {}
    for p in prices:
        key = (p.region, p.instance_type)
        if key not in on_demand:
            on_demand[key] = on_demand_price(
                p.instance_type, p.region, overrides=on_demand_prices,
                use_price_list_api=use_price_list_api, aws_conn_id=aws_conn_id,
            )  # fmt: skip
    best: PriceChoice | None = None
    reasons: list[str] = []
    for region in sorted({p.region for p in prices}):
        choice, why = choose_offer(
            [p for p in prices if p.region == region],
            {t: v for (r, t), v in on_demand.items() if r == region},
            max_price=max_price,
            max_price_fraction=max_price_fraction,
        )
        reasons.extend(why)
        if choice is not None and (best is None or choice.spot_price < best.spot_price):
            best = choice
    if not prices:
        reasons.append(f"no spot price history for {instance_types} in {sorted(map(str, by_region))}")
    return best, reasons

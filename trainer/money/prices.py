"""Prices: what a node-hour costs, and the one interface every price read goes through.

``PriceSource`` is what the money needs of a cloud: an on-demand price for an instance type in a region,
and the spot price history of an instance type in a zone. ``airflow_dtrain.aws.prices.AwsPrices`` reads
them from AWS (through the amazon provider's hooks); ``StaticPrices`` answers from a table (the built-in
``ON_DEMAND_USD_PER_HOUR``, your own overrides, a fixed spot price: the local backend, tests and the
benchmark). Also here: ``SpotPrice`` (one offer), ``region_of_zone``, and the reading of a Price List API
product document. Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ON_DEMAND_USD_PER_HOUR: dict[str, float] = {
    # p3: 1/4/8 V100 (p3dn: 8 V100 32 GB + 100 Gb/s EFA)
    "p3.2xlarge": 3.06,
    "p3.8xlarge": 12.24,
    "p3.16xlarge": 24.48,
    "p3dn.24xlarge": 31.212,
    # p4d: 8 A100 40 GB; p5: 8 H100 (before the June 2025 P4/P5 on-demand price cut)
    "p4d.24xlarge": 32.7726,
    "p5.48xlarge": 98.32,
    # g4dn: T4; g5: A10G
    "g4dn.xlarge": 0.526,
    "g4dn.2xlarge": 0.752,
    "g4dn.12xlarge": 3.912,
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g5.12xlarge": 5.672,
    "g5.48xlarge": 16.288,
    "trn1.32xlarge": 21.50,
}
"""Built-in on-demand list prices, US$ per instance-hour, Linux, shared tenancy, us-east-1
(AWS Price List, 2024). Other regions are often dearer and prices change: where the Price
List API is unreachable, pass your own prices (``on_demand_prices=``)."""

_REGION_OF_ZONE = re.compile(r"^([a-z]{2}(?:-gov)?-[a-z]+-\d+)")


def region_of_zone(zone: str) -> str:
    """``us-east-1a`` -> ``us-east-1`` (also local zones: ``us-west-2-lax-1a`` -> ``us-west-2``)."""
    match = _REGION_OF_ZONE.match(zone)
    if not match:
        raise ValueError(f"availability_zones: not an availability zone: {zone!r}")
    return match.group(1)


@dataclass(frozen=True)
class SpotPrice:
    """The spot price in effect for one instance type in one availability zone."""

    instance_type: str
    availability_zone: str
    price: float
    """US$ per instance-hour."""
    timestamp: str
    """When this price took effect (ISO 8601)."""

    @property
    def region(self) -> str:
        return region_of_zone(self.availability_zone)


def parse_price_list_product(product: str | dict[str, Any]) -> float | None:
    """The hourly on-demand USD price in one Price List API product document (None if it has none)."""
    doc = json.loads(product) if isinstance(product, str) else product
    for term in doc.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if usd is not None and dimension.get("unit", "Hrs").lower().startswith("hr") and float(usd) > 0:
                return float(usd)
    return None


@runtime_checkable
class PriceSource(Protocol):
    """Where prices come from; every price read implements it."""

    def on_demand_price(self, instance_type: str, region: str) -> tuple[float | None, str]:
        """``(US$ per instance-hour or None, where it came from)``."""
        ...

    def spot_price_history(
        self, instance_type: str, availability_zone: str, start: float, end: float
    ) -> list[tuple[float, float]]:
        """``[(since, usd_per_node_hour), ...]`` in effect between ``start`` and ``end`` (unix seconds),
        including the one in effect at ``start``, oldest first."""
        ...


@dataclass(frozen=True)
class StaticPrices:
    """Prices from tables: on-demand from ``overrides`` (``{"<type>"}`` or ``{"<region>/<type>"}``, the latter
    wins), else the built-in ``ON_DEMAND_USD_PER_HOUR``; spot at ``spot`` (``{"<type>": $/h}``), one price
    throughout."""

    overrides: Mapping[str, float] = field(default_factory=dict)
    spot: Mapping[str, float] = field(default_factory=dict)

    def on_demand_price(self, instance_type: str, region: str) -> tuple[float | None, str]:
        for key in (f"{region}/{instance_type}", instance_type):
            if key in self.overrides:
                return float(self.overrides[key]), "override"
        if instance_type in ON_DEMAND_USD_PER_HOUR:
            return ON_DEMAND_USD_PER_HOUR[instance_type], "builtin"
        return None, "unknown"

    def spot_price_history(
        self, instance_type: str, availability_zone: str, start: float, end: float
    ) -> list[tuple[float, float]]:
        price = self.spot.get(instance_type)
        return [] if price is None else [(start, float(price))]

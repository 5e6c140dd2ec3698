"""The choice of a spot offer, as pure functions: which offer is acceptable, at what limit.

No I/O here: ``airflow_dtrain.aws.prices`` reads the spot price history and the on-demand
prices from AWS and hands them to ``choose_offer``. What is left is plain data and arithmetic:

- in ``trainer.money.prices``: ``ON_DEMAND_USD_PER_HOUR`` (the built-in on-demand table), ``SpotPrice``
  (one offer), ``region_of_zone``, ``parse_price_list_product``;
- ``price_limit`` and ``choose_offer``: the cheapest offer at or below its limit, with the
  reasons; ``PriceChoice``, what ``SpotPriceSensor`` pushes to XCom, and
  ``fixed_price_choice`` for a backend with a fixed price (the local backend).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from trainer.money.prices import SpotPrice


@dataclass(frozen=True)
class PriceChoice:
    """The offer a ``SpotPriceSensor`` chose; what it pushes to XCom (``to_dict()``)."""

    instance_type: str
    availability_zone: str
    region: str
    spot_price: float
    on_demand_price: float | None
    on_demand_source: str
    limit: float
    """The price this offer had to be at or below."""
    timestamp: str
    source: str = "ec2"
    """``ec2`` (spot price history) or ``fixed`` (a fixed price, e.g. the local backend)."""

    @property
    def fraction_of_on_demand(self) -> float | None:
        return self.spot_price / self.on_demand_price if self.on_demand_price else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fraction_of_on_demand": self.fraction_of_on_demand}


def price_limit(
    *, max_price: float | None, max_price_fraction: float | None, on_demand: float | None
) -> float | None:
    """The highest acceptable spot price: the tighter of the absolute and the relative limit.

    None when the only limit is relative and the on-demand price is unknown: such an
    offer cannot be shown to be acceptable.
    """
    limits = []
    if max_price is not None:
        limits.append(float(max_price))
    if max_price_fraction is not None:
        if on_demand is None:
            return None
        limits.append(float(max_price_fraction) * on_demand)
    return min(limits) if limits else None


def choose_offer(
    prices: Iterable[SpotPrice],
    on_demand: Mapping[str, tuple[float | None, str]],
    *,
    max_price: float | None,
    max_price_fraction: float | None,
) -> tuple[PriceChoice | None, list[str]]:
    """The cheapest offer at or below its limit, and one line per offer saying why (not).

    :param prices: current spot prices.
    :param on_demand: ``{instance_type: (price or None, source)}``.
    :param max_price: absolute limit, $/h.
    :param max_price_fraction: limit as a fraction of the on-demand price.
    """
    best: PriceChoice | None = None
    reasons: list[str] = []
    for offer in sorted(prices, key=lambda p: (p.price, p.instance_type, p.availability_zone)):
        od, od_source = on_demand.get(offer.instance_type, (None, "unknown"))
        limit = price_limit(max_price=max_price, max_price_fraction=max_price_fraction, on_demand=od)
        where = f"{offer.instance_type} in {offer.availability_zone} at ${offer.price:.4f}/h"
        if limit is None:
            reasons.append(f"{where}: no on-demand price known, so max_price_fraction cannot be applied")
            continue
        if offer.price > limit + 1e-12:
            reasons.append(f"{where}: above the limit ${limit:.4f}/h")
            continue
        reasons.append(f"{where}: acceptable (limit ${limit:.4f}/h)")
        if best is None:
            best = PriceChoice(
                instance_type=offer.instance_type,
                availability_zone=offer.availability_zone,
                region=offer.region,
                spot_price=offer.price,
                on_demand_price=od,
                on_demand_source=od_source,
                limit=limit,
                timestamp=offer.timestamp,
            )
    return best, reasons


def fixed_price_choice(*, price_per_hour: float, on_demand_price: float | None = None) -> PriceChoice:
    """The offer of a backend with a fixed price (the local backend): no AWS involved."""
    return PriceChoice(
        instance_type="local",
        availability_zone="local",
        region="local",
        spot_price=float(price_per_hour),
        on_demand_price=float(on_demand_price if on_demand_price is not None else price_per_hour),
        on_demand_source="fixed",
        limit=float(price_per_hour),
        timestamp=datetime.now(timezone.utc).isoformat(),
        source="fixed",
    )

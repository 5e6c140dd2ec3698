"""SpotPriceSensor: wait until a spot offer is cheap enough, and say which one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf

from airflow_dtrain.operators.inputs import build, check_given, names
from airflow_dtrain.templating import is_template
from airflow_dtrain.triggers.spot_price import SpotPriceTrigger
from trainer.config.fields import check, check_value, setting

if TYPE_CHECKING:
    from airflow.sdk import Context


@dataclass(frozen=True, kw_only=True)
class SpotPriceInputs:
    """The sensor's prices (templated), declared once: checked when the DAG is parsed (what is not a template)
    and built once the templates have rendered. ``on_demand_prices``' entries are prices as ``max_price``."""

    max_price: float | None = setting(None, gt=0, help="Highest acceptable spot price, $/instance-hour.")
    max_price_fraction: float | None = setting(
        None, gt=0, le=1, help="Highest acceptable spot price as a fraction of on-demand (0-1]."
    )
    fixed_price_per_hour: float | None = setting(
        None, ge=0, help="A fixed price instead of the spot market (no AWS)."
    )
    fixed_on_demand_price: float | None = setting(
        None, ge=0, help="The on-demand price to report with a fixed price (default: the same)."
    )

    def __post_init__(self) -> None:
        check(self, "")


_PRICES = names(SpotPriceInputs)


class SpotPriceSensor(BaseSensorOperator):
    """
    Wait until the cheapest acceptable EC2 spot offer is at or below its price limit.

    Reads the spot price history for ``instance_types`` × ``availability_zones`` (or every
    zone of ``regions``) through the amazon provider's ``EC2Hook``. An offer is acceptable
    when its price is at or below ``max_price`` and at or below ``max_price_fraction`` ×
    its on-demand price (whichever are given). Pushes the chosen offer as its return
    value: ``instance_type``, ``availability_zone``, ``region``, ``spot_price``,
    ``on_demand_price``, ``on_demand_source``, ``fraction_of_on_demand``, ``limit``, ``source``.

    With ``fixed_price_per_hour`` no AWS call is made: the offer is that price at once
    (the local backend, or any capacity with a known price), so one DAG runs with or without AWS.

    :param instance_types: acceptable instance types, e.g. ``["p4d.24xlarge", "p5.48xlarge"]``. (templated)
    :param availability_zones: only these zones (they select their regions). (templated)
    :param regions: every zone of these regions (default: the connection's region). (templated)
    :param max_price: highest acceptable spot price, $/instance-hour. (templated)
    :param max_price_fraction: highest acceptable spot price as a fraction of on-demand (0-1]. (templated)
    :param on_demand_prices: your on-demand prices, ``{"<type>": $/h}`` or ``{"<region>/<type>": $/h}``;
        they win over the Price List API and the built-in table. (templated)
    :param use_price_list_api: ask the AWS Price List API for on-demand prices.
    :param product_description: the spot product, ``Linux/UNIX`` by default.
    :param fixed_price_per_hour: a fixed price instead of the spot market (no AWS). (templated)
    :param fixed_on_demand_price: the on-demand price to report with a fixed price (default: the same).
    (templated)
    :param aws_conn_id: the Airflow AWS connection.
    :param deferrable: watch the market from the triggerer, freeing the worker slot.
    """

    template_fields: Sequence[str] = (
        "instance_types", "availability_zones", "regions", "max_price", "max_price_fraction",
        "on_demand_prices", "fixed_price_per_hour", "fixed_on_demand_price",
    )  # fmt: skip
    template_fields_renderers = {"on_demand_prices": "json"}
    ui_color = "#fff2cc"

    def __init__(
        self,
        *,
        instance_types: list[str] | str | None = None,
        availability_zones: list[str] | None = None,
        regions: list[str] | None = None,
        max_price: float | str | None = None,
        max_price_fraction: float | str | None = None,
        on_demand_prices: dict[str, float] | None = None,
        use_price_list_api: bool = True,
        product_description: str = "Linux/UNIX",
        fixed_price_per_hour: float | str | None = None,
        fixed_on_demand_price: float | str | None = None,
        aws_conn_id: str | None = "aws_default",
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.instance_types = instance_types
        self.availability_zones = availability_zones
        self.regions = regions
        self.max_price = max_price
        self.max_price_fraction = max_price_fraction
        self.on_demand_prices = on_demand_prices
        self.use_price_list_api = use_price_list_api
        self.product_description = product_description
        self.fixed_price_per_hour = fixed_price_per_hour
        self.fixed_on_demand_price = fixed_on_demand_price
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable
        self._validate(skip_templates=True)

    def _validate(self, *, skip_templates: bool = False) -> dict[str, Any]:
        """The checked arguments of ``find_offer``; raises ``ValueError`` naming the field and value."""
        where = f"{type(self).__name__}(task_id={self.task_id!r})"
        prices = {name: getattr(self, name) for name in _PRICES}
        fixed = (self.fixed_price_per_hour, self.fixed_on_demand_price)
        if skip_templates:
            check_given(SpotPriceInputs, prices, where)
            if any(is_template(v) for v in fixed) or fixed[0] not in (None, ""):
                return {}
            x = None
        else:
            x = build(SpotPriceInputs, prices, where)
            if x.fixed_price_per_hour is not None:
                return {}
        skip = lambda value: skip_templates and is_template(value)  # noqa: E731
        try:
            types = self._check_places(skip)
            given = [x.max_price, x.max_price_fraction] if x else [self.max_price, self.max_price_fraction]
            if all(v in (None, "") for v in given):
                raise ValueError(
                    "max_price / max_price_fraction: give at least one (or fixed_price_per_hour), got neither"
                )
            self._check_on_demand_prices(skip)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        return {
            "instance_types": list(types) if isinstance(types, (list, tuple)) else types,
            "availability_zones": list(self.availability_zones) if self.availability_zones else None,
            "regions": list(self.regions) if self.regions else None,
            "max_price": x.max_price if x else None,
            "max_price_fraction": x.max_price_fraction if x else None,
            "on_demand_prices": dict(self.on_demand_prices or {}),
            "use_price_list_api": self.use_price_list_api,
            "product_description": self.product_description,
            "aws_conn_id": self.aws_conn_id,
        }

    def _check_places(self, skip: Any) -> Any:
        """The instance types (a list), and the zones' and regions' lists of names; the zones known."""
        types = self.instance_types
        if not skip(types):
            types = [types] if isinstance(types, str) else types
            if not types or not all(isinstance(t, str) and "." in t for t in types):
                raise ValueError(
                    f"instance_types: expected instance types like 'p4d.24xlarge', got {types!r}"
                )
        for name in ("availability_zones", "regions"):
            value = getattr(self, name)
            if value is None or skip(value):
                continue
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name}: expected a list of names, got {value!r}")
        if self.availability_zones and not skip(self.availability_zones):
            from trainer.money.prices import region_of_zone

            for zone in self.availability_zones:
                region_of_zone(zone)
        return types

    def _check_on_demand_prices(self, skip: Any) -> None:
        """Each of ``on_demand_prices`` a price, by ``max_price``'s declaration."""
        prices = self.on_demand_prices
        if prices is None or skip(prices):
            return
        if not isinstance(prices, dict):
            raise ValueError(f"on_demand_prices: expected a mapping of instance type to $/h, got {prices!r}")
        for key, value in prices.items():
            check_value(SpotPriceInputs, "max_price", value, f"on_demand_prices[{key!r}]")

    def _fixed(self) -> dict[str, Any] | None:
        if self.fixed_price_per_hour in (None, ""):
            return None
        from airflow_dtrain.spot.offers import fixed_price_choice

        od = self.fixed_on_demand_price
        return fixed_price_choice(
            price_per_hour=float(self.fixed_price_per_hour),
            on_demand_price=float(od) if od not in (None, "") else None,
        ).to_dict()

    def execute(self, context: Context) -> Any:
        find_kwargs = self._validate()
        fixed = self._fixed()
        if fixed is not None:
            self.log.info("Fixed price $%.4f/h: no spot market to watch", fixed["spot_price"])
            _report(fixed)
            return fixed
        if self.deferrable:
            result = self.poke(context)
            if result:
                return result.xcom_value
            self.defer(
                trigger=SpotPriceTrigger(find_kwargs=find_kwargs, poll_interval=self.poke_interval),
                method_name="execute_complete",
                timeout=timedelta(seconds=self.timeout) if self.timeout else None,
            )
        return super().execute(context)

    def poke(self, context: Context) -> PokeReturnValue:
        from airflow_dtrain.aws.prices import find_offer

        choice, reasons = find_offer(**self._validate())
        for reason in reasons:
            self.log.info("%s", reason)
        if choice is None:
            return PokeReturnValue(is_done=False)
        self.log.info(
            "Chose %s in %s at $%.4f/h (on-demand $%s/h, %s)", choice.instance_type, choice.availability_zone,
            choice.spot_price, choice.on_demand_price, choice.on_demand_source,
        )  # fmt: skip
        _report(choice.to_dict())
        return PokeReturnValue(is_done=True, xcom_value=choice.to_dict())

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            raise RuntimeError(f"SpotPriceSensor(task_id={self.task_id!r}): {event.get('message')}")
        self.log.info("%s", event.get("message"))
        _report(event["choice"])
        return event["choice"]


def _report(choice: dict[str, Any]) -> None:
    from airflow_dtrain import metrics

    if choice.get("spot_price") is not None:
        metrics.gauge("spot.price_dollars_per_hour", float(choice["spot_price"]))
    if choice.get("on_demand_price") is not None:
        metrics.gauge("spot.on_demand_price_dollars_per_hour", float(choice["on_demand_price"]))

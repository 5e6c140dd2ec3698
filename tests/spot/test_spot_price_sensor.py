"""SpotPriceSensor against moto's EC2 API with real p3 spot price histories injected."""

from __future__ import annotations

import json
import logging
import threading

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_dtrain.aws.prices import on_demand_price
from airflow_dtrain.sensors.spot_price import SpotPriceSensor
from trainer.money.prices import ON_DEMAND_USD_PER_HOUR, parse_price_list_product
from airflow_dtrain.triggers.spot_price import SpotPriceTrigger
from tests.conftest import run_trigger

# p3.2xlarge spot prices in us-east-1, Feb-Mar 2023, from the SkyNomad trace
# (/work/shared/data/spot/andylizf_skynomad-artifact/data/v100_spot_prices.json); on-demand $3.06/h.
# Each series: (hours ago the price took effect, $/h), the last one is in effect now.
P3_HISTORY = {
    ("p3.2xlarge", "us-east-1a"): [(30, 1.6703), (6, 1.7132)],
    ("p3.2xlarge", "us-east-1c"): [(30, 1.2054), (12, 1.1680)],
    # cheapest zone a day ago, no longer: its old price must not be chosen
    ("p3.2xlarge", "us-east-1d"): [(40, 1.1142), (20, 1.2290)],
    ("p3.2xlarge", "us-east-1f"): [(30, 1.2433)],
    ("p3.8xlarge", "us-east-1c"): [(30, 4.6970)],
}


def _sensor(**kwargs) -> SpotPriceSensor:
    arguments = {
        "task_id": "spot_price",
        "instance_types": ["p3.2xlarge", "p3.8xlarge"],
        "use_price_list_api": False,
    }
    return SpotPriceSensor(**{**arguments, **kwargs})


def test_poke_chooses_the_cheapest_zone_at_its_current_price(spot_market):
    spot_market.set("us-east-1", P3_HISTORY)

    result = _sensor(max_price_fraction=0.4).poke({})

    assert result.is_done
    choice = result.xcom_value
    assert (choice["instance_type"], choice["availability_zone"]) == ("p3.2xlarge", "us-east-1c")
    assert choice["spot_price"] == pytest.approx(1.168)
    assert choice["on_demand_price"] == 3.06 and choice["on_demand_source"] == "builtin"
    assert choice["fraction_of_on_demand"] == pytest.approx(1.168 / 3.06)
    assert choice["limit"] == pytest.approx(0.4 * 3.06)
    json.dumps(choice)  # goes to XCom as is


def test_poke_waits_while_every_offer_is_above_the_limit(spot_market, capsys):
    spot_market.set("us-east-1", P3_HISTORY)

    result = _sensor(max_price=1.10).poke({})

    assert not result.is_done
    assert "p3.2xlarge in us-east-1c at $1.1680/h: above the limit $1.1000/h" in capsys.readouterr().out


def test_zones_restrict_the_choice(spot_market):
    spot_market.set("us-east-1", P3_HISTORY)

    result = _sensor(availability_zones=["us-east-1a", "us-east-1f"], max_price=1.5).poke({})

    assert result.xcom_value["availability_zone"] == "us-east-1f"
    assert result.xcom_value["spot_price"] == pytest.approx(1.2433)


def test_every_page_of_the_price_history_is_read(spot_market):
    # 12 offers, 4 per page: the cheapest comes on the last page (newest first)
    history = {("g5.xlarge", f"us-east-1{z}"): [(1 + i, 0.50 - i / 100)] for i, z in enumerate("abcdef")}
    history |= {("g4dn.xlarge", f"us-east-1{z}"): [(10 + i, 0.35 - i / 100)] for i, z in enumerate("abcdef")}
    spot_market.set("us-east-1", history)

    result = _sensor(instance_types=["g5.xlarge", "g4dn.xlarge"], max_price=1.0).poke({})

    assert spot_market.requests == 3
    assert (result.xcom_value["instance_type"], result.xcom_value["availability_zone"]) == (
        "g4dn.xlarge",
        "us-east-1f",
    )
    assert result.xcom_value["spot_price"] == pytest.approx(0.30)


def test_on_demand_overrides_change_what_is_acceptable(spot_market):
    spot_market.set("us-east-1", P3_HISTORY)

    one_type = {"instance_types": ["p3.2xlarge"]}
    assert _sensor(max_price_fraction=0.5, **one_type).poke({}).is_done  # 1.168 <= 0.5 x 3.06
    assert (
        not _sensor(max_price_fraction=0.5, on_demand_prices={"us-east-1/p3.2xlarge": 2.0}, **one_type)
        .poke({})
        .is_done
    )
    choice = (
        _sensor(max_price_fraction=0.6, on_demand_prices={"p3.2xlarge": 2.0}, **one_type).poke({}).xcom_value
    )
    assert choice["on_demand_price"] == 2.0 and choice["on_demand_source"] == "override"


def test_price_list_api_unreachable_falls_back_to_the_builtin_table(moto_server, caplog):
    caplog.set_level(logging.WARNING)
    price, source = on_demand_price("p3.2xlarge", "us-east-1", use_price_list_api=True)
    assert (price, source) == (ON_DEMAND_USD_PER_HOUR["p3.2xlarge"], "builtin")
    assert "Price List API unavailable" in caplog.text
    assert on_demand_price("x9.huge", "us-east-1", use_price_list_api=False) == (None, "unknown")


def test_price_list_product_document_is_parsed():
    # the shape of one pricing:GetProducts PriceList entry (trimmed)
    product = {
        "product": {
            "attributes": {
                "instanceType": "p3.2xlarge",
                "regionCode": "us-east-1",
                "operatingSystem": "Linux",
            }
        },
        "terms": {
            "OnDemand": {
                "CGJXHFUSGE546RV6.JRTCKXETXF": {
                    "priceDimensions": {
                        "CGJXHFUSGE546RV6.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "pricePerUnit": {"USD": "3.0600000000"},
                            "description": "$3.06 per On Demand Linux p3.2xlarge Instance Hour",
                        }
                    }
                }
            }
        },
    }
    assert parse_price_list_product(json.dumps(product)) == 3.06
    assert parse_price_list_product({"terms": {}}) is None


def test_offers_without_an_on_demand_price_are_not_accepted_on_a_relative_limit(spot_market, capsys):
    spot_market.set("us-east-1", {("p9.mega", "us-east-1a"): [(1, 0.01)]})
    sensor = SpotPriceSensor(
        task_id="s", instance_types=["p9.mega"], max_price_fraction=0.9, use_price_list_api=False
    )
    assert not sensor.poke({}).is_done
    assert "p9.mega in us-east-1a at $0.0100/h: no on-demand price known" in capsys.readouterr().out


def test_deferrable_sensor_defers_then_the_trigger_fires_when_the_price_drops(spot_market):
    spot_market.set("us-east-1", P3_HISTORY)
    sensor = _sensor(max_price=1.0, deferrable=True, poke_interval=0.2)

    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_dtrain.triggers.spot_price.SpotPriceTrigger"
    trigger = SpotPriceTrigger(**json.loads(json.dumps(kwargs)))  # what the triggerer rebuilds

    def price_drops():
        spot_market.set(
            "us-east-1", {**P3_HISTORY, ("p3.2xlarge", "us-east-1f"): [(30, 1.2433), (0.01, 0.9520)]}
        )

    timer = threading.Timer(1.0, price_drops)
    timer.start()
    try:
        event = run_trigger(trigger, timeout=60)
    finally:
        timer.cancel()

    assert spot_market.requests >= 2  # it polled at least once before the drop
    choice = sensor.execute_complete({}, event)
    assert (choice["availability_zone"], choice["spot_price"]) == ("us-east-1f", pytest.approx(0.952))


def test_deferrable_error_event_fails_the_task_with_the_cause(moto_server):
    trigger = SpotPriceTrigger(
        find_kwargs={"instance_types": ["p3.2xlarge"], "max_price": 1.0, "aws_conn_id": "no_such_connection"},
        poll_interval=0.1,
    )
    event = run_trigger(trigger, timeout=60)
    assert event["status"] == "error"
    with pytest.raises(RuntimeError, match="reading spot prices failed"):
        _sensor(max_price=1.0).execute_complete({}, event)


def test_fixed_price_needs_no_aws():
    sensor = SpotPriceSensor(
        task_id="local_price", fixed_price_per_hour=0.5, aws_conn_id="no_such_connection"
    )
    choice = sensor.execute({})
    assert choice["source"] == "fixed" and choice["spot_price"] == 0.5 and choice["on_demand_price"] == 0.5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"instance_types": ["p3.2xlarge"]}, "max_price / max_price_fraction: give at least one"),
        (
            {"instance_types": ["p3.2xlarge"], "max_price_fraction": 1.5},
            "max_price_fraction: must be in (0, 1], got 1.5",
        ),
        (
            {"instance_types": ["p3.2xlarge"], "max_price": "cheap"},
            "max_price: expected a number, got 'cheap'",
        ),
        ({"instance_types": [], "max_price": 1.0}, "instance_types: expected instance types"),
        (
            {"instance_types": ["p3.2xlarge"], "max_price": 1, "availability_zones": ["mars-1a"]},
            "not an availability zone: 'mars-1a'",
        ),
        (
            {"instance_types": ["p3.2xlarge"], "max_price": 1, "on_demand_prices": {"p3.2xlarge": -3}},
            "on_demand_prices['p3.2xlarge']",
        ),
    ],
)
def test_bad_arguments_fail_when_the_dag_is_parsed(kwargs, message):
    with pytest.raises(ValueError, match="SpotPriceSensor\\(task_id='s'\\)") as err:
        SpotPriceSensor(task_id="s", **kwargs)
    assert message in str(err.value)


def test_templated_arguments_are_checked_after_rendering():
    sensor = SpotPriceSensor(task_id="s", instance_types=["p3.2xlarge"], max_price="{{ params.max_price }}")
    sensor.max_price = "-1"  # what rendering produced
    with pytest.raises(ValueError, match="max_price: must be > 0, got -1.0"):
        sensor.execute({})

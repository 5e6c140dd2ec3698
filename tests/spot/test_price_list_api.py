"""The on-demand price from the AWS Price List API (``pricing:GetProducts``), through the amazon
provider's hook and the real botocore client, against a fake Price List endpoint on 127.0.0.1
(moto does not implement the Price List API) that answers in the API's JSON protocol."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from airflow_dtrain.aws.prices import on_demand_price
from trainer.money.prices import ON_DEMAND_USD_PER_HOUR


def _product(instance_type: str, region: str, usd: str) -> str:
    """One PriceList entry, a JSON document in a string, as GetProducts returns it."""
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "instanceType": instance_type,
                    "regionCode": region,
                    "operatingSystem": "Linux",
                },
            },
            "terms": {
                "OnDemand": {
                    "SKU.JRTCKXETXF": {
                        "priceDimensions": {
                            "SKU.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": usd},
                                "description": f"${usd} per On Demand Linux Instance Hour",
                            }
                        }
                    }
                }
            },
        }
    )


@pytest.fixture
def price_list(monkeypatch):
    """A fake Price List endpoint: p5.48xlarge in us-west-2 at $55.04/h (two SKUs: the lower wins)."""
    requests: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append({"target": self.headers.get("X-Amz-Target"), **body})
            filters = {f["Field"]: f["Value"] for f in body.get("Filters", [])}
            found = filters.get("instanceType") == "p5.48xlarge" and filters.get("regionCode") == "us-west-2"
            payload = {
                "FormatVersion": "aws_v1",
                "PriceList": [
                    _product("p5.48xlarge", "us-west-2", "98.3200000000"),
                    _product("p5.48xlarge", "us-west-2", "55.0400000000"),
                ]
                if found
                else [],
            }
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-amz-json-1.1")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_PRICING",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "testing",
                "password": "testing",
                "extra": {
                    "endpoint_url": f"http://127.0.0.1:{server.server_address[1]}",
                    "region_name": "us-east-1",
                },
            }
        ),
    )
    yield requests
    server.shutdown()
    server.server_close()


def test_the_price_list_api_price_wins_over_the_builtin_table(price_list):
    price, source = on_demand_price("p5.48xlarge", "us-west-2", aws_conn_id="aws_pricing")
    assert (price, source) == (55.04, "price-list-api")
    assert ON_DEMAND_USD_PER_HOUR["p5.48xlarge"] != 55.04  # the table would have said something else
    [request] = price_list
    assert request["target"] == "AWSPriceListService.GetProducts" and request["ServiceCode"] == "AmazonEC2"
    filters = {f["Field"]: (f["Type"], f["Value"]) for f in request["Filters"]}
    assert filters["instanceType"] == ("TERM_MATCH", "p5.48xlarge") and filters["regionCode"] == (
        "TERM_MATCH",
        "us-west-2",
    )
    assert filters["operatingSystem"][1] == "Linux" and filters["tenancy"][1] == "Shared"
    assert filters["capacitystatus"][1] == "Used" and filters["preInstalledSw"][1] == "NA"


def test_a_type_the_price_list_does_not_know_falls_back_to_the_table(price_list):
    assert on_demand_price("p4d.24xlarge", "us-east-1", aws_conn_id="aws_pricing") == (
        ON_DEMAND_USD_PER_HOUR["p4d.24xlarge"],
        "builtin",
    )
    assert len(price_list) == 1  # it was asked first

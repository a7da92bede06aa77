"""moto's server, started by the tests (support/ec2.py `MotoServer`), with spot prices that
differ per zone: moto answers DescribeSpotPriceHistory with one constant price for every zone,
so a test that needs an order of zones (`--cheapest`) writes its prices into the JSON file that
GPUSESSION_TEST_SPOT_PRICES names: {"us-east-1c": "0.1578", "us-east-1a/g4dn.xlarge": "0.2"}
(a zone, or zone/instance type). A zone the file does not name keeps moto's price. The file is
read on every call; this patch lives in the stand-in for the cloud only, never in gpusession.

Run as `python moto_prices.py -H 127.0.0.1 -p PORT` (moto_server's arguments)."""

from __future__ import annotations

import json
import os
import sys

from moto.ec2.responses.spot_instances import SpotInstances
from moto.server import main

PRICES_ENV = "GPUSESSION_TEST_SPOT_PRICES"
_moto_answer = SpotInstances.describe_spot_price_history


def _table() -> dict[str, str]:
    path = os.environ.get(PRICES_ENV, "")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def describe_spot_price_history(self):
    answer = _moto_answer(self)
    table = _table()
    for item in answer.result["SpotPriceHistory"]:
        zone = item["AvailabilityZone"]
        price = table.get(f"{zone}/{item['InstanceType']}", table.get(zone))
        if price is not None:
            item["SpotPrice"] = str(price)
    return answer


SpotInstances.describe_spot_price_history = describe_spot_price_history

if __name__ == "__main__":
    main(sys.argv[1:])

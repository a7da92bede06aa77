"""On-demand list prices from the AWS Price List API (`pricing` GetProducts), for
`gpusession catalog refresh`. The API answers at its us-east-1 endpoint for every region; the
client is made like every other of this backend (sdk.py: the endpoint seam included)."""

from __future__ import annotations

import json
from typing import Any

from .sdk import Aws

PRICING_REGION = "us-east-1"  # where the Price List API answers (for prices of every region)


def on_demand_prices(aws: Aws, instance_types: list[str], region: str) -> dict[str, float]:
    """Instance type -> the on-demand $/h of a shared-tenancy Linux instance in `region`, for
    each type the API prices (one GetProducts call per type)."""
    client = aws.client("pricing")
    found: dict[str, float] = {}
    for instance_type in instance_types:
        filters = {
            "instanceType": instance_type,
            "regionCode": region,
            "operatingSystem": "Linux",
            "tenancy": "Shared",
            "preInstalledSw": "NA",
            "capacitystatus": "Used",
        }
        reply = client.get_products(
            ServiceCode="AmazonEC2",
            FormatVersion="aws_v1",
            Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
            MaxResults=10,
        )
        price = hourly_price(reply.get("PriceList") or [])
        if price is not None:
            found[instance_type] = price
    return found


def hourly_price(price_list: list[Any]) -> float | None:
    """The on-demand hourly USD price in a GetProducts PriceList (items are JSON text)."""
    for item in price_list:
        product = json.loads(item) if isinstance(item, str) else item
        for term in (product.get("terms") or {}).get("OnDemand", {}).values():
            for dimension in (term.get("priceDimensions") or {}).values():
                usd = (dimension.get("pricePerUnit") or {}).get("USD")
                if dimension.get("unit", "Hrs") == "Hrs" and usd and float(usd) > 0:
                    return float(usd)
    return None

"""The regions the aws backend works in: its `regions` setting (checked and tidied) and which of
them it compares prices in, within an administrator's policy."""

from __future__ import annotations

from ...configuration.settings import ConfigError, load_policy
from ...core.textvalues import aws_region


def regions_setting(text: str) -> str:
    """A comma-separated list of AWS regions (AwsBackend.regions), checked and tidied."""
    names = [aws_region(part) for part in text.split(",") if part.strip()]
    return ",".join(dict.fromkeys(names))


def price_regions(configured: str) -> list[str | None]:
    """The regions whose prices are compared (`--cheapest`, `types --live`): the configured ones
    (AwsBackend.regions, comma-separated) that the policy in force allows, else the
    policy's allowed regions, else [None] (the cloud's default region). ConfigError when every
    configured region is one the policy does not allow."""
    mine = [name for name in configured.split(",") if name]
    policy = load_policy()
    allowed = policy.allowed_regions if policy is not None else None
    if allowed is None:
        return list(mine) or [None]
    kept = [name for name in mine if name in allowed]
    if mine and not kept:
        raise ConfigError(
            f"AwsBackend.regions ({', '.join(mine)}) holds none of the regions your policy "
            f"({policy.path}) allows ({', '.join(allowed)}): set it to some of those, or empty"
        )
    return kept or list(allowed)

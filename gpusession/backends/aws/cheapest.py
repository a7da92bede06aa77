"""`--cheapest`: where a spot start goes when the user asked for the lowest current price.

The backend asks each allowed region for its zones' current spot prices (the same cached
DescribeSpotPriceHistory answers `%gpu types --live` shows), ranks every (zone, price), and
provisions region by region in the order of each region's cheapest zone; within a region the
zones are tried cheapest first (`launch.attempts`), so a zone without capacity
(InsufficientInstanceCapacity) hands the start to the next cheapest one. Moving to another
region costs its own image look-up, key pair and security group, so a region's zones are all
tried before the next region's.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Cheapest:
    """What a `--cheapest` start compared, and what it has tried so far."""

    prices: dict[str, dict[str, float]]  # region -> zone -> current spot price ($/h)
    full: list[str] = dataclasses.field(default_factory=list)  # zones tried without capacity
    pinned: str = ""  # a kept workspace's name: its volume's zone decides (EBS stays in its zone)

    @property
    def zones(self) -> int:
        return sum(len(p) for p in self.prices.values())

    def regions(self) -> list[str]:
        """The regions in the order of their cheapest zone (those AWS gave no price for last)."""
        return sorted(
            self.prices, key=lambda r: (min(self.prices[r].values(), default=float("inf")), r)
        )

    def best(self) -> tuple[str, float] | None:
        """The cheapest zone of all, with its price."""
        found = [(p, z) for prices in self.prices.values() for z, p in prices.items()]
        return (min(found)[1], min(found)[0]) if found else None

    def fallback(self, mode: str, last_region: bool) -> str:
        """The zone fallback within a region always; on-demand (when the user allowed it) only
        once the last region's spot zones had no capacity."""
        if last_region and mode in ("on-demand", "any"):
            return "any"
        return "zone"

    def line(self, zone: str, price: float, spot: bool) -> str:
        """Where the start went and why, in one line: 'us-east-1c at $0.1578/h, the cheapest of
        6 zones in us-east-1'."""
        where = ", ".join(sorted(self.prices))
        of = f"{self.zones} zone{'s' if self.zones != 1 else ''} in {where}"
        if self.pinned:
            best = self.best()
            cheaper = f" (the cheapest of {of}: {best[0]} at ${best[1]:.4f}/h)" if best else ""
            return f"{zone} at ${price:.4f}/h: workspace {self.pinned}'s volume is there{cheaper}"
        if not spot:
            return f"{zone} on-demand at ${price:.4f}/h: no spot capacity in any of the {of}"
        if not self.full:
            return f"{zone} at ${price:.4f}/h, the cheapest of {of}"
        return (
            f"{zone} at ${price:.4f}/h, the cheapest of {of} with capacity "
            f"({', '.join(self.full)}: none)"
        )

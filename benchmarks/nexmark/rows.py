"""Output rows shared by the lockgate and Quix Streams apps (no lockgate import: the Quix
apps run in their own venv)."""

from __future__ import annotations

from typing import Any


def q0_row(v: dict[str, Any]) -> dict[str, Any]:
    """``auction, bidder, price, dateTime, extra`` of a bid."""
    b = v["bid"]
    return {
        "auction": b["auction"],
        "bidder": b["bidder"],
        "price": b["price"],
        "dateTime": b["dateTime"],
        "extra": b["extra"],
    }


def euro(cents: int) -> str:
    """``0.908 * price`` exactly, as a decimal with 3 places (Flink's DECIMAL(23, 3))."""
    milli = cents * 908
    sign = "-" if milli < 0 else ""
    milli = abs(milli)
    return f"{sign}{milli // 1000}.{milli % 1000:03d}"


def q1_row(v: dict[str, Any]) -> dict[str, Any]:
    """A bid with its price in euros."""
    row = q0_row(v)
    row["price"] = euro(row["price"])
    return row

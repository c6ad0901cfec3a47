"""Orders looked up against a versioned global table of customers, as of each order's time.

Input ``LOCKGATE_INPUT_TOPIC``: key = order id (not the customer: no co-partitioning),
value ``{"customer": <str>, "seq": <int>}``, record timestamp = the order's time. Global
table ``LOCKGATE_CUSTOMERS_TOPIC`` (versioned, 60 s of history per customer): key =
customer id, value ``{"tier": <str>}`` or a tombstone, record timestamp = when it became
true. For every order, one output on ``LOCKGATE_OUTPUT_TOPIC``: ``{"seq", "as_of": the
customer's tier as of the order's time (null: none or deleted then), "latest": the tier
of the customer's newest version}``.
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "orders")
CUSTOMERS = os.environ.get("LOCKGATE_CUSTOMERS_TOPIC", "customers")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "order-tiers")

app = App("customer-tiers", env=["LOCKGATE_CUSTOMERS_TOPIC"])
customers = app.global_table(CUSTOMERS, retention_ms=60_000)


@app.process(INPUT, outputs=[OUTPUT])
def tier(order: str, value: dict[str, Any], ctx: Context) -> None:
    then = customers.get_as_of(value["customer"], ctx.timestamp)
    now = customers.get(value["customer"])
    ctx.emit(
        OUTPUT,
        order,
        {
            "seq": value["seq"],
            "as_of": None if then is None else then["tier"],
            "latest": None if now is None else now["tier"],
        },
    )

"""Enrich every order with its customer's record as of the order's time (a left as-of join).

Inputs, co-partitioned (same partition count, both keyed by customer id as UTF-8 string, record
timestamps are event times):

* ``LOCKGATE_ORDERS_TOPIC`` (default ``orders``): value ``{"order_id": <str>, "amount": <int>}``;
* ``LOCKGATE_CUSTOMERS_TOPIC`` (default ``customers``): value any JSON object, or null (a
  tombstone: the customer is deleted).

For every order exactly one record on ``LOCKGATE_OUTPUT_TOPIC`` (default ``enriched-orders``),
key = the customer id, value ``{"order_id", "amount", "customer"}`` where ``customer`` is the
customer's latest value with a timestamp at or before the order's, or null when there is none or
it was deleted.

Run: ``LOCKGATE_BOOTSTRAP_SERVERS=127.0.0.1:9092 lockgate run examples.enrich_orders:app``
"""

import os
from typing import Any

from processors import App

ORDERS = os.environ.get("LOCKGATE_ORDERS_TOPIC", "orders")
CUSTOMERS = os.environ.get("LOCKGATE_CUSTOMERS_TOPIC", "customers")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "enriched-orders")

app = App("enrich-orders", env=["LOCKGATE_ORDERS_TOPIC", "LOCKGATE_CUSTOMERS_TOPIC"])

#: The latest customer record per id, versioned by record timestamp (as-of lookups).
customers = app.table(CUSTOMERS)


def enrich(order: dict[str, Any], customer: Any) -> dict[str, Any]:
    """The output record of one order."""
    return {"order_id": order["order_id"], "amount": order["amount"], "customer": customer}


app.stream(ORDERS).join_asof(customers, how="left", combine=enrich).to(OUTPUT)

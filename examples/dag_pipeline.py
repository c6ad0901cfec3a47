"""Order and payment totals per customer, joined into a balance: a DAG of three apps.

``orders_app`` (app name ``order-totals``) reads ``LOCKGATE_ORDERS_TOPIC`` (default
``orders``): key = customer id (UTF-8), value ``{"amount": <int>, "seq": <int>}``. For every
record it emits exactly one record to the internal topic ``LOCKGATE_ORDER_TOTALS_TOPIC``
(default ``order-totals``), key = customer id, value ``{"total": <sum of that customer's
amounts so far>, "count": <orders so far>}``.

``payments_app`` (app name ``payment-totals``) does the same from
``LOCKGATE_PAYMENTS_TOPIC`` (default ``payments``) to the internal topic
``LOCKGATE_PAYMENT_TOTALS_TOPIC`` (default ``payment-totals``).

``balance_app`` (app name ``balances``) reads both internal topics (co-partitioned by
customer id) and for every record it reads emits exactly one record to
``LOCKGATE_OUTPUT_TOPIC`` (default ``balances``), key = customer id, value
``{"orders": <order count seen>, "payments": <payment count seen>, "balance": <order total
seen - payment total seen>}``.

``balance_app`` aligns on the barriers of both upstream apps (every writer of both inputs),
so a checkpoint of the whole DAG is one consistent cut: ``lockgate savepoint trigger
--pipeline order-totals`` covers all three apps. ``LOCKGATE_ALIGNMENT`` (``aligned`` or
``none``) picks how ``balance_app`` checkpoints, as in ``examples/click_pipeline.py``.
Each app runs in its own process(es); ``LOCKGATE_APP_NAME`` renames any of them::

    export LOCKGATE_BOOTSTRAP_SERVERS=127.0.0.1:9092
    lockgate run examples.dag_pipeline:orders_app
    lockgate run examples.dag_pipeline:payments_app
    lockgate run examples.dag_pipeline:balance_app

The two internal topics must have the same partition count (each upstream app creates its
output with its input's count: give ``orders`` and ``payments`` the same count).
"""

import os
from typing import Any

from processors import App, Context, OutputSpec
from state import ValueState

ORDERS = os.environ.get("LOCKGATE_ORDERS_TOPIC", "orders")
PAYMENTS = os.environ.get("LOCKGATE_PAYMENTS_TOPIC", "payments")
ORDER_TOTALS = os.environ.get("LOCKGATE_ORDER_TOTALS_TOPIC", "order-totals")
PAYMENT_TOTALS = os.environ.get("LOCKGATE_PAYMENT_TOTALS_TOPIC", "payment-totals")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "balances")


def _app(name: str) -> App:
    """An app of the DAG: each accepts every topic variable, so one environment serves all."""
    return App(
        name,
        env=[
            "LOCKGATE_ORDERS_TOPIC",
            "LOCKGATE_PAYMENTS_TOPIC",
            "LOCKGATE_ORDER_TOTALS_TOPIC",
            "LOCKGATE_PAYMENT_TOTALS_TOPIC",
            "LOCKGATE_OUTPUT_TOPIC",
        ],
    )


def _totals_app(name: str, source: str, internal: str) -> App:
    """An app that emits each customer's running total and count of ``source`` amounts."""
    app = _app(name)
    totals: ValueState[list[int]] = app.value_state("totals")

    @app.process(source, outputs=[OutputSpec(internal, internal=True)])
    def add(customer: str, event: dict[str, Any], ctx: Context) -> None:
        total, count = totals.value() or [0, 0]
        total += int(event["amount"])
        count += 1
        totals.update([total, count])
        ctx.emit(internal, customer, {"total": total, "count": count})

    return app


orders_app = _totals_app("order-totals", ORDERS, ORDER_TOTALS)
payments_app = _totals_app("payment-totals", PAYMENTS, PAYMENT_TOTALS)

balance_app = _app("balances")
#: Per customer: [orders seen, order total seen, payments seen, payment total seen].
seen: ValueState[list[int]] = balance_app.value_state("seen")


@balance_app.process(ORDER_TOTALS, PAYMENT_TOTALS, outputs=[OUTPUT])
def balance(customer: str, totals: dict[str, Any], ctx: Context) -> None:
    orders, order_total, payments, payment_total = seen.value() or [0, 0, 0, 0]
    if ctx.topic == ORDER_TOTALS:
        orders, order_total = int(totals["count"]), int(totals["total"])
    else:
        payments, payment_total = int(totals["count"]), int(totals["total"])
    seen.update([orders, order_total, payments, payment_total])
    ctx.emit(
        OUTPUT,
        customer,
        {"orders": orders, "payments": payments, "balance": order_total - payment_total},
    )

"""Converts amounts with a global table of exchange rates (the global-table test app).

Input ``LOCKGATE_INPUT_TOPIC``: key = account, value ``{"amount": <int>, "currency": <str>,
"seq": <int>}``. Global table ``LOCKGATE_RATES_TOPIC``: key = currency, value ``{"rate":
<int>}``. For every input, one output on ``LOCKGATE_OUTPUT_TOPIC``: ``{"seq", "converted":
amount * rate (null when the currency has no rate), "total": running sum of converted per
account}``.
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "payments")
RATES = os.environ.get("LOCKGATE_RATES_TOPIC", "rates")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "converted")

app = App("rates", env=["LOCKGATE_RATES_TOPIC"])
rates = app.global_table(RATES)
totals = app.value_state("totals")


@app.process(INPUT, outputs=[OUTPUT])
def convert(key: str, value: dict[str, Any], ctx: Context) -> None:
    rate = rates.get(value["currency"])
    converted = None if rate is None else value["amount"] * rate["rate"]
    total = (totals.value() or 0) + (converted or 0)
    totals.update(total)
    ctx.emit(OUTPUT, key, {"seq": value["seq"], "converted": converted, "total": total})

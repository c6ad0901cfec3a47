"""Running sum per key: the reference exactly-once example.

Input (``LOCKGATE_INPUT_TOPIC``, default ``numbers``): key = UTF-8 string, value =
``{"v": <int>, "seq": <int>}``. For every input record exactly one output record on
``LOCKGATE_OUTPUT_TOPIC`` (default ``sums``), same key, value
``{"sum": <running sum of v for the key>, "count": <records seen>, "seq": <input seq>}``.

Run: ``LOCKGATE_BOOTSTRAP_SERVERS=127.0.0.1:9092 lockgate run examples.running_sum:app``
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "numbers")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "sums")

app = App("running-sum")
totals = app.value_state("totals")


@app.process(INPUT, outputs=[OUTPUT])
def running_sum(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = totals.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    totals.update(total)
    ctx.emit(OUTPUT, key, {"sum": total[0], "count": total[1], "seq": value["seq"]})

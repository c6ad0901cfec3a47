"""running_sum with slow user code (``SLOW_APP_SLEEP_MS`` per record, default 5 ms).

Used to prove that epochs are cut short inside the transaction timeout, and that a
record slower than the whole budget is handled by policy instead of a crash loop
(``SLOW_APP_STALL_SEQ``: the record with that ``seq`` sleeps ``SLOW_APP_STALL_MS``).
"""

import os
import time
from typing import Any

from processors import App, Context

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]
SLEEP = float(os.environ.get("SLOW_APP_SLEEP_MS", "5")) / 1000
STALL_SEQ = int(os.environ.get("SLOW_APP_STALL_SEQ", "-1"))
STALL = float(os.environ.get("SLOW_APP_STALL_MS", "0")) / 1000

app = App("slow")
totals = app.value_state("totals")


@app.process(INPUT, outputs=[OUTPUT])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    time.sleep(STALL if value["seq"] == STALL_SEQ else SLEEP)
    total = totals.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    totals.update(total)
    ctx.emit(OUTPUT, key, {"sum": total[0], "count": total[1], "seq": value["seq"]})

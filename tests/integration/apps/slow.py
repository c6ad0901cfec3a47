"""running_sum with slow user code (5 ms per record), to prove epochs are cut short."""

import os
import time
from typing import Any

from processors import App, Context

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]

app = App("slow")
totals = app.value_state("totals")


@app.process(INPUT, outputs=[OUTPUT])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    time.sleep(0.005)
    total = totals.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    totals.update(total)
    ctx.emit(OUTPUT, key, {"sum": total[0], "count": total[1], "seq": value["seq"]})

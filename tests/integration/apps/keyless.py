"""running_sum that emits its outputs without a key (``KEYLESS_SEQ``: only that record;
-1: every record). A compacted output topic refuses keyless records."""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]
KEYLESS_SEQ = int(os.environ.get("KEYLESS_SEQ", "-1"))

app = App("keyless")
totals = app.value_state("totals")


@app.process(INPUT, outputs=[OUTPUT])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = totals.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    totals.update(total)
    out_key = None if KEYLESS_SEQ in (-1, value["seq"]) else key
    ctx.emit(OUTPUT, out_key, {"sum": total[0], "count": total[1], "seq": value["seq"]})

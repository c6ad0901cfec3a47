"""A running sum whose user code fails on v < 0 *after* touching state and emitting.

Used to prove that a failing record's partial effects never commit.
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]

app = App("faulty")
totals = app.value_state("totals")


@app.process(INPUT, outputs=[OUTPUT])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = totals.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    totals.update(total)
    ctx.emit(OUTPUT, key, {"sum": total[0], "count": total[1], "seq": value["seq"]})
    if value["v"] < 0:
        raise ValueError(f"negative value {value['v']}")

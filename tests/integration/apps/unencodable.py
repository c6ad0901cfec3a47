"""A running sum that stores a ``set`` (not JSON-encodable) for ``seq == BAD_SEQ``.

The codec fails only when the epoch commits; the runtime must find the record that
wrote the value and dead-letter it, instead of failing every commit forever.
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]
BAD_SEQ = int(os.environ.get("UNENCODABLE_SEQ", "60"))

app = App("unencodable")
totals = app.value_state("totals")
notes = app.value_state("notes")


@app.process(INPUT, outputs=[OUTPUT])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = totals.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    totals.update(total)
    if value["seq"] == BAD_SEQ:
        notes.update({"seen": {1, 2}})  # a set: JSON cannot encode it
    ctx.emit(OUTPUT, key, {"sum": total[0], "count": total[1], "seq": value["seq"]})

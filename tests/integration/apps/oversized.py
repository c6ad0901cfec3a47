"""A running sum that emits one output too large for Kafka (2 MB) for ``seq == BIG_SEQ``.

``OVERSIZED_SWALLOW=1`` makes user code catch the emit error (the record must still
be dead-lettered: its output can never be written).
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]
BIG_SEQ = int(os.environ.get("OVERSIZED_SEQ", "50"))
SWALLOW = os.environ.get("OVERSIZED_SWALLOW") == "1"

app = App("oversized")
totals = app.value_state("totals")


@app.process(INPUT, outputs=[OUTPUT])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = totals.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    totals.update(total)
    out: dict[str, Any] = {"sum": total[0], "count": total[1], "seq": value["seq"]}
    if value["seq"] == BIG_SEQ:
        out["blob"] = os.urandom(1_000_000).hex()  # 2 MB, incompressible
    try:
        ctx.emit(OUTPUT, key, out)
    except Exception:
        if not SWALLOW:
            raise

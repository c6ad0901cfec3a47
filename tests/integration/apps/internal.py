"""running_sum whose output is declared ``internal=True`` (read by another lockgate app).

Barrier records are written to every partition of the output at every epoch end.
"""

import os
from typing import Any

from processors import App, Context, OutputSpec

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]

app = App("internal")
totals = app.value_state("totals")


@app.process(INPUT, outputs=[OutputSpec(OUTPUT, internal=True)])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = totals.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    totals.update(total)
    ctx.emit(OUTPUT, key, {"sum": total[0], "count": total[1], "seq": value["seq"]})

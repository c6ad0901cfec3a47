"""An app for backfill task tests: a running sum whose records can misbehave on purpose.

Input ``LOCKGATE_TEST_BF_IN``, output ``LOCKGATE_TEST_BF_OUT``. Value fields: ``v`` (added
to the key's total), ``pad`` (the output carries that many bytes), ``nokey`` (the output has
no key), ``bad`` (the state becomes a set, which JSON cannot encode).
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ.get("LOCKGATE_TEST_BF_IN", "bf-in")
OUTPUT = os.environ.get("LOCKGATE_TEST_BF_OUT", "bf-out")

app = App("backfill-app")
totals = app.value_state("totals")


@app.process(INPUT, outputs=[OUTPUT])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = (totals.value() or 0) + value.get("v", 1)
    totals.update({1, 2} if value.get("bad") else total)
    out = {"sum": total, "i": value.get("i"), "pad": "x" * value.get("pad", 0)}
    ctx.emit(OUTPUT, None if value.get("nokey") else key, out)

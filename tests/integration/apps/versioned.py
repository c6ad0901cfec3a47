"""One app in three versions, for restoring a savepoint after a code change.

``v1``: running sum in store ``totals`` plus a per-key record count in store ``seen``.
``v2``: keeps ``totals`` (same kind and codec), drops ``seen``, adds ``last_seq``.
``v3``: declares ``totals`` as a list store: incompatible with the savepoint.
All three emit ``{"sum", "count", "seq"}`` like examples/running_sum.py.
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]

v1 = App("versioned")
_totals1 = v1.value_state("totals")
_seen1 = v1.value_state("seen")


@v1.process(INPUT, outputs=[OUTPUT])
def handle_v1(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = _totals1.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    _totals1.update(total)
    _seen1.update((_seen1.value() or 0) + 1)
    ctx.emit(OUTPUT, key, {"sum": total[0], "count": total[1], "seq": value["seq"]})


v2 = App("versioned")
_totals2 = v2.value_state("totals")
_last2 = v2.value_state("last_seq")


@v2.process(INPUT, outputs=[OUTPUT])
def handle_v2(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = _totals2.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    _totals2.update(total)
    _last2.update(value["seq"])
    ctx.emit(OUTPUT, key, {"sum": total[0], "count": total[1], "seq": value["seq"]})


v3 = App("versioned")
_totals3 = v3.list_state("totals")


@v3.process(INPUT, outputs=[OUTPUT])
def handle_v3(key: str, value: dict[str, Any], ctx: Context) -> None:
    _totals3.add(value["v"])
    ctx.emit(OUTPUT, key, {"sum": sum(_totals3.get()), "count": 0, "seq": value["seq"]})

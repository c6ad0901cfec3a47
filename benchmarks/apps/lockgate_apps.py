"""The workloads as lockgate apps (``lockgate run benchmarks.apps.lockgate_apps:<name>``).

Topics come from BENCH_INPUT / BENCH_OUTPUT; the guarantee, checkpoint interval and
state dir from the usual LOCKGATE_* variables.

lockgate has no event-time windows yet, so ``window`` implements a tumbling count
per key with keyed state in the handler: window = record timestamp // size; the count
of the (key, window) lives in a value_state and is emitted when the key's first record
of a later window arrives (records of an older window are late and dropped).
"""

from __future__ import annotations

import os
from typing import Any

from processors import App, Context

INPUT = os.environ.get("BENCH_INPUT", "bench-in")
OUTPUT = os.environ.get("BENCH_OUTPUT", "bench-out")
WINDOW_MS = int(os.environ.get("BENCH_WINDOW_MS", "10000"))

passthrough = App("bench-passthrough")
passthrough.stream(INPUT).to(OUTPUT)

running_sum = App("bench-sum")
totals = running_sum.value_state("totals")


@running_sum.process(INPUT, outputs=[OUTPUT])
def _sum(key: str, value: dict[str, Any], ctx: Context) -> None:
    t = totals.value() or [0, 0]
    t = [t[0] + value["v"], t[1] + 1]
    totals.update(t)
    ctx.emit(OUTPUT, key, {"sum": t[0], "count": t[1], "seq": value["seq"]})


window = App("bench-window")
open_window = window.value_state("window")


@window.process(INPUT, outputs=[OUTPUT])
def _window(key: str, value: dict[str, Any], ctx: Context) -> None:
    w = ctx.timestamp // WINDOW_MS
    cur = open_window.value()
    if cur is None:
        open_window.update([w, 1])
    elif cur[0] == w:
        open_window.update([w, cur[1] + 1])
    elif w > cur[0]:
        ctx.emit(OUTPUT, key, {"start": cur[0] * WINDOW_MS, "count": cur[1]})
        open_window.update([w, 1])

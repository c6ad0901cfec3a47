"""The workloads as lockgate apps (``lockgate run benchmarks.apps.lockgate_apps:<name>``).

Topics come from BENCH_INPUT / BENCH_OUTPUT; the guarantee, checkpoint interval and
state dir from the usual LOCKGATE_* variables.

``window`` is lockgate's window operator: a tumbling count per key in event time (the
record timestamp, which is what the window input sets) with bounded out-of-orderness
``BENCH_WINDOW_DELAY_MS`` (what the input generator guarantees): a key group's
watermark is the newest timestamp seen on its partition minus the delay minus 1, and a
window fires once (``{"start": ms, "count": n}``) when it reaches ``end - 1``. Allowed
lateness 0 and no late topic: the input has no late records, and a dropped one would
show as a wrong count in the harness's check.
"""

from __future__ import annotations

import os
from typing import Any

from processors import App, Context, Tumbling, Watermarks, WindowResult

INPUT = os.environ.get("BENCH_INPUT", "bench-in")
OUTPUT = os.environ.get("BENCH_OUTPUT", "bench-out")
WINDOW_MS = int(os.environ.get("BENCH_WINDOW_MS", "10000"))
WINDOW_DELAY_MS = int(os.environ.get("BENCH_WINDOW_DELAY_MS", "0"))

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


def window_output(window: WindowResult[int]) -> dict[str, int]:
    """The output value of a fired window (what the harness checks)."""
    return {"start": window.start, "count": window.value}


def window_app(name: str, source: str, sink: str, window_ms: int, delay_ms: int) -> App:
    """The window workload: per-key counts in tumbling event-time windows."""
    app = App(name)
    (
        app.stream(source, watermarks=Watermarks.bounded(delay_ms))
        .window(Tumbling(window_ms))
        .count()
        .map(window_output)
        .to(sink)
    )
    return app


window = window_app("bench-window", INPUT, OUTPUT, WINDOW_MS, WINDOW_DELAY_MS)

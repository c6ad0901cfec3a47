"""Keyed totals and event-time window counts: the app of the bounded-run savepoint tests.

Input ``LOCKGATE_INPUT_TOPIC``: key = string, value ``{"ts": <ms>, "v": <int>, "seq":
<int>}``; event time ``ts``, watermarks with no out-of-orderness allowed. The value store
``totals`` holds ``[sum of v, count]`` per key (updated before the window sees the
record); tumbling windows of ``LOCKGATE_WINDOW_MS`` count the records per key and emit
``{"start", "end", "count"}`` to ``LOCKGATE_OUTPUT_TOPIC`` when they fire. The last window
of each key fires only from the final watermark of a drained bounded run.
``LOCKGATE_TEST_BSP_SLEEP_MS`` (default 0) makes each record take that long, so that
several instances of one bounded run all own key groups before the bound is reached.
"""

import os
import time
from typing import Any

from processors import App, Tumbling, Watermarks, WindowResult

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "events")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "window-counts")
WINDOW_MS = int(os.environ.get("LOCKGATE_WINDOW_MS", "1000"))
SLEEP_S = int(os.environ.get("LOCKGATE_TEST_BSP_SLEEP_MS", "0")) / 1000

app = App("bounded-totals", env=["LOCKGATE_WINDOW_MS"])
totals = app.value_state("totals")


def track(value: dict[str, Any]) -> dict[str, Any]:
    """Add the record to its key's total (keyed state), pass it on to the window."""
    if SLEEP_S:
        time.sleep(SLEEP_S)
    total = totals.value() or [0, 0]
    totals.update([total[0] + int(value["v"]), total[1] + 1])
    return value


def as_output(window: WindowResult[int]) -> dict[str, int]:
    """The output value of a fired window."""
    return {"start": window.start, "end": window.end, "count": window.value}


(
    app.stream(INPUT, timestamp=lambda v: int(v["ts"]), watermarks=Watermarks.bounded(0))
    .map(track)
    .window(Tumbling(WINDOW_MS))
    .count()
    .map(as_output)
    .to(OUTPUT)
)

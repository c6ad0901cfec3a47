"""Tumbling windows whose results set event-time timers (the window chaos test app).

Input ``LOCKGATE_INPUT_TOPIC``: key = string, value ``{"ts": <ms>, "seq": <int>}``.
Tumbling windows of 1000 ms, bounded out-of-orderness 200 ms, late records to
``<output>.late``. Each fired window emits ``{"start", "end", "count"}`` to
``LOCKGATE_OUTPUT_TOPIC`` and sets an event-time timer of its key at ``end - 1 + 1000``
(named after the window); the timer emits ``{"t": <time>, "name": <name>}`` to
``LOCKGATE_TIMERS_TOPIC``.
"""

import os
from typing import Any

from processors import App, Tumbling, Watermarks, WindowResult

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "events")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "window-results")
TIMERS = os.environ.get("LOCKGATE_TIMERS_TOPIC", "window-timers")
WINDOW_MS = 1000
DELAY_MS = 200
TIMER_AFTER_MS = 1000

app = App("window-timers", env=["LOCKGATE_TIMERS_TOPIC"])
app.output(TIMERS)


def result(key: Any, value: WindowResult[int], ctx: Any) -> None:
    """A fired window: emit it, and remind its key a second (event time) after its end."""
    ctx.timers.set_event_time(value.end - 1 + TIMER_AFTER_MS, f"after-{value.start}")
    ctx.emit(OUTPUT, key, {"start": value.start, "end": value.end, "count": value.value})


@app.on_timer
def remind(key: str, ctx: Any) -> None:
    """A reminder fired: emit its time and name."""
    ctx.emit(TIMERS, key, {"t": ctx.timestamp, "name": ctx.name})


app.output(OUTPUT)
(
    app.stream(INPUT, timestamp=lambda v: int(v["ts"]), watermarks=Watermarks.bounded(DELAY_MS))
    .window(Tumbling(WINDOW_MS), late_topic=f"{OUTPUT}.late")
    .count()
    .process(result)
)

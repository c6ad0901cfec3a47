"""Timers and unencodable state (the timer-poison test app).

Input ``LOCKGATE_INPUT_TOPIC``: key = string, value ``{"seq": <int>, "bad": <bool>}``,
event time = record timestamp (monotonous). A record with ``bad`` stores a set (JSON
cannot encode it: the record is dead-lettered); every other record sets an event-time
timer of its key 10 ms later. The timer stores the fired time and emits ``{"t": <time>}``
to ``LOCKGATE_OUTPUT_TOPIC`` — except for key ``poison``, whose timer stores a set, and key
``raise``, whose timer stores a set and then raises.
"""

import os
from typing import Any

from processors import App, Context, Watermarks
from state import ValueState

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "jobs")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "fired")

app = App("bad-timer-state")
last: ValueState[Any] = app.value_state("last")


@app.process(INPUT, outputs=[OUTPUT], watermarks=Watermarks.monotonous())
def schedule(key: str, value: dict[str, Any], ctx: Context) -> None:
    """Set a timer 10 ms after the record (or store something unencodable)."""
    if value.get("bad"):
        last.update({value["seq"]})
        return
    ctx.timers.set_event_time(ctx.event_time + 10)


@app.on_timer
def fired(key: str, ctx: Any) -> None:
    """Store and emit the fired time (a set for ``poison`` and ``raise``)."""
    if key != "mixed":  # mixed's timers write nothing: a bad value there is the record's
        last.update({ctx.timestamp} if key in ("poison", "raise") else ctx.timestamp)
    if key == "raise":
        raise RuntimeError("after an unencodable write")
    ctx.emit(OUTPUT, key, {"t": ctx.timestamp})

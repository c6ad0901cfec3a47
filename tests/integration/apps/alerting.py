"""An event-time pass-through used to drive an instance into each alert's condition.

Reads ``LOCKGATE_INPUT_TOPIC`` (values ``{"ts": <ms>, "seq": <int>}``, event time ``ts``,
100 ms bounded out-of-orderness, never idle) and writes each value to
``LOCKGATE_OUTPUT_TOPIC``. A value with ``"sleep_ms"`` keeps user code busy that long (a
stuck handler: no checkpoint meanwhile); a value that is not JSON is dead-lettered.
"""

import os
import time
from typing import Any

from processors import App, Watermarks

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]

app = App("alerting")


def passthrough(value: dict[str, Any]) -> dict[str, Any]:
    """The value as it is, after sleeping ``sleep_ms`` if it asks to."""
    if value.get("sleep_ms"):
        time.sleep(value["sleep_ms"] / 1000)
    return value


app.stream(INPUT, timestamp=lambda v: int(v["ts"]), watermarks=Watermarks.bounded(100)).map(
    passthrough
).to(OUTPUT)

"""Per-key counts in tumbling event-time windows, with late records set aside.

The contract (independent checkers drive it):

- app name ``window-count``;
- input ``LOCKGATE_INPUT_TOPIC`` (default ``events``): key = UTF-8 string, value =
  ``{"ts": <epoch ms>}`` (the event time);
- tumbling windows of ``LOCKGATE_WINDOW_MS`` (default 60000) ms starting at multiples
  of it; watermarks with bounded out-of-orderness ``LOCKGATE_MAX_DELAY_MS`` (default
  5000): a key group's watermark is the newest ``ts`` seen on its partition minus the
  delay minus 1, and window ``[start, end)`` fires once it reaches ``end - 1``;
  allowed lateness 0;
- when a window fires, exactly one record on ``LOCKGATE_OUTPUT_TOPIC`` (default
  ``window-counts``): key = the input key, value ``{"start": <ms>, "end": <ms>,
  "count": <int>}``;
- every record whose window has already fired goes, unchanged, to
  ``<app name>.late`` (``LOCKGATE_APP_NAME``, default ``window-count``: one late topic per
  deployment; headers ``lockgate-late-window``, ``lockgate-late-watermark``).

Run: ``LOCKGATE_BOOTSTRAP_SERVERS=127.0.0.1:9092 lockgate run examples.window_count:app``
"""

import os
from typing import Any

from processors import App, Tumbling, Watermarks, WindowResult

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "events")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "window-counts")
WINDOW_MS = int(os.environ.get("LOCKGATE_WINDOW_MS", "60000"))
MAX_DELAY_MS = int(os.environ.get("LOCKGATE_MAX_DELAY_MS", "5000"))

app = App("window-count", env=["LOCKGATE_WINDOW_MS", "LOCKGATE_MAX_DELAY_MS"])


def event_time(value: dict[str, Any]) -> int:
    """The event time of a record: its ``ts`` field."""
    return int(value["ts"])


def as_output(window: WindowResult[int]) -> dict[str, int]:
    """The output value of a fired window."""
    return {"start": window.start, "end": window.end, "count": window.value}


(
    app.stream(INPUT, timestamp=event_time, watermarks=Watermarks.bounded(MAX_DELAY_MS))
    .window(Tumbling(WINDOW_MS), late_topic=True)
    .count()
    .map(as_output)
    .to(OUTPUT)
)
